"""What an export will hold in memory at its peak, estimated from the checkpoint's shapes before any work
(issue 23; `edge-export --max-memory`). docs/architecture.md §6.1 explains the parts.

The export streams: layers are read and widened one at a time (LazyLayers), INT4 codes are held two to a
byte, initializers go to the data file as the graph builder makes them, and validation reads each layer
once per case. What it still holds whole is named here, part by part, so a refusal says what to change:

    tables    the embedding table (and an untied LM head) as float32, plus the dequantized copy and the
              integer codes of a quantized table
    codes     every quantized Linear's codes and scales
    layer     one layer's float32 working set (widened, quantized, dequantized, the reference's copy)
    runtime   ONNX Runtime's copy of the bundle's weights while validation runs
    reference the float64 reference's tables (models up to reference.F64_COPY_MAX_PARAMS parameters)
    calibration  X^T X of every Linear group's inputs and the reference held whole (calibrated methods, pruning)

The constants were fitted to measured peaks (README "Export at scale"); the estimate is meant to be
within about 15% for RTN and float exports. Calibrated exports are not layer by layer yet, and their
part is the Gram matrices' plain size.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_runtime.models import ModelArgs

from .decoder import Flavor
from .quant import QuantConfig
from .reference import F64_COPY_MAX_PARAMS

BASELINE = 350 * 2**20  # the interpreter, numpy, onnx, ONNX Runtime and the tokenizer, measured idle
LAYER_COPIES = 4  # float32 copies of one layer alive at once (read, quantize's temporaries, dequantized, reference)
RUNTIME_FACTOR = 1.25  # ONNX Runtime's session over the bundle's weight bytes (its arena and packed copies)


@dataclass(frozen=True)
class MemoryEstimate:
    parts: dict[str, int]  # bytes per part (module docstring)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        big = sorted(((v, k) for k, v in self.parts.items() if v), reverse=True)
        return ", ".join(f"{k} {v / 1e6:,.0f}" for v, k in big)


def _linear_params(args: ModelArgs) -> tuple[int, int]:
    """(parameters of one layer's Linears, of its largest input width squared summed over its four input groups)."""
    h, d, i = args.hidden_size, args.head_dim, args.intermediate_size
    q, kv = args.num_heads * d, args.num_kv_heads * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i
    grams = h * h + q * q + h * h + i * i  # attn, o, mlp, down inputs (calibrate.TAPPED)
    return per_layer, grams


def estimate_export_memory(ckpt, quant: QuantConfig, flavor: Flavor, pruning: bool = False) -> MemoryEstimate:
    """`ckpt`: a loaded Checkpoint (its shapes only are read). The larger of the two phases' sums: preparing
    the weights (the source's float tables beside the quantized ones) and validating (the source's tables
    released, ONNX Runtime's session and the reference in their place)."""
    args: ModelArgs = ckpt.args
    v, h = args.vocab_size, args.hidden_size
    tables = 1 if args.tie_word_embeddings else 2
    per_layer, grams = _linear_params(args)
    linear = per_layer * args.num_layers
    params = linear + tables * v * h
    table_f32 = tables * v * h * 4
    common = {"baseline": BASELINE, "layer": LAYER_COPIES * per_layer * 4}

    codes = table_codes = 0
    if quant.enabled:
        bits = quant.method.linear_bits
        block = quant.block if bits == 4 else h  # INT8: a scale per output channel, about one per `in`
        codes = linear * bits // 8 + linear // block * 4
        if not quant.fp_embeddings:
            table_codes = tables * v * h * quant.table_bits // 8
        weights = codes + (table_codes if table_codes else table_f32)
    else:
        weights = params * 4 if flavor is Flavor.ORT else params * 2  # trt bundles of float weights: fp16 common
    bundle_tables = table_f32 + table_codes  # what the graph and the reference read: dequantized, and the codes

    prepare = {**common, "tables": table_f32 + (bundle_tables if table_codes else 0), "codes": codes}
    if quant.needs_calibration or pruning:
        held = params * (8 if params <= F64_COPY_MAX_PARAMS else 4)
        prepare["calibration"] = grams * 8 * args.num_layers + held
    validate = {
        **common,
        "tables": bundle_tables,
        "codes": codes,
        "runtime": int(RUNTIME_FACTOR * weights),
        "reference": tables * v * h * 8 if params <= F64_COPY_MAX_PARAMS else 0,
    }
    return MemoryEstimate(max(prepare, validate, key=lambda p: sum(p.values())))
