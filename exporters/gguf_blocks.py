"""GGUF weight blocks as a bundle stores them: llama.cpp's bytes, unchanged, rows in Hugging Face order.

    BLOCK_TYPES["Q4_K"]                       # elements and bytes a block, its code bits
    check(t, raw, (out, k), name)             # one-line CorruptCheckpointError for a truncated or lying tensor
    w = dequantize(t, raw, (out, k))          # float32 [out, k], through gguf.quants.dequantize
    GGUFMatrix(t, raw, (out, k))              # a Linear's weight as the export carries it (quant_model.py)

The `MatMulGGUF` op (csrc/ggml_blocks.h) runs these bytes; the reference and the validation of an export read
them through gguf-py's dequantizer, so the weights the bundle is checked against are the weights llama.cpp
computes with; the op's own reading of them (its fp32_compute mode) is tested against that bit for bit.
docs/guides/gguf-blocks.md draws the bit layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_runtime.errors import CorruptCheckpointError

from .scratch import OnDisk, Scratch, load_rows


@dataclass(frozen=True)
class BlockType:
    name: str
    ggml_id: int  # ggml_type, the op's `type` attribute
    elements: int  # weights a block
    bytes: int  # bytes a block
    bits: int  # bits a code

    def row_bytes(self, k: int) -> int:
        return k // self.elements * self.bytes


BLOCK_TYPES = {
    t.name: t
    for t in (
        BlockType("Q4_0", 2, 32, 18, 4),
        BlockType("Q4_1", 3, 32, 20, 4),
        BlockType("Q5_0", 6, 32, 22, 5),
        BlockType("Q5_1", 7, 32, 24, 5),
        BlockType("Q8_0", 8, 32, 34, 8),
        BlockType("Q4_K", 12, 256, 144, 4),
        BlockType("Q5_K", 13, 256, 176, 5),
        BlockType("Q6_K", 14, 256, 210, 6),
    )
}


def check(t: BlockType, raw: np.ndarray, shape: tuple[int, int], name: str) -> np.ndarray:
    """`raw` as uint8 [out, row bytes], or a one-line refusal: a row that is not whole blocks, bytes that are
    not the shape's, or a non-finite block scale (inf or NaN weights would reach every logit)."""
    out, k = shape
    if k % t.elements:
        raise CorruptCheckpointError(f"{name}: {t.name} rows of {k} are not whole blocks of {t.elements}")
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    want = out * t.row_bytes(k)
    if data.size != want:
        raise CorruptCheckpointError(
            f"{name}: {data.size} bytes where {out} x {k} {t.name} weights take {want} (truncated or mislabelled)"
        )
    blocks = data.reshape(-1, t.bytes)
    for label, at in _SCALE_BYTES[t.name]:
        d = blocks[:, at : at + 2].copy().view(np.float16)
        if not np.isfinite(d).all():
            raise CorruptCheckpointError(f"{name}: a {t.name} block's {label} is not finite")
    return data.reshape(out, t.row_bytes(k))


# Where each type's fp16 scales lie in a block (checked finite by `check`).
_SCALE_BYTES = {
    "Q4_0": (("d", 0),),
    "Q4_1": (("d", 0), ("m", 2)),
    "Q5_0": (("d", 0),),
    "Q5_1": (("d", 0), ("m", 2)),
    "Q8_0": (("d", 0),),
    "Q4_K": (("d", 0), ("dmin", 2)),
    "Q5_K": (("d", 0), ("dmin", 2)),
    "Q6_K": (("d", 208),),
}


DEQUANTIZE_PART_ROWS = 4096  # rows dequantized at once (gguf-py widens a tensor whole)


def dequantize(t: BlockType, raw: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """float32 [out, k] of a tensor's checked bytes (`check`): gguf-py's own dequantizer, the one the GGUF reader
    converts every tensor with, a part of the rows at a time."""
    from .gguf_reader import _import_gguf

    quants = _import_gguf().quants
    qtype = quants.GGMLQuantizationType[t.name]
    rows = np.ascontiguousarray(raw).view(np.uint8).reshape(shape[0], -1)
    w = np.empty(shape, np.float32)
    for r in range(0, shape[0], DEQUANTIZE_PART_ROWS):
        w[r : r + DEQUANTIZE_PART_ROWS] = quants.dequantize(rows[r : r + DEQUANTIZE_PART_ROWS], qtype)
    return w


class GGUFMatrix:
    """A Linear weight `[out, in]` kept in its GGUF blocks: where a QuantizedMatrix (quant.py) would be, with the
    same reading side (shape, dequantize_rows, spill), so the reference, the records and the graph builder take
    either. Its rows are whole: blocks run along `in`, so reordering rows (GGUF's Q/K permutation) moves bytes."""

    __slots__ = ("_raw", "_shape", "type")

    zeros = None  # no separate zero points (a block carries its own minimum)
    per_channel = False

    def __init__(self, t: BlockType, raw: np.ndarray, shape: tuple[int, int]):
        self.type = t
        self._shape = shape
        self._raw: np.ndarray | OnDisk = raw  # uint8 [out, row bytes], `check`ed

    @property
    def bits(self) -> int:
        return self.type.bits

    @property
    def block(self) -> int:
        return self.type.elements

    @property
    def shape(self) -> tuple[int, int]:
        return self._shape

    @property
    def nbytes(self) -> int:
        return self._shape[0] * self.type.row_bytes(self._shape[1])

    def raw_rows(self, rows: slice | np.ndarray) -> np.ndarray:
        """uint8 [n, row bytes] of the selected rows, as stored."""
        return load_rows(self._raw, rows)

    def spill(self, scratch: Scratch) -> None:
        if not isinstance(self._raw, OnDisk):
            self._raw = scratch.put(self._raw)

    def dequantize(self) -> np.ndarray:
        return self.dequantize_rows(slice(None))

    def dequantize_rows(self, rows: slice | np.ndarray) -> np.ndarray:
        raw = self.raw_rows(rows)
        return dequantize(self.type, raw, (raw.shape[0], self._shape[1]))
