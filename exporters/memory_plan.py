"""What an export will hold in memory at its peak, estimated from the checkpoint's shapes before any work
(`edge-export --max-memory`: ExportPlan.check_memory). docs/architecture.md §6.1 explains the parts.

The export streams: layers are read and widened one at a time (LazyLayers), INT4 codes are held two to a
byte, initializers go to the data file as the graph builder makes them, and validation reads each layer
once per case. What it still holds whole is named here, part by part, so a refusal says what to change:

    tables    the embedding table (and an untied LM head): float32 in a float export; a quantized export
              reads it from the checkpoint a block of rows at a time (StoredTable), and its codes go to the
              scratch file once made (QuantizedTable reads them back by rows)
    (codes    every quantized Linear's codes and scales are not held: each layer's go to an unlinked
              scratch file as it is quantized, scratch.py, and are read back as they are used)
    layer     float32 copies of one layer's Linears alive at once
    runtime   ONNX Runtime's view of the bundle while the graph runs (the data file it maps and touches,
              and the twin's dequantized LM head), or the table's bytes on their way to the file
    reference the float64 reference's tables (models up to reference.F64_COPY_MAX_PARAMS parameters)
    calibration  AWQ/GPTQ: one layer's input statistics (X^T X, or AWQ's row sample of a wide input), their
              rows waiting for X^T X, and the calibration tokens' float32 residual streams (the layers are
              calibrated one at a time as each
              is quantized; --mixed sensitivity scores each layer then); pruning compares layers: every
              layer's statistics and the pruned model whole; AWQ under --mixed sensitivity keeps its
              scaled Linears in float32

The constants were fitted to the phases measured on the Llama-3.2-1B shape (docs/benchmarks/export-at-scale.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from edge_runtime import kernels
from edge_runtime.models import ModelArgs, RopeKind

from .calibrate import CALIBRATION_DTYPE, CALIBRATION_SEQUENCE, DEFAULT_CALIBRATION_TOKENS
from .hessian import FACTOR_BLOCK
from .input_stats import GRAM_ROWS, SAMPLE_ROWS
from .plan import Flavor, KvDtype
from .quant import QuantConfig
from .quant_graph import FP32_HEAD_MAX_BYTES
from .quant_pipeline import samples_wide_inputs
from .reference import F64_COPY_MAX_PARAMS
from .tables import RowTable

if TYPE_CHECKING:
    from .plan import ExportPlan

# The interpreter, numpy, onnx and ONNX Runtime, and the tokenizer built from the checkpoint's files, fitted to
# the export's peak at the end of its load stage: 88-91 MB for the demo model (4,096 tokens), 124 MB for
# SmolLM2-135M (49,152), 183 MB for the Llama-3.2-1B shape (128,256)
BASELINE = 96 * 10**6
TOKENIZER_LOAD_TOKEN_BYTES = 750
# float32 copies of one layer's Linears alive at once, fitted to the Llama-3.2-1B shape's measured phases:
PREPARE_LAYERS = 2  # the widened source layer and quantization's temporaries
GRAPH_LAYERS = 5  # a float graph: the source layer, its initializers' copies, two branches' lookups
# A quantized graph packs codes (QuantizedTable placeholders, nothing dequantized): the packing temporaries
# and their TensorProto copies, and the table's packed bytes on their way to the file (measured at the
# 1B and 8B shapes: 0.8 and 2.6 GB at their peaks)
GRAPH_LAYERS_QUANTIZED = 1.5
REFERENCE_LAYERS = 3  # the dequantized layer, the reference's view of it, activations
# float32 LM heads' worth the accuracy_level 0 twin's session adds beyond the bundle's bytes while it runs
# (its own data file is 1.4x the bundle's; MLAS prepacks part of it; its head runs in parts,
# quant_graph.FP32_TABLE_PART_ROWS): the 1B shape's twin needs 0.52, the 8B shape's 0.16 (its session
# held 5.3 GiB beside a 5.0 GB bundle), so the smaller model's figure bounds both
TWIN_HEAD_COPIES = 0.6
# The validation grid's tokens (validate.validation_grid: prefills of 1, 7 and 64 each followed by 8 decode
# steps, and 64 + 40 past capacity), each a row of logits (the estimate's validate phase)
VALIDATION_TOKENS = (1 + 8) + (7 + 8) + (64 + 8) + (64 + 40)
VALIDATION_PREFILL = 64
LONGEST_CASE = 64 + 40
COMPARED_COPIES = 3  # rel_err's float64 copy of the graph's rows, their difference and its absolute value
# ONNX Runtime's allocations beside the weights while a graph runs (its arena, thread pools, the graph itself,
# and prepacked copies, a share of every weight byte the session holds: the bundle's, and the twin's float LM
# head), fitted to what quantized exports' validation held above the parts counted here (SmolLM2-135M int4: the
# twin's session peaked at 554-567 MB against 563 without the share; the Llama-3.2-1B shape's int4 at 1,910)
SESSION_OVERHEAD = 48 * 10**6
SESSION_OVERHEAD_SHARE = 0.2  # of the bytes of the weights the session holds
PROBE_ROWS = (1 + 8) + (7 + 8) + (64 + 8)  # the dense cases' rows the float32 probe scores
# One layer's statistics' worth alive while it is calibrated and quantized: its statistics and AWQ's
# rescaled copies (GPTQ's working set is counted on its own: _gptq_bytes)
LAYER_GRAM_COPIES = 3


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 1 << 20


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold at 1 MiB, so every array of more than a megabyte is its own mapping and
    goes back to the system when freed. By default glibc raises the threshold to the size of the last
    freed mapped block (up to 32 MiB), after which a layer's worth of such arrays comes from the heap and
    stays in RSS once freed: 0.8 GB after building a 1B model's graph (measured with malloc_trim). A
    process-wide setting, harmless to the rest of the process; False where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False


@dataclass(frozen=True)
class MemoryEstimate:
    parts: dict[str, int]  # bytes per part (module docstring) of the phase with the largest sum
    phases: dict[str, dict[str, int]] = field(default_factory=dict)  # each phase's parts (prepare, graph, validate)

    def phase_totals(self) -> dict[str, int]:
        return {name: sum(parts.values()) for name, parts in self.phases.items()}

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        big = sorted(((v, k) for k, v in self.parts.items() if v), reverse=True)
        return ", ".join(f"{k} {v / 1e6:,.0f}" for v, k in big)


def _linear_params(args: ModelArgs) -> tuple[int, tuple[int, ...]]:
    """(parameters of one layer's Linears, the widths of its four input groups: calibrate.TAPPED)."""
    h, d, i = args.hidden_size, args.head_dim, args.intermediate_size
    q, kv = args.num_heads * d, args.num_kv_heads * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i
    return per_layer, (h, q, h, i)


def _stats_bytes(widths: tuple[int, ...], sampled: bool) -> int:
    """One layer's input statistics: X^T X in float64, or a float32 row sample of the inputs wider than
    it where the consumer allows (input_stats.py)."""
    return sum(SAMPLE_ROWS * k * 4 if sampled and k > SAMPLE_ROWS else k * k * 8 for k in widths)


def _gptq_bytes(args: ModelArgs) -> int:
    """GPTQ's working set on a layer's widest fused group (quant.gptq_rows, K inputs, `out` stacked rows): its
    Hessian, factorised and inverted where it lies (one K x K float64), and W^T with its permuted copy
    (2 K x out)."""
    h, d, i = args.hidden_size, args.head_dim, args.intermediate_size
    q, kv = args.num_heads * d, args.num_kv_heads * d
    groups = ((h, q + 2 * kv), (q, h), (h, 2 * i), (i, h))  # qkv, o, gate_up, down: (K, out)
    # and the factorisation's temporaries: a few blocks of FACTOR_BLOCK rows (hessian.cholesky_in_place)
    return max(k * k * 8 + 2 * k * out * 8 + 3 * FACTOR_BLOCK * k * 8 for k, out in groups)


def _calibration_streams(args: ModelArgs, stream_bytes: int) -> int:
    """What calibrate.LayerInputStream holds for all its sequences: the residual streams into and out of the
    layer being run, and each sequence's RoPE tables (cos and sin, [T, head_dim / 2] per kind of layer)."""
    tokens = DEFAULT_CALIBRATION_TOKENS
    return 2 * tokens * args.hidden_size * stream_bytes + tokens * args.head_dim * len(RopeKind) * stream_bytes


def _sequence_temporaries(args: ModelArgs, stream_bytes: int) -> int:
    """One sequence's forward through a layer (CALIBRATION_SEQUENCE tokens): its attention scores and the MLP's
    gate, up, the activation of gate and their product."""
    t = CALIBRATION_SEQUENCE
    return (args.num_heads * t * t + 4 * t * args.intermediate_size) * stream_bytes


def _gram_buffers(widths: tuple[int, ...], sampled: bool) -> int:
    """The float32 rows waiting for X^T X (input_stats.GRAM_ROWS), per input that keeps a Gram matrix."""
    return sum(0 if sampled and k > SAMPLE_ROWS else GRAM_ROWS * k * 4 for k in widths)


# A GGUF's conversion to a float32 checkpoint (gguf_convert.py), before the export proper. gguf-py's reader
# keeps Python objects per metadata value, so its memory grows with the vocabulary; fitted on two real files
# (SmolLM2-135M Q4_1: 94 MB, 49,152 tokens, reader 161 MiB, tokenizer 19 MiB; Gemma 3 270M Q4_K_M: 241 MB,
# 262,144 tokens, reader 687 MiB, tokenizer 121 MiB), then to the exports' peaks when their load stage (the
# conversion, the checkpoint's and the tokenizer's load) ends, with BASELINE at 96 MB: 375-400 MB and
# 1,246-1,304 MB (AMD EPYC, 2026-12-07; provenance.stage_peak_rss_bytes of the exports in
# docs/benchmarks/export-memory.md), against 429 and 1,389 MB from these.
READER_FILE_SHARE = 0.7  # of the file's bytes: the pages of it the reader maps and touches
READER_TOKEN_BYTES = 3400  # the reader's objects per vocabulary entry
TOKENIZER_TOKEN_BYTES = 600  # the tokenizer built from them (tokenizers' vocabulary and merges, its JSON)
DEQUANTIZE_CHUNKS = 4  # a tensor_rows block's float32 output and gguf's dequantization temporaries


def estimate_conversion_memory(file_bytes: int, vocab_size: int) -> MemoryEstimate:
    """The GGUF conversion's peak: the interpreter, the open file and its metadata, the tokenizer, and a block
    of rows being dequantized (gguf_reader.CHUNK_BYTES; the float32 checkpoint goes to disk as it is made)."""
    from .gguf_reader import CHUNK_BYTES

    return MemoryEstimate(
        {
            "baseline": BASELINE,
            "gguf": int(READER_FILE_SHARE * file_bytes) + READER_TOKEN_BYTES * vocab_size,
            "tokenizer": TOKENIZER_TOKEN_BYTES * vocab_size,
            "dequantize": DEQUANTIZE_CHUNKS * CHUNK_BYTES,
        }
    )


def estimate_plan_memory(ckpt, plan: ExportPlan, *, codes_held: bool, spilled: bool) -> MemoryEstimate:
    """What `plan` holds at its peak on `ckpt` (a loaded Checkpoint): estimate_export_memory of its options."""
    return estimate_export_memory(ckpt, plan.quant, plan.flavor, plan.pruning, codes_held, spilled, plan.kv_dtype)


def estimate_export_memory(
    ckpt,
    quant: QuantConfig,
    flavor: Flavor,
    pruning: bool = False,
    codes_held: bool = False,
    spilled: bool = True,
    kv_dtype: KvDtype = KvDtype.FP32,
) -> MemoryEstimate:
    """`ckpt`: a loaded Checkpoint (its shapes only are read). The largest of the phases' sums: preparing the
    weights (the source's float tables beside the codes), building the graph (a few layers' floats and the
    table's bytes on their way to the file), running it on ONNX Runtime, and the reference's pass.
    `codes_held`: every Linear's codes are in memory while the weights are prepared (a GGUF source's,
    read before the export starts) or throughout (no scratch file could be made). `spilled`: a scratch file
    takes the quantized tables' codes once they are made (False: they are held to the end)."""
    args: ModelArgs = ckpt.args
    v, h = args.vocab_size, args.hidden_size
    tables = 1 if args.tie_word_embeddings else 2
    per_layer, widths = _linear_params(args)
    linear = per_layer * args.num_layers
    params = linear + tables * v * h
    table_f32 = tables * v * h * 4
    layer = per_layer * 4

    codes = table_codes = 0
    if quant.enabled:
        bits = quant.method.linear_bits
        # INT8 per channel: a scale per output channel, about one per `in`
        block = quant.block if bits == 4 else quant.int8_block or h
        codes = linear * bits // 8 + linear // block * 4
        if not quant.fp_embeddings:
            table_codes = tables * v * h * quant.table_bits // 8
        bundle = codes + (table_codes or table_f32)
    else:
        bundle = params * (4 if flavor is Flavor.ORT else 2)  # trt bundles of float weights: fp16 commonly
    # After the weight stage a quantized export holds nothing of its tables (their codes and the Linears'
    # wait in the scratch file, read a block of rows at a time) unless there is no scratch file; a float
    # export holds its float tables.
    held = {
        "baseline": BASELINE,
        "tokenizer": TOKENIZER_LOAD_TOKEN_BYTES * v,
        "tables": (0 if spilled else table_codes) if table_codes else table_f32,
    }

    if codes_held:  # counted in every phase: an over-estimate after the weight stage for a GGUF's
        held["codes"] = codes
    # Tables read from the checkpoint a block of rows at a time (StoredTable) are never whole as float32
    stored = isinstance(ckpt.weights.embed, RowTable)
    prepare = {**held, "tables": table_codes + (0 if stored else table_f32), "layer": PREPARE_LAYERS * layer}
    ref_bytes = 8 if params <= F64_COPY_MAX_PARAMS else 4
    stream_bytes = np.dtype(CALIBRATION_DTYPE).itemsize  # the calibration forward's activations
    if pruning:  # every layer's statistics at once, the pruned model whole
        prepare["calibration"] = (
            _stats_bytes(widths, False) * args.num_layers + _gram_buffers(widths, False) + params * ref_bytes
        )
        # whole-layer candidates (prune_layers.BlockStats): X^T D per layer, and two layers' down inputs (the
        # previous one's, held for this one's block output) (a plain --prune gathers neither: an over-estimate)
        inter = args.intermediate_size
        down_rows = 2 * DEFAULT_CALIBRATION_TOKENS * inter * stream_bytes
        prepare["calibration"] += args.num_layers * inter * h * 8 + down_rows
    elif quant.needs_calibration:  # a layer at a time (calibrate.LayerInputStream): its statistics, the streams
        sampled = samples_wide_inputs(quant)
        stats = _stats_bytes(widths, sampled)
        # the row buffers and a sequence's temporaries live while a layer's forward runs, GPTQ's working set
        # after it: one or the other
        forward = _gram_buffers(widths, sampled) + _sequence_temporaries(args, stream_bytes)
        working = max(forward, _gptq_bytes(args) if quant.method.gptq else 0)
        copies = LAYER_GRAM_COPIES if quant.method.awq else 1
        prepare["calibration"] = copies * stats + working + _calibration_streams(args, stream_bytes)
        if quant.mixed.needs_calibration and quant.method.awq:  # the scaled layers, re-read for the INT8 groups
            prepare["calibration"] += linear * 4
    graph_layers = GRAPH_LAYERS_QUANTIZED if quant.enabled else GRAPH_LAYERS
    graph = {**held, "layer": int(graph_layers * layer), "runtime": table_codes}
    # ONNX Runtime maps the data file and touches all of it; MatMulNBits at accuracy_level 0 (the twin)
    # dequantizes a quantized LM head whole for a prefill of more than one row, beside its arena.
    # An INT8 per-channel graph with an fp32 cache is its own twin where the edge ops run (export._twin_session);
    # where that is not certain (pruned widths, a GGUF's codes in blocks) the rebuilt twin's head is counted.
    own_twin = (
        kernels.available()
        and kv_dtype is KvDtype.FP32
        and quant.accuracy_level == 4
        and not pruning
        and not codes_held
        and quant.method.linear_bits == 8
        and quant.int8_block is None
        and quant.table_bits == 8
        and all(k % 64 == 0 for k in widths)
    )
    head_f32 = table_f32 / tables
    # a small INT8 head runs in the twin as a float32 Gemm (quant_graph.FP32_HEAD_MAX_BYTES): mapped and prepacked
    float_head = quant.table_bits == 8 and head_f32 <= FP32_HEAD_MAX_BYTES
    twin_head = 2 * head_f32 if float_head else TWIN_HEAD_COPIES * head_f32
    twin = int(twin_head) if table_codes and flavor is Flavor.ORT and not own_twin else 0
    # Validation (validate.validation_grid) runs the graph over every case, closes its session, then runs the
    # reference over the cases' streams. What both see: the reference's float64 tables (a float export's, held
    # from the start: 1.3 GB for Gemma 3 270M) and the graph's float32 logits of every case; the session adds its
    # arena's output of the longest prefill and ONNX Runtime's own allocations, the reference its float64 logits
    # of every stream (ReferenceMemo), the comparison's float64 temporaries of the longest case (validate.rel_err)
    # and the float32 probe's rows of the dense cases. A quantized export peaks at the larger of the two
    # (measured, MB: SmolLM2-135M int4 567-594 and nuc 601, Gemma 3 270M nuc 1,546). A float export peaks near
    # their sum (SmolLM2-135M fp32 1,237, Gemma 3 270M fp32 4,485, against 1,139 and 3,741 for the larger): its
    # session's float weights and the reference's float64 ones are not both let go between the two.
    both = {
        **held,
        # a quantized table is read from its codes a block of rows at a time, not copied to float64
        "reference": tables * v * h * 8 if params <= F64_COPY_MAX_PARAMS and not table_codes else 0,
        "logits": VALIDATION_TOKENS * 4 * v,
    }
    running = {**both, "runtime": bundle + twin + SESSION_OVERHEAD + int(SESSION_OVERHEAD_SHARE * (bundle + twin))}
    running["logits"] += VALIDATION_PREFILL * 4 * v
    scoring = {**both, "layer": REFERENCE_LAYERS * layer}
    probe_rows = VALIDATION_PREFILL + PROBE_ROWS
    scoring["logits"] += (VALIDATION_TOKENS * 8 + COMPARED_COPIES * LONGEST_CASE * 8 + probe_rows * 4) * v
    if table_codes:
        validate = max(running, scoring, key=lambda p: sum(p.values()))
    else:  # the session's weights, the reference's layers and tables, and one float64 and float32 logit row each
        # (and a float64 temporary) per grid token, the arena's prefill and the probe's rows: fitted to the sum
        validate = {
            **both,
            "runtime": bundle + twin,
            "layer": REFERENCE_LAYERS * layer,
            "logits": (VALIDATION_TOKENS * (8 + 4 + 8) + (VALIDATION_PREFILL + PROBE_ROWS) * 4) * v,
        }
    phases = {"prepare": prepare, "graph": graph, "validate": validate}
    largest = max(phases.values(), key=lambda p: sum(p.values()))
    return MemoryEstimate(largest, phases)
