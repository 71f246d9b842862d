"""Greedy tokens of our bundle against llama.cpp's `llama-completion` on the same GGUF: where they part, and the
two tokens' logit gap on our side there (a near tie is where int8 activation rounding can go either way).

    python scripts/greedy_vs_llamacpp.py --llama-cpp-bin LLAMA/build/bin --tokens 48 \\
        --pair smollm2-Q4_0=BUNDLE:FILE.gguf [--pair ...] [--prompt TEXT ...]

Both sides decode raw prompt text (no chat template) greedily: llama-completion with --temp 0 (top-k 1), single
sequence, no warm-up, 2 threads; ours with edge-runtime's greedy decode, to the model's end-of-sequence token.
llama.cpp's reply text is tokenized back with the bundle's tokenizer (prompt + reply, less the prompt's own ids) to
compare ids; where it ended the reply ("[end of text]" in its output) the comparison counts that as its EOS. Its last
token, where the reply was cut at --tokens, may tokenize back merged with what it cut off: a parting there is
reported as such, not as a difference.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import numpy as np

from edge_runtime.engine import LoadOptions, load
from edge_runtime.tokenizer import Tokenizer

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]


def pair(text: str) -> tuple[str, Path, Path]:
    name, sep, rest = text.partition("=")
    bundle, sep2, gguf = rest.partition(":")
    if not (sep and sep2 and Path(bundle).is_dir() and Path(gguf).is_file()):
        raise argparse.ArgumentTypeError(f"expected NAME=BUNDLE:FILE.gguf, got {text!r}")
    return name, Path(bundle), Path(gguf)


def theirs(bin_dir: Path, gguf: Path, prompt: str, n: int) -> str:
    cmd = [str(bin_dir / "llama-completion"), "-m", str(gguf), "-p", prompt, "-n", str(n), "--temp", "0",
           "--top-k", "1", "-t", "2", "--no-warmup", "-no-cnv", "--simple-io", "--no-display-prompt"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"llama-completion failed on {gguf}: {out.stderr[-2000:]}")
    return out.stdout


_END = " [end of text]"  # what llama-completion prints where the model ends its reply


def ours(engine, prompt_ids: list[int], n: int, eos: set[int]) -> tuple[list[int], list[np.ndarray]]:
    engine.reset()
    logits = np.asarray(engine.prefill(prompt_ids), np.float64).reshape(-1)
    ids, rows = [], []
    for _ in range(n):
        rows.append(logits)
        ids.append(int(np.argmax(logits)))
        if ids[-1] in eos:
            break
        logits = np.asarray(engine.decode(ids[-1]), np.float64).reshape(-1)
    return ids, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp-bin", type=Path, required=True)
    ap.add_argument("--pair", type=pair, action="append", required=True, metavar="NAME=BUNDLE:FILE.gguf")
    ap.add_argument("--prompt", action="append", help=f"raw prompt text [{PROMPTS}]")
    ap.add_argument("--tokens", type=int, default=48)
    a = ap.parse_args()
    for name, bundle, gguf in a.pair:
        engine = load(bundle, LoadOptions(threads=2))
        tok = Tokenizer(engine.bundle.tokenizer_file, engine.manifest.tokenizer)
        eos = set(engine.manifest.tokenizer.eos_token_ids)
        for prompt in a.prompt or PROMPTS:
            prompt_ids = tok.encode(prompt)
            mine, rows = ours(engine, prompt_ids, a.tokens, eos)
            text = theirs(a.llama_cpp_bin, gguf, prompt, a.tokens)
            ended = _END in text
            text = text.split(_END)[0]
            back = tok.encode(prompt + text)
            if back[: len(prompt_ids)] != prompt_ids:  # the reply merged into the prompt's last token
                print(f"{name} {prompt!r}: llama.cpp's reply does not tokenize after the prompt; skipped")
                continue
            other = back[len(prompt_ids) :][: a.tokens]
            if ended and mine and mine[-1] in eos:
                other = [*other, mine[-1]]  # llama.cpp's EOS, as ours
            both = min(len(mine), len(other))
            same = next((i for i, (x, y) in enumerate(zip(mine, other, strict=False)) if x != y), both)
            line = f"{name} {prompt!r}: {same} of {both} greedy tokens equal"
            if same < both and same == len(other) - 1 and not ended:
                line += f"; the last, cut at {a.tokens} tokens, tokenizes back merged with what it cut off"
            elif same < both:
                row = rows[same]
                gap = row[mine[same]] - row[other[same]]
                line += (f"; parted at token {same}: ours {tok.decode([mine[same]])!r}, llama.cpp "
                         f"{tok.decode([other[same]])!r} (our logit gap {gap:.3f})")  # fmt: skip
            print(line)


if __name__ == "__main__":
    main()
