"""llama.cpp's n-gram speculative decoding (`llama-lookup`) against its plain greedy decoding
(`llama-completion`), on a prompt text, for scripts/bench_speculative.py's side-by-side table.

Both are fresh processes on the same GGUF, greedy (--temp 0), EOS allowed as ours is, the prompt text
rendered by the bundle's chat template (parsed with special tokens, as our tokenizer encodes it). Figures
from their own timing lines: llama-lookup's "decoded N tokens in S seconds" (decode after the prompt,
its drafting included) and its acceptance, llama-completion's "eval time" (tokens after the first).

    python scripts/llamacpp_lookup.py --bin LLAMA/build/bin --gguf MODEL.gguf --prompt TEXT [--tokens 160]
                                      [--threads 2] [--k 3 8]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path
from typing import Any

_LOOKUP = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")
_DRAFTED = re.compile(r"n_drafted\s+=\s+(\d+)")
_EVAL = re.compile(r"eval time =\s+([\d.]+) ms /\s+(\d+) runs")


def _run(cmd: list[str], timeout: float) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed (exit {out.returncode}): {out.stderr[-2000:]}")
    return out.stdout + out.stderr


def lookup(bin_dir: Path, gguf: Path, prompt: str, tokens: int, threads: int, k: int) -> dict[str, Any]:
    """llama-lookup with at most `k` drafted tokens a step: decode tok/s and its acceptance."""
    cmd = [str(bin_dir / "llama-lookup"), "-m", str(gguf), "-p", prompt, "-n", str(tokens), "-t", str(threads)]
    text = _run([*cmd, "--temp", "0", "--spec-draft-n-max", str(k), "-c", "4096"], 600)
    m = _LOOKUP.search(text)
    if m is None:
        raise RuntimeError(f"no timing line in llama-lookup's output:\n{text[-2000:]}")
    n, seconds = int(m.group(1)), float(m.group(2))
    acc, drafted = _ACCEPT.search(text), _DRAFTED.search(text)
    return {
        "decode_tps": n / seconds,
        "tokens": n,
        "acceptance": float(acc.group(1)) / 100 if acc else None,
        "drafted": int(drafted.group(1)) if drafted else None,
    }


def plain(bin_dir: Path, gguf: Path, prompt: str, tokens: int, threads: int) -> dict[str, Any]:
    """llama-completion, greedy, not interactive: decode tok/s of the tokens after the first."""
    cmd = [str(bin_dir / "llama-completion"), "-m", str(gguf), "-p", prompt, "-n", str(tokens), "-t", str(threads)]
    text = _run([*cmd, "--temp", "0", "-no-cnv", "-c", "4096"], 600)
    m = _EVAL.search(text)
    if m is None:
        raise RuntimeError(f"no eval-time line in llama-completion's output:\n{text[-2000:]}")
    ms, runs = float(m.group(1)), int(m.group(2))
    return {"decode_tps": runs / (ms / 1e3), "tokens": runs + 1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp's build/bin (llama-lookup, llama-completion)")
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--prompt", required=True, help="the prompt text, already rendered by a chat template")
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", type=int, nargs="+", default=[3, 8], help="most drafted tokens a step, one run each")
    a = ap.parse_args(argv)
    results = {"plain": plain(a.bin, a.gguf, a.prompt, a.tokens, a.threads)}
    for k in a.k:
        results[f"lookup k={k}"] = lookup(a.bin, a.gguf, a.prompt, a.tokens, a.threads, k)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
