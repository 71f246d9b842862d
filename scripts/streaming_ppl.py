"""StreamingLLM perplexity of a bundle: a long text fed one token at a time through a small cache.

    python scripts/streaming_ppl.py --bundle B [--text models/eval/python_docstrings.txt] [--tokens 4096]
                                    [--cache 4:252 0:256 dense] [--threads 2] [--dense-by-prefill]
                                    [--save DIR] [--late-from N] [--json OUT]

The text (tokenized as `transformers` does: scripts/heldout_eval.py) is fed through
`engine.prefill` (its first token) and then `engine.decode`, token by token, so from token
sinks + window on, the ring evicts: the cache keeps the first `sinks` tokens and the last `window`
ones, positions re-assigned within the cache as StreamingLLM does. Each cache is given as
SINKS:WINDOW; `dense` is a cache holding every token of the text (sinks 0, window = --tokens, which must
fit the model's trained context, max_position_embeddings). Perplexity over all predicted tokens and over
the tokens from the smallest cache's first eviction on (the StreamingLLM regime, where caches differ).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

# A sibling script, importable because Python puts this script's folder first on the path.
from heldout_eval import DEFAULT_TEXT, log_softmax, machine, read_text, text_ids

from edge_runtime.bundle import open_bundle
from edge_runtime.engine import LoadOptions, load


def stream_nll(bundle: Path, ids: np.ndarray, sinks: int, window: int, threads: int) -> np.ndarray:
    """Negative log-likelihood of ids[1:], each predicted from the tokens before it through the cache."""
    engine = load(bundle, LoadOptions(sinks=sinks, window=window, threads=threads))
    nll = np.empty(len(ids) - 1)
    logits = engine.prefill(ids[:1])
    for i in range(1, len(ids)):
        nll[i - 1] = -log_softmax(logits)[ids[i]]
        if i < len(ids) - 1:
            logits = engine.decode(int(ids[i]))
    return nll


def prefill_nll(bundle: Path, ids: np.ndarray, threads: int) -> np.ndarray:
    """The dense cache's NLL from one prefill of the whole text (chunked by the runtime): the same
    attention over every earlier token as feeding it one at a time (equal to 4e-8 relative on the demo
    model), minutes instead of the better part of an hour on a shared 2-core machine."""
    engine = load(bundle, LoadOptions(sinks=0, window=len(ids), threads=threads))
    nll = []
    for i in range(0, len(ids) - 1, 256):  # pieces: all-token logits of 4k tokens would take GBs
        piece = ids[i : min(i + 256, len(ids) - 1)]
        logits = engine.prefill(piece, all_logits=True)
        nll.append(-log_softmax(logits)[np.arange(len(piece)), ids[i + 1 : i + 1 + len(piece)]])
    return np.concatenate(nll)


def parse_cache(spec: str, tokens: int) -> tuple[str, int, int]:
    if spec == "dense":
        return f"dense (window {tokens})", 0, tokens
    sinks, window = (int(x) for x in spec.split(":"))
    return (f"sinks {sinks} + window {window}" if sinks else f"window {window} only"), sinks, window


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, default=None, help="tokenizer source [default: the manifest's]")
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens fed (the first of them predicts nothing)")
    ap.add_argument("--cache", nargs="+", default=["4:252", "0:256", "dense"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--late-from", type=int, default=None, help="[default: the smallest cache's capacity]")
    ap.add_argument("--dense-by-prefill", action="store_true", help="score the dense cache with one prefill")
    ap.add_argument("--save", type=Path, default=None, help="keep each cache's per-token NLL here (and reuse it)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    manifest = open_bundle(args.bundle).manifest
    context = manifest.model.max_position_embeddings
    checkpoint = args.checkpoint or Path(manifest.provenance["source"])
    ids, prefix = text_ids(checkpoint, read_text(args.text))
    ids = np.concatenate([np.asarray(prefix, np.int64), ids])[: args.tokens]
    if len(ids) < args.tokens:
        raise SystemExit(f"{args.text} has only {len(ids)} tokens")
    rows, nlls = [], []
    for spec in args.cache:
        label, sinks, window = parse_cache(spec, len(ids))
        if sinks + window > context:
            raise SystemExit(f"{label}: sinks + window = {sinks + window} exceeds the trained context {context}")
        t0 = time.perf_counter()
        saved = args.save and args.save / f"{args.bundle.name}-{spec.replace(':', '_')}-{len(ids)}.npy"
        if saved and saved.is_file():
            nlls.append(np.load(saved))
        elif spec == "dense" and args.dense_by_prefill:
            nlls.append(prefill_nll(args.bundle, ids, args.threads))
        else:
            nlls.append(stream_nll(args.bundle, ids, sinks, window, args.threads))
        if saved:
            args.save.mkdir(parents=True, exist_ok=True)
            np.save(saved, nlls[-1])
        rows.append({"cache": label, "sinks": sinks, "window": window, "ppl": math.exp(nlls[-1].mean())})
        rows[-1]["seconds"] = time.perf_counter() - t0
        print(f"{label}: ppl {rows[-1]['ppl']:.3f} ({rows[-1]['seconds']:.0f}s)", flush=True)
    # Targets from the first eviction on (the smallest cache's capacity): there the caches differ, and
    # every cache is scored on the same tokens.
    start = args.late_from or min(r["sinks"] + r["window"] for r in rows)
    for r, nll in zip(rows, nlls, strict=True):
        r["ppl_late"] = math.exp(nll[start - 1 :].mean())
        r["late_from"] = start

    caption = (
        f"`{args.bundle.name}` ({manifest.graph.weight_dtype} weights), {len(ids)} tokens of {args.text.name} fed one "
        f"at a time ({len(ids) - 1} predicted){'; dense scored by chunked prefill' if args.dense_by_prefill else ''}; "
        f"max_position_embeddings {context}; {machine()}."
    )
    print("\n" + caption + "\n")
    print(f"| cache | perplexity, all tokens | vs dense | perplexity, tokens {start}+ (evicting) | vs dense |")
    print("| --- | ---: | ---: | ---: | ---: |")
    dense = next((r for r in rows if r["cache"].startswith("dense")), rows[-1])
    for r in rows:
        print(
            f"| {r['cache']} | {r['ppl']:.3f} | {100 * (r['ppl'] / dense['ppl'] - 1):+.1f}% | {r['ppl_late']:.3f} | "
            f"{100 * (r['ppl_late'] / dense['ppl_late'] - 1):+.1f}% |"
        )
    if args.json:
        args.json.write_text(json.dumps({"caption": caption, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
