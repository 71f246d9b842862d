"""Lossless GGUF import: a GGUF's Q4_0 / Q8_0 codes and scales kept as they are, not requantized.

    plan = plan_import(GGUFCodes.KEEP, quant, gguf_source=True, trt=False, prune=False)   # None: importable
    codes = read_codes(Path("model.Q4_0.gguf"), quant)       # HF name -> QuantizedMatrix, Q/K rows un-permuted
    export(ExportOptions(checkpoint=hf_dir, out=out, quant=quant, source_codes=codes))

`edge-export x.gguf` otherwise dequantizes the file (gguf_convert.py) and quantizes the float weights
again onto our own grid, which adds a second rounding on top of llama.cpp's. Where our format holds a
tensor's grid exactly, the codes go into the bundle unchanged and the bundle computes with the weights
llama.cpp dequantizes, bit for bit (a float32 product of an fp16 scale and a small integer is exact):

  Q4_0: blocks of 32, w = d * (q - 8), q in 0..15, d fp16 -> codes q - 8 in [-8, 7], scale d (INT4 block 32);
        in an INT8 export the same codes and scales as INT8 block 32 (exact, where per-channel INT8 is not).
  Q8_0: blocks of 32, w = d * q, q int8, d fp16 -> the same, as INT8 block 32 (MatMulNBits bits 8).

d is negative in about half of llama.cpp's Q4_0 blocks (`quantize_row_q4_0`: d = max / -8, max the
signed largest-magnitude value, which always gets q = 0). Our own quantizer picks positive scales for
TensorRT; flipping the sign instead would need the code 8 - q = 8, outside [-8, 7], for that very
value, so the negative scales are kept. MatMulNBits and the edge MatMulQ4 multiply by the scale as it
is (tests/test_gguf_lossless.py checks both); TensorRT's explicit quantization wants positive scales
and blocks of 64/128, so the `trt` flavor requantizes.

Not exact in those formats: Q4_1 (w = d * q + m: its fp16 minimum m is no integer zero point, and
MatMulNBits' float zero points compute (q - z) * d, which rounds differently), Q5_*, the K-quants (super-blocks
of 256 with 6-bit sub-scales), and float tensors. Where the edge kernels run the bundle (`blocks`: the plan's
default for a GGUF, ExportPlan.gguf_blocks), every Linear of a type they execute (gguf_blocks.BLOCK_TYPES: Q4_0
to Q6_K) is kept in its GGUF blocks instead, as stored, for the MatMulGGUF op; the rest as above.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.errors import CorruptCheckpointError, ExportError
from edge_runtime.models import get_arch

from .gguf_blocks import BLOCK_TYPES, GGUFMatrix, check
from .gguf_convert import build_config, hf_name, layout, reverse_permute
from .gguf_reader import GGUFFile
from .quant import MixedPlan, QuantConfig, QuantizedMatrix, QuantMethod

BLOCK = 32  # Q4_0's and Q8_0's block: input channels per scale
# The in-bundle format of Linears kept in their GGUF blocks (docs/guides/gguf-blocks.md): ggml's block bytes of each
# row, unchanged, rows in Hugging Face order; the manifest names it, so a reader can refuse a later one.
BLOCKS_FORMAT = "ggml-blocks-1"
CODE_BITS = {"Q4_0": 4, "Q8_0": 8}  # GGUF type -> bits its codes need
_TABLES = ("token_embd.weight", "output.weight")


class GGUFCodes(enum.Enum):
    """What an export of a GGUF does with the file's quantization codes."""

    KEEP = "keep"  # import Q4_0/Q8_0 codes where the bundle's format holds them exactly
    REQUANTIZE = "requantize"  # dequantize to float32, quantize like a Hugging Face checkpoint

    @classmethod
    def parse(cls, text: str) -> GGUFCodes:
        try:
            return cls(text)
        except ValueError:
            raise ExportError(f"unknown --gguf-codes {text!r}; choose one of: keep, requantize") from None


@dataclass(frozen=True)
class SourceCodes:
    """The tensors an export takes from the GGUF as they are, and the manifest's account of it."""

    tensors: dict[str, QuantizedMatrix | GGUFMatrix]  # HF tensor name -> codes and scales, or GGUF blocks
    record: dict[str, Any]  # the manifest's quantization.gguf_codes


def plan_import(
    mode: GGUFCodes | None, quant: QuantConfig, *, gguf_source: bool, trt: bool, prune: bool, blocks: bool = False
) -> str | None:
    """Why this export cannot import GGUF codes (None: it can). `mode` None is the default: keep where
    possible; an explicit KEEP that cannot be honoured raises, in one line, before any work. `blocks`: Linears
    are kept in their GGUF blocks (ExportPlan.gguf_blocks), so the INT4/INT8 block sizes only the rest."""
    if not gguf_source:
        if mode is not None:
            raise ExportError("--gguf-codes applies to a .gguf checkpoint only; drop it for this source")
        return "not a GGUF source"
    if mode is GGUFCodes.REQUANTIZE:
        return "requantized as asked (--gguf-codes requantize)"
    reason = None
    if quant.method not in (QuantMethod.INT4, QuantMethod.INT8):
        reason = (
            "--quant none keeps float weights, which are the file's dequantized values already"
            if not quant.enabled
            else f"--quant {quant.method.value} re-rounds the float weights with calibration data"
        )
    elif trt:
        reason = "the trt flavor's TensorRT Q/DQ takes positive scales, INT4 in blocks of 64/128, INT8 per channel"
    elif blocks:
        pass
    elif quant.method is QuantMethod.INT4 and quant.block != BLOCK:
        reason = f"--block {quant.block} is not Q4_0's block of {BLOCK}"
    elif quant.int8_block not in (None, BLOCK):
        reason = f"--block {quant.int8_block} is not Q8_0's block of {BLOCK}"
    elif prune:
        reason = "--prune changes the weights before they are quantized"
    elif quant.mixed is not MixedPlan.NONE:
        reason = f"--mixed {quant.mixed.value} re-rounds some Linears to INT8 per channel"
    if reason is not None and mode is GGUFCodes.KEEP:
        raise ExportError(f"--gguf-codes keep cannot be honoured: {reason}; use --gguf-codes requantize")
    return reason


def decode_blocks(type_name: str, raw: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(codes int8 [out, in], scales float32 [out, in / 32]) of a Q4_0 or Q8_0 tensor's bytes, such that
    codes * scales (per block) is gguf.quants.dequantize's value exactly."""
    out, k = shape
    blocks = np.ascontiguousarray(raw).reshape(out, k // BLOCK, -1)
    scales = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    if type_name == "Q4_0":  # 16 bytes: byte j holds element j (low nibble) and element j + 16 (high)
        qs = blocks[..., 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
        codes = q.astype(np.int8) - np.int8(8)
    else:  # Q8_0: 32 signed bytes
        codes = blocks[..., 2:].copy().view(np.int8)
    if not np.isfinite(scales).all():
        raise CorruptCheckpointError(f"a {type_name} tensor {shape} has non-finite block scales")
    return codes.reshape(out, k), scales


def read_codes(path: Path, quant: QuantConfig, gg: GGUFFile | None = None, *, blocks: bool = False) -> SourceCodes:
    """Every Linear (and, where the table format allows, embedding / LM-head) tensor of `path` whose
    codes fit the export's bits at block 32, in Hugging Face orientation and row order; with `blocks`, every
    Linear of a type MatMulGGUF executes in its GGUF blocks instead. `gg`: `path` already opened."""
    gg = GGUFFile(path) if gg is None else gg
    config = build_config(gg)
    arch = get_arch(config)
    if arch.folds is not None and arch.folds(config).linear:  # no such architecture declares a GGUF layout yet
        raise ExportError(
            f"--gguf-codes keep: {config['model_type']} folds multipliers into its Linear weights at load, so "
            "the file's codes are not the exported weights; use --gguf-codes requantize"
        )
    permuted = layout(gg).permuted_qk
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    linear_bits = quant.method.linear_bits
    table_bits = None
    if quant.enabled and not quant.fp_embeddings and (quant.table_bits == 8 or quant.block == BLOCK):
        table_bits = quant.table_bits
    tensors: dict[str, QuantizedMatrix] = {}
    imported: dict[str, str] = {}
    requantized: dict[str, str] = {}
    for name in gg.tensor_names:
        target, shape = hf_name(name, gg.architecture), gg.shape(name)
        if target is None or len(shape) != 2:
            continue
        type_name = gg.type_name(name)
        role = name.split(".")[-2]
        # Q4_0 into an INT4 export: MatMulQ4's own format holds it exactly (the nibbles reordered, the fp16 scale as
        # it is, 18 bytes a block either way), and MatMulQ4 decodes faster than MatMulGGUF
        as_q4 = type_name == "Q4_0" and linear_bits == 4
        if blocks and name not in _TABLES and type_name in BLOCK_TYPES and not as_q4:
            t = BLOCK_TYPES[type_name]
            raw = check(t, gg.raw(name), shape, name)
            if permuted and role in heads:  # whole rows move: blocks run along the input dimension
                raw = reverse_permute(raw, heads[role])
            tensors[target] = GGUFMatrix(t, np.ascontiguousarray(raw), shape)
            imported[target] = type_name
            continue
        bits = table_bits if name in _TABLES else linear_bits
        if bits is None or CODE_BITS.get(type_name, 99) > bits:
            requantized[target] = type_name
            continue
        codes, scales = decode_blocks(type_name, gg.raw(name), shape)
        if permuted and role in heads:  # whole rows move: blocks run along the input dimension
            codes, scales = reverse_permute(codes, heads[role]), reverse_permute(scales, heads[role])
        tensors[target] = QuantizedMatrix(codes=codes, scales=scales, bits=bits, block=BLOCK)
        imported[target] = type_name
    record = {
        "source": path.name,
        "imported": imported,
        "requantized": requantized,
        "scheme": "GGUF codes and fp16 block scales as stored (scales may be negative), block 32",
    }
    if blocks:
        record["scheme"] = (
            f"Linears in their GGUF blocks as stored (MatMulGGUF, format {BLOCKS_FORMAT}); tables as GGUF codes "
            "and fp16 block scales where the table format holds them exactly"
        )
    return SourceCodes(tensors, record)


def linears_kept(codes: SourceCodes) -> bool:
    """Whether any decoder-layer Linear's codes are imported (not only the embedding table's)."""
    return any(".layers." in name for name in codes.record["imported"])


def declined(reason: str) -> SourceCodes:
    """The manifest's note for a GGUF export that requantizes every tensor."""
    return SourceCodes({}, {"imported": {}, "note": f"GGUF codes not imported: {reason}"})


def summary(codes: SourceCodes) -> str:
    """One progress line."""
    rec = codes.record
    if "note" in rec:
        return rec["note"]
    kinds = sorted(set(rec["imported"].values()))
    return (
        f"importing {len(rec['imported'])} {'/'.join(kinds) or 'no'} tensors' codes from {rec['source']} as they are"
        f"; requantizing {len(rec['requantized'])} ({', '.join(sorted(set(rec['requantized'].values()))) or 'none'})"
    )
