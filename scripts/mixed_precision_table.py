"""Held-out perplexity of INT4 exports with and without --mixed plans, by llama-perplexity's protocol
(scripts/ppl_vs_llamacpp.py's scoring: 8 chunks of 512 tokens, the second half of each scored, no BOS).

    python scripts/mixed_precision_table.py --checkpoint "$(python -m tests.real_model)" \\
        --text models/eval/python_docstrings.txt --bundles /tmp/qt-mixed [--only NAME ...]

Bundles are exported without the float64 validation (as quality_table.py --no-validate) and reused when
present. Calibrated rows share one calibration capture (the same text and weights give the same
statistics), which saves ~3 minutes a row. bits/param: every byte of model.onnx* over the checkpoint's
parameter count; code bits: the Linears' average integer code width (INT4 4, INT8 8; scales not counted).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Sibling scripts, importable because Python puts this script's folder first on the path.
from ppl_vs_llamacpp import our_ppl
from quality_table import build

import edge_runtime.exporters.quant_model as quant_model
import edge_runtime.exporters.quant_pipeline as pipeline
from edge_runtime.exporters.quant import MixedPlan, QuantConfig, QuantMethod

Q, M = QuantMethod, MixedPlan
# ~105.5 MB (Q4_K_M's size) under --kernel mlas: INT8 per channel costs ~0.44 B a weight more than INT4
# b32 with fp32 scales, so Q4_K_M's 1.1 MB over the 4.5-bit plan buys ~0.09 code bits; with the INT4 table
# (10.6 MB less) ~0.9 more.
# Asymmetric blocks add a 4-bit zero point per INT4 block (~1.45 MB here), so their fill is 4.47.
FILL_BITS, FILL_BITS_T4, FILL_BITS_ASYM = 4.59, 5.4, 4.47
CONFIGS = {
    "int4 RTN b32": QuantConfig(Q.INT4, 32),
    "int4 RTN b32, mixed llama-down": QuantConfig(Q.INT4, 32, mixed=M.LLAMA_DOWN),
    "int4 RTN b32, mixed sensitivity": QuantConfig(Q.INT4, 32, mixed=M.SENSITIVITY),
    "int4 GPTQ b32, mixed llama-down": QuantConfig(Q.INT4_GPTQ, 32, mixed=M.LLAMA_DOWN),
    "int4 GPTQ b32, mixed sensitivity": QuantConfig(Q.INT4_GPTQ, 32, mixed=M.SENSITIVITY),
    "int4 GPTQ b32": QuantConfig(Q.INT4_GPTQ, 32),
    "int4 GPTQ b32 damp 0.1": QuantConfig(Q.INT4_GPTQ, 32),
    "int4 GPTQ b32 damp 0.01, mixed sensitivity": QuantConfig(Q.INT4_GPTQ, 32, mixed=M.SENSITIVITY),
    "int4 AWQ b32, sink-weighted": QuantConfig(Q.INT4_AWQ, 32),
    "int4 AWQ+GPTQ b32, mixed sensitivity": QuantConfig(Q.INT4_AWQ_GPTQ, 32, mixed=M.SENSITIVITY),
    f"int4 GPTQ b32, mixed sensitivity {FILL_BITS}": QuantConfig(
        Q.INT4_GPTQ, 32, mixed=M.SENSITIVITY, mixed_bits=FILL_BITS
    ),
    f"int4 GPTQ b32, table int4, mixed sensitivity {FILL_BITS_T4}": QuantConfig(
        Q.INT4_GPTQ, 32, table_bits=4, mixed=M.SENSITIVITY, mixed_bits=FILL_BITS_T4
    ),
    "int4 GPTQ b32 asymmetric": QuantConfig(Q.INT4_GPTQ, 32, asymmetric=True),
    f"int4 GPTQ b32 asymmetric, mixed sensitivity {FILL_BITS_ASYM}": QuantConfig(
        Q.INT4_GPTQ, 32, asymmetric=True, mixed=M.SENSITIVITY, mixed_bits=FILL_BITS_ASYM
    ),
}
# Rows that differ from another only in a quant_model constant, set for that row's export alone
CONSTANTS: dict[str, dict[str, float]] = {
    "int4 AWQ b32, sink-weighted": {"AWQ_SINK_WEIGHT": 1.0},
    "int4 AWQ+GPTQ b32, mixed sensitivity": {"AWQ_SINK_WEIGHT": 1.0},
    "int4 GPTQ b32 damp 0.1": {"GPTQ_DAMP": 0.1},
    "int4 GPTQ b32 damp 0.01, mixed sensitivity": {"GPTQ_DAMP_MIXED": 0.01},
}

_cache: dict = {}


class _CachedStream(pipeline.LayerInputStream):
    """One calibration for every row (no pruning here: one model), served a layer at a time as the
    exporter asks for it. X^T X for every input, wide or not (`sample_wide` ignored: a model this script
    compares is small enough)."""

    def __init__(self, args, weights, calib, progress=lambda _m: None, *, sample_wide=False):
        key = (calib.sha256, calib.tokens)
        if key not in _cache:
            _cache[key] = pipeline.capture_linear_inputs(args, weights, calib, progress)
        self._all, self.seconds = _cache[key], 0.0

    def layer(self, i):
        return self._all.layer(i)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--bundles", type=Path, required=True)
    ap.add_argument("--only", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    pipeline.LayerInputStream = _CachedStream
    text = a.text.read_text(encoding="utf-8")
    a.bundles.mkdir(parents=True, exist_ok=True)
    params = None
    for name in a.only:
        out = a.bundles / name.replace(" ", "_").replace(",", "")
        saved = {k: getattr(quant_model, k) for k in CONSTANTS.get(name, {})}
        for k, v in CONSTANTS.get(name, {}).items():
            setattr(quant_model, k, v)
        try:
            manifest = build(a.checkpoint, out, {"quant": CONFIGS[name]}, validate=False)
        finally:
            for k, v in saved.items():
                setattr(quant_model, k, v)
        if params is None:
            from edge_runtime.exporters import load_checkpoint

            ck = load_checkpoint(a.checkpoint)
            params = ck.weights.embed.size + (0 if ck.weights.lm_head is ck.weights.embed else ck.weights.lm_head.size)
            params += sum(v.size for lw in ck.weights.layers for v in vars(lw).values() if v is not None)
            params += ck.weights.final_norm.size
        ppl, n = our_ppl(out, text, 512, 8, a.threads)
        size = sum(f.stat().st_size for f in out.iterdir() if f.name.startswith("model.onnx"))
        mixed = manifest["quantization"].get("mixed", {})
        row = {
            "name": name,
            "ppl": round(ppl, 3),
            "scored": n,
            "mb": round(size / 1e6, 1),
            "bits_per_param": round(8 * size / params, 3),
            "linear_code_bits": mixed.get("linear_code_bits", 4.0),
            "int8_groups": mixed.get("int8_groups", []),
            "quantize_s": manifest["quantization"].get("quantize_seconds"),
        }
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
