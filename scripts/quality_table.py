"""Quality table of the export formats on the demo model (issue 5): perplexity, size, decode speed.

    python scripts/quality_table.py [--checkpoint DIR] [--threads 2] [--decode 128] [--rounds 5]

Each configuration is exported (ort flavor, validated as usual) into a temporary directory. Then:
  * held-out perplexity, float64 reference run with the exported (pruned / dequantized) weights,
    on BOS + the first 511 tokens of heldout.txt (the manifest's `heldout_ppl`);
  * held-out perplexity of the shipped ONNX Runtime graph itself (MatMulNBits with accuracy_level 4
    quantizes activations to int8, so it can differ from the reference's), on `--windows` windows
    of BOS + 511 held-out tokens (8 by default: 4088 predicted tokens, a steadier figure than 511);
  * bundle size on disk;
  * decode tokens/s: every bundle loaded side by side in this one process and timed round-robin
    (teacher-forced held-out tokens after a 16-token prefill), median over rounds, relative to fp32.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edge_runtime.engine import LoadOptions, load
from edge_runtime.exporters import load_checkpoint
from edge_runtime.exporters.calibrate import heldout_ids, heldout_perplexity
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.quant import QuantConfig, QuantMethod
from edge_runtime.exporters.reference import log_softmax
from edge_runtime.models import DEMO_CHECKPOINT

Q = QuantMethod
CONFIGS: list[tuple[str, dict]] = [
    ("fp32", {}),
    ("int8 (per channel)", {"quant": QuantConfig(Q.INT8)}),
    ("int4 RTN, block 32", {"quant": QuantConfig(Q.INT4, 32)}),
    ("int4 RTN, block 128", {"quant": QuantConfig(Q.INT4, 128)}),
    ("int4 RTN, block 32, int4 table", {"quant": QuantConfig(Q.INT4, 32, table_bits=4)}),
    ("int4 AWQ, block 32", {"quant": QuantConfig(Q.INT4_AWQ, 32)}),
    ("int4 GPTQ, block 32", {"quant": QuantConfig(Q.INT4_GPTQ, 32)}),
    ("int4 AWQ, block 128", {"quant": QuantConfig(Q.INT4_AWQ, 128)}),
    ("int4 GPTQ, block 128", {"quant": QuantConfig(Q.INT4_GPTQ, 128)}),
    ("pruned 25%, fp32", {"prune": 0.25}),
    ("pruned 50%, fp32", {"prune": 0.5}),
    ("pruned 25%, int4 GPTQ b32", {"prune": 0.25, "quant": QuantConfig(Q.INT4_GPTQ, 32)}),
    ("pruned 50%, int4 GPTQ b32", {"prune": 0.5, "quant": QuantConfig(Q.INT4_GPTQ, 32)}),
]


def graph_perplexity(engine, windows: list[np.ndarray]) -> float:
    nll, count = 0.0, 0
    for ids in windows:
        engine.reset()
        logits = np.asarray(engine.prefill(ids[:-1], all_logits=True), dtype=np.float64)
        nll -= float(log_softmax(logits)[np.arange(len(ids) - 1), ids[1:]].sum())
        count += len(ids) - 1
    return float(np.exp(nll / count))


def decode_rate(engine, prompt: np.ndarray, tokens: np.ndarray) -> float:
    engine.reset()
    engine.prefill(prompt)
    t0 = time.perf_counter()
    for t in tokens:
        engine.decode(int(t))
    return len(tokens) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=DEMO_CHECKPOINT)
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads per session")
    ap.add_argument("--decode", type=int, default=128, help="decode steps timed per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--windows", type=int, default=8, help="held-out windows of 512 tokens for the graph perplexity")
    ap.add_argument("--only", nargs="*", help="subset of configuration names (substring match)")
    args = ap.parse_args()

    ckpt = load_checkpoint(args.checkpoint)
    ids = heldout_ids(ckpt)
    if ids is None:
        raise SystemExit(f"{args.checkpoint} has no heldout.txt")
    stream = heldout_ids(ckpt, 1 + 511 * args.windows)
    windows = [np.concatenate([stream[:1], stream[1 + 511 * k : 1 + 511 * (k + 1)]]) for k in range(args.windows)]
    configs = [c for c in CONFIGS if not args.only or c[0] == "fp32" or any(s in c[0] for s in args.only)]
    fp32_ppl = heldout_perplexity(ckpt.args, ckpt.weights, ids)
    rows = []
    with tempfile.TemporaryDirectory(prefix="quality-table-") as tmp:
        engines = []
        for name, kw in configs:
            t0 = time.perf_counter()
            out = Path(tmp) / f"b{len(engines)}"
            m = export(ExportOptions(checkpoint=args.checkpoint, out=out, **kw))
            size = sum(p.stat().st_size for p in out.iterdir())
            engine = load(out, LoadOptions(threads=args.threads))
            ref_ppl = m.quantization["heldout_ppl"]["exported"] if kw else fp32_ppl
            graph_ppl = graph_perplexity(engine, windows)
            rows.append({"name": name, "ref_ppl": ref_ppl, "graph_ppl": graph_ppl, "size": size})
            engines.append(engine)
            print(
                f"exported {name} in {time.perf_counter() - t0:.0f}s (validation max rel err "
                f"{m.validation.max_rel_err:.2e}, tolerance {m.validation.tolerance:g})",
                flush=True,
            )

        prompt, steps = ids[:16], ids[16 : 16 + args.decode]
        rates: list[list[float]] = [[] for _ in engines]
        for e in engines:  # warm-up (first runs allocate and pre-pack)
            decode_rate(e, prompt, steps[:8])
        for _ in range(args.rounds):
            for i, e in enumerate(engines):
                rates[i].append(decode_rate(e, prompt, steps))
        for row, r in zip(rows, rates, strict=True):
            row["tok_s"] = statistics.median(r)

    base = rows[0]
    n_graph = sum(len(w) - 1 for w in windows)
    print(
        f"\nDemo model `{ckpt.path.name}`; held-out perplexity: reference on BOS + {len(ids) - 1} tokens of "
        f"heldout.txt (the manifest's record), ORT graph on {n_graph} predicted tokens; "
        f"ONNX Runtime {ort.__version__} CPU, {args.threads} threads, {platform.machine()}; decode: "
        f"{args.decode} steps x {args.rounds} rounds, median, all bundles in one process (ort flavor).\n"
    )
    print("| export | ppl, reference | vs fp32 | ppl, ORT graph | vs fp32 | bundle MB | decode tok/s | vs fp32 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        ref, graph = row["ref_ppl"], row["graph_ppl"]
        print(
            f"| {row['name']} | {ref:.3f} | {100 * (ref / fp32_ppl - 1):+.2f}% | {graph:.3f} | "
            f"{100 * (graph / base['graph_ppl'] - 1):+.2f}% | {row['size'] / 1e6:.2f} | {row['tok_s']:.0f} | "
            f"{row['tok_s'] / base['tok_s']:.2f}x |"
        )


if __name__ == "__main__":
    main()
