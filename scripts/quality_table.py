"""Quality table of the export formats on any checkpoint: held-out perplexity, size, decode speed.

    python scripts/quality_table.py [--checkpoint DIR] [--text FILE] [--tokens 4088] [--context 512]
                                    [--preset all|real] [--only NAME ...] [--threads 2] [--decode 128]
                                    [--rounds 5] [--bundles DIR] [--transformers] [--no-validate] [--json OUT]

Default: the demo model on its own heldout.txt. The real model:
    python scripts/quality_table.py --checkpoint "$(python -m tests.real_model)" --preset real \\
        --text models/eval/python_docstrings.txt --tokens 4088 --transformers --bundles /tmp/qt-smollm2

Each configuration is exported (ort flavor, validated against the float64 reference as usual) into
--bundles (reused when already there: an interrupted run resumes) or a temporary directory. Then:
  * held-out perplexity of the shipped ONNX Runtime graph itself (MatMulNBits with accuracy_level 4
    quantizes activations to int8, so it differs from a float reference), over consecutive windows of
    --context tokens of the text (BOS first where the tokenizer adds one), >= --tokens predicted tokens;
  * with --transformers, the same windows through `transformers` in float32 (the fp32 row should equal it);
  * on the demo model, the manifest's float64-reference perplexity on BOS + 511 tokens of heldout.txt;
  * bundle size on disk;
  * decode tokens/s: every bundle loaded side by side in this one process and timed round-robin
    (teacher-forced held-out tokens after a 16-token prefill), median over rounds, relative to fp32, so a
    busy shared machine slows all rows alike.
A bundle whose validation error exceeds the exporter's tolerance (pruning on the real model)
is still measured here and flagged in the table; edge-export itself would refuse to write it.
--no-validate skips that float64 validation (most of an export's minutes on the real model); the table
then says "not run". Perplexities are cached beside the bundles in --bundles.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

# A sibling script, importable because Python puts this script's folder first on the path.
from heldout_eval import decode_rate, graph_perplexity, machine, read_text, text_ids, transformers_perplexity, windows

import edge_runtime.exporters.export as export_module
from edge_runtime.engine import LoadOptions, load
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.quant import QuantConfig, QuantMethod
from edge_runtime.manifest import ValidationRecord
from edge_runtime.models import DEMO_CHECKPOINT

Q = QuantMethod
NOT_VALIDATED = "not validated (scripts/quality_table.py --no-validate)"
export_module_validate = export_module._validate
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
    # Last, so that the bundle directories (b<index>) of the rows above keep their names.
    ("int4 RTN, block 64", {"quant": QuantConfig(Q.INT4, 64)}),
    ("int8, block 32", {"quant": QuantConfig(Q.INT8, int8_block=32)}),
]
PRESETS = {  # the rows measured on the real model
    "real": [
        "fp32",
        "int8 (per channel)",
        "int4 RTN, block 32",
        "int4 RTN, block 64",  # 128 does not divide SmolLM2-135M's width 576 (the exporter refuses it)
        "int4 AWQ, block 32",
        "int4 GPTQ, block 32",
        "pruned 25%, fp32",
        "pruned 25%, int4 GPTQ b32",
    ],
}


def _lenient_check(cases: list, tol: float, label: str) -> float:
    """exporters.export._check without the refusal: the worst error is kept in the manifest and the
    table flags it, so a bundle edge-export would refuse can still be measured."""
    return max(c.max_rel_err for c in cases)


def _no_validation(*_args: object, **_kw: object) -> ValidationRecord:
    """Stands in for exporters.export._validate under --no-validate (the record says so)."""
    return ValidationRecord(reference=NOT_VALIDATED, tolerance=0.0, max_rel_err=0.0, cases=[], seconds=0.0)


def build(checkpoint: Path, out: Path, kw: dict, validate: bool) -> dict:
    """Export one configuration (or reuse a finished bundle); its manifest as a dict."""
    if not (out / "manifest.json").is_file():
        t0 = time.perf_counter()
        # Measured, flagged, never shipped: the table needs the bundle even where edge-export would refuse it.
        export_module._check = _lenient_check  # type: ignore[assignment]
        export_module._validate = export_module_validate if validate else _no_validation  # type: ignore[assignment]
        export(ExportOptions(checkpoint=checkpoint, out=out, overwrite=True, **kw))
        print(f"  exported in {time.perf_counter() - t0:.0f}s", flush=True)
    return json.loads((out / "manifest.json").read_text(encoding="utf-8"))


def cached_ppl(path: Path, measure: Callable[[], float]) -> float:
    """A perplexity stored at `path`, measured once (a resumed run does not measure it again)."""
    if path.is_file():
        return float(json.loads(path.read_text())["ppl"])
    ppl = measure()
    path.write_text(json.dumps({"ppl": ppl}))
    return ppl


def change(value: float, base: float) -> str:
    """Relative change as a percentage, or as a factor where the model is destroyed."""
    return f"{100 * (value / base - 1):+.1f}%" if value < 10 * base else f"x{value / base:,.0f}"


def windows_digest(wins: list[np.ndarray]) -> str:
    return hashlib.sha256(b"".join(w.tobytes() for w in wins)).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=DEMO_CHECKPOINT)
    ap.add_argument("--text", type=Path, default=None, help="held-out text [default: heldout.txt of the checkpoint]")
    ap.add_argument("--tokens", type=int, default=4088, help="predicted tokens for the graph perplexity (at least)")
    ap.add_argument("--context", type=int, default=512, help="tokens per perplexity window")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads per session")
    ap.add_argument("--decode", type=int, default=128, help="decode steps timed per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--preset", choices=["all", *PRESETS], default="all")
    ap.add_argument("--only", nargs="*", help="subset of configuration names (substring match; fp32 always runs)")
    ap.add_argument("--bundles", type=Path, default=None, help="keep bundles here (and reuse them) [default: temp]")
    ap.add_argument("--transformers", action="store_true", help="also the fp32 perplexity from transformers")
    ap.add_argument(
        "--no-validate", action="store_true", help="skip the exporter's float64 validation (minutes per export)"
    )
    ap.add_argument("--json", type=Path, default=None, help="write the rows here as well")
    args = ap.parse_args()

    text_path = args.text or args.checkpoint / "heldout.txt"
    ids, prefix = text_ids(args.checkpoint, read_text(text_path))
    wins = windows(ids, prefix, args.context, args.tokens)
    n_pred = sum(len(w) - 1 for w in wins)
    names = PRESETS.get(args.preset, [c[0] for c in CONFIGS])
    configs = [c for n in names for c in CONFIGS if c[0] == n]
    configs = [c for c in configs if not args.only or c[0] == "fp32" or any(s in c[0] for s in args.only)]
    print(f"{len(configs)} configurations; {len(wins)} windows of {args.context} ({n_pred} predicted tokens)")

    digest = windows_digest(wins)
    with tempfile.TemporaryDirectory(prefix="quality-table-") as tmp:
        root = args.bundles or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        hf_ppl = None
        if args.transformers:
            hf_ppl = cached_ppl(
                root / f"transformers.ppl-{digest}.json",
                lambda: transformers_perplexity(args.checkpoint, wins, args.threads),
            )
            print(f"transformers fp32 perplexity {hf_ppl:.4f}", flush=True)
        rows = []
        for i, (name, kw) in enumerate(configs):
            print(f"[{i + 1}/{len(configs)}] {name}", flush=True)
            out = root / f"b{CONFIGS.index((name, kw)):02d}"
            manifest = build(args.checkpoint, out, kw, validate=not args.no_validate)
            t0 = time.perf_counter()
            # One bundle resident at a time while exporting (an export peaks at ~3.4 GB).
            ppl = cached_ppl(
                root / f"{out.name}.ppl-{digest}.json",
                lambda out=out: graph_perplexity(load(out, LoadOptions(threads=args.threads)), wins),
            )
            val = manifest["validation"]
            heldout = (manifest.get("quantization") or {}).get("heldout_ppl", {})
            row = {
                "name": name,
                "bundle": str(out),
                "graph_ppl": ppl,
                "ref_ppl": heldout.get("exported"),
                "ref_before": heldout.get("original"),
                "size": sum(p.stat().st_size for p in out.iterdir()),
                "max_rel_err": val["max_rel_err"],
                "tolerance": val["tolerance"],
                "validated": val["reference"] != NOT_VALIDATED,
                "export_s": manifest["provenance"]["export_seconds"],
            }
            rows.append(row)
            print(f"  ppl {ppl:.4f} ({time.perf_counter() - t0:.0f}s); validation {val['max_rel_err']:.2e}", flush=True)

        engines = [load(Path(r["bundle"]), LoadOptions(threads=args.threads)) for r in rows]
        prompt, steps = ids[:16], ids[16 : 16 + args.decode]
        rates: list[list[float]] = [[] for _ in engines]
        for e in engines:  # warm-up (first runs allocate and pre-pack)
            decode_rate(e, prompt, steps[:8])
        for _ in range(args.rounds):
            for i, e in enumerate(engines):
                rates[i].append(decode_rate(e, prompt, steps))
        for row, r in zip(rows, rates, strict=True):
            row["tok_s"] = statistics.median(r)
            row["tok_s_rounds"] = r

    base = rows[0]
    original = [r["ref_before"] for r in rows if r["ref_before"] is not None]
    if base["ref_ppl"] is None and original:  # the fp32 row's reference is every record's "original"
        base["ref_ppl"] = original[0]
    caption = (
        f"`{args.checkpoint.name}` on {text_path.name}: ORT-graph perplexity over {len(wins)} windows of "
        f"{args.context} tokens ({n_pred} predicted){'' if not prefix else ', BOS first'}; ONNX Runtime "
        f"{ort.__version__} CPU, {args.threads} threads, {machine()}, load average "
        f"{os.getloadavg()[0]:.1f} (shared machine); decode: {args.decode} steps x {args.rounds} rounds, median, "
        "all bundles side by side in one process (ort flavor)."
    )
    if hf_ppl is not None:
        caption += f" transformers (float32) on the same windows: {hf_ppl:.3f}."
    print("\n" + caption + "\n")
    show_ref = any(r["ref_ppl"] is not None for r in rows[1:])
    print(
        "| export | ppl, ORT graph | vs fp32 |"
        + (" ppl, float64 ref. (manifest) |" if show_ref else "")
        + " bundle MB | decode tok/s | vs fp32 | validation max rel. err (tolerance) |"
    )
    print("| --- | ---: | ---: |" + (" ---: |" if show_ref else "") + " ---: | ---: | ---: | --- |")
    for row in rows:
        ppl = row["graph_ppl"]
        flag = "" if row["max_rel_err"] <= row["tolerance"] else " **above: edge-export refuses it**"
        check = f"{row['max_rel_err']:.2e} ({row['tolerance']:g}){flag}" if row["validated"] else "not run"
        ref = "" if not show_ref else f" {row['ref_ppl']:.3f} |" if row["ref_ppl"] is not None else " |"
        print(
            f"| {row['name']} | {ppl:,.3f} | {change(ppl, base['graph_ppl'])} |{ref} "
            f"{row['size'] / 1e6:.1f} | {row['tok_s']:.1f} | {row['tok_s'] / base['tok_s']:.2f}x | "
            f"{check} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"caption": caption, "transformers_ppl": hf_ppl, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
