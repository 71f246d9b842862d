"""Held-out perplexity of our bundles and of llama.cpp's GGUF quantizations of the same checkpoint, by one
protocol: llama-perplexity's.

    python scripts/ppl_vs_llamacpp.py --llama-cpp-bin LLAMA/build/bin --text models/eval/python_docstrings.txt \\
        --bundle fp32=/tmp/qt/b00 --bundle "int4 RTN b32=/tmp/qt/b02" \\
        --gguf F32=model-F32.gguf --gguf Q4_0=model-Q4_0.gguf --gguf Q4_K_M=model-Q4_K_M.gguf [--chunks 8]

llama-perplexity's default: the text cut into chunks of --context tokens from its start, each chunk run
alone, and only the second half of each scored (tokens context/2 + 1 .. context - 1, 255 a chunk of 512),
no BOS where the GGUF says the model adds none (SmolLM2), else BOS in place of each chunk's first token
(Gemma). Our side scores exactly those tokens, each
chunk through one prefill of the bundle with every row's logits (the ring holds the whole chunk). The
F32 GGUF's figure against our fp32 bundle's checks that the two sides tokenize and score alike.

--decode-rounds N adds our bundles' decode speed, measured side by side: every bundle loaded in one
process, N rounds each timing 128 teacher-forced decode steps after a 16-token prefill of the text, the
bundles in alternating order; the median tokens/s and its ratio to the first bundle's.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

# A sibling script, importable because Python puts this script's folder first on the path.
from heldout_eval import decode_rate

_FINAL = re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)")


def labelled(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not Path(path).exists():
        raise argparse.ArgumentTypeError(f"expected NAME=PATH with PATH existing, got {text!r}")
    return name, Path(path)


def llama_ppl(bin_dir: Path, gguf: Path, text: Path, context: int, chunks: int, threads: int) -> float:
    cmd = [str(bin_dir / "llama-perplexity"), "-m", str(gguf), "-f", str(text), "-c", str(context)]
    out = subprocess.run([*cmd, "--chunks", str(chunks), "-t", str(threads), "-b", str(context)],
                         capture_output=True, text=True, timeout=3600)  # fmt: skip
    m = _FINAL.search(out.stdout + out.stderr)
    if out.returncode != 0 or m is None:
        raise SystemExit(f"llama-perplexity failed on {gguf} (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return float(m.group(1))


def our_ppl(bundle: Path, text: str, context: int, chunks: int, threads: int) -> tuple[float, int]:
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.tokenizer import Tokenizer

    engine = load(bundle, LoadOptions(sinks=4, window=context, threads=threads))
    tok = Tokenizer(engine.bundle.tokenizer_file, engine.manifest.tokenizer)
    ids = tok.encode(text)
    # llama-perplexity tokenizes with the model's BOS and then puts BOS first in every chunk, in place of the
    # chunk's own first token (Gemma: scoring chunks without it took the perplexity from 13 to 20)
    bos = engine.manifest.tokenizer.bos_token_id if engine.manifest.tokenizer.adds_bos else None
    if len(ids) < chunks * context:
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than {chunks} chunks of {context}")
    first, nll, count = context // 2, 0.0, 0
    for c in range(chunks):
        window = ids[c * context : (c + 1) * context]
        if bos is not None:
            window = [bos, *window[1:]]
        engine.reset()
        logits = engine.prefill(window, all_logits=True).astype(np.float64)  # [context, V]
        rows = logits[first : context - 1]
        rows -= rows.max(axis=1, keepdims=True)
        logp = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
        targets = np.asarray(window[first + 1 : context])
        nll -= float(logp[np.arange(len(targets)), targets].sum())
        count += len(targets)
    return float(np.exp(nll / count)), count


def decode_speeds(bundles: list[tuple[str, Path]], text: str, rounds: int, threads: int) -> dict[str, float]:
    """Median teacher-forced decode tokens/s of each bundle, all loaded at once, rounds interleaved."""
    import statistics

    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.tokenizer import Tokenizer

    engines = {name: load(path, LoadOptions(threads=threads)) for name, path in bundles}
    first = next(iter(engines.values()))
    ids = np.asarray(Tokenizer(first.bundle.tokenizer_file, first.manifest.tokenizer).encode(text)[: 16 + 128])
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(rounds):
        for name in list(engines) if r % 2 == 0 else list(engines)[::-1]:
            rates[name].append(decode_rate(engines[name], ids[:16], ids[16:]))
    return {name: statistics.median(v) for name, v in rates.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp-bin", type=Path, help="a llama.cpp build's bin/ (llama-perplexity), for --gguf")
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--bundle", type=labelled, action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--gguf", type=labelled, action="append", default=[], metavar="NAME=FILE")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-rounds", type=int, default=0, help="also time our bundles' decode, side by side")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.gguf and a.llama_cpp_bin is None:
        ap.error("--gguf needs --llama-cpp-bin")
    from edge_runtime.bench.environment import cpu_model

    text = a.text.read_text(encoding="utf-8")
    rows = []
    for name, bundle in a.bundle:
        ppl, n = our_ppl(bundle, text, a.context, a.chunks, a.threads)
        size = sum(f.stat().st_size for f in bundle.iterdir() if f.name.startswith("model.onnx"))
        rows.append({"side": "ours", "name": name, "ppl": ppl, "scored": n, "mb": size / 1e6})
        print(f"ours      {name:24s} ppl {ppl:9.3f}  ({n} tokens scored, {size / 1e6:.1f} MB)", flush=True)
    for name, gguf in a.gguf:
        ppl = llama_ppl(a.llama_cpp_bin, gguf, a.text, a.context, a.chunks, a.threads)
        rows.append({"side": "llama.cpp", "name": name, "ppl": ppl, "mb": gguf.stat().st_size / 1e6})
        print(f"llama.cpp {name:24s} ppl {ppl:9.3f}  ({gguf.stat().st_size / 1e6:.1f} MB)", flush=True)
    if a.decode_rounds > 0 and a.bundle:
        speeds = decode_speeds(a.bundle, text, a.decode_rounds, a.threads)
        base = next(iter(speeds.values()))
        for row in rows:
            if row["side"] == "ours":
                row["decode_tps"] = speeds[row["name"]]
        for name, tps in speeds.items():
            print(f"decode    {name:24s} {tps:8.1f} tok/s  {tps / base:.2f}x  ({a.decode_rounds} rounds)", flush=True)
    if a.json:
        meta = {"cpu": cpu_model(), "text": str(a.text), "context": a.context, "chunks": a.chunks}
        a.json.write_text(json.dumps({"env": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
