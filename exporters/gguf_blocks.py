"""GGUF weight blocks as a bundle stores them: llama.cpp's bytes, unchanged, rows in Hugging Face order.

    BLOCK_TYPES["Q4_K"]                       # elements and bytes a block, its code bits
    check(t, raw, (out, k), name)             # one-line CorruptCheckpointError for a truncated or lying tensor
    w = dequantize(t, raw, (out, k))          # float32 [out, k], gguf.quants.dequantize's value bit for bit
    GGUFMatrix(t, raw, (out, k))              # a Linear's weight as the export carries it (quant_model.py)

The `MatMulGGUF` op (csrc/ggml_blocks.h) runs these bytes; the reference and the validation of an export read
them through `dequantize`, which forms every product in float32 in the order gguf-py does (an fp16 scale times
a small integer is exact in float32; the one rounding is where gguf-py has it), so the weights the bundle is
checked against are the weights llama.cpp computes with. docs/guides/gguf-blocks.md draws the bit layouts.
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


def _f16(b: np.ndarray) -> np.ndarray:
    return b.copy().view(np.float16).astype(np.float32)


def _nibbles16(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32] codes: element e < 16 in byte e's low nibble, e >= 16 in byte e - 16's high."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits32(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes (a little-endian 32-bit mask) -> [n, 32] of element e's bit e."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 scale bytes -> (sc, mn) [n, 8], 6 bits each (llama.cpp's get_scale_min_k4)."""
    s = s.astype(np.uint8)
    lo, mid, top = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 63, (top & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (top >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


def _blocks(t: BlockType, b: np.ndarray) -> np.ndarray:
    """[n, bytes] blocks of type t -> [n, elements] float32 weights."""
    n = b.shape[0]
    if t.name == "Q8_0":
        return _f16(b[:, 0:2]) * b[:, 2:].copy().view(np.int8).astype(np.float32)
    if t.name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        mins = t.name.endswith("_1")
        d = _f16(b[:, 0:2])
        at = 4 if mins else 2
        q = _nibbles16(b[:, at + (4 if t.bits == 5 else 0) :])
        if t.bits == 5:
            q = q | (_bits32(b[:, at : at + 4]) << 4)
        if mins:
            return d * q.astype(np.float32) + _f16(b[:, 2:4])
        return d * (q.astype(np.float32) - 2.0 ** (t.bits - 1))
    if t.name == "Q6_K":
        ql, qh = b[:, 0:128].reshape(n, 2, 64), b[:, 128:192].reshape(n, 2, 32)
        s6 = b[:, 192:208].copy().view(np.int8).astype(np.float32)
        d = _f16(b[:, 208:210])
        # per half of 128: chunks c = 0..3 of 32; low bits from ql[(c % 2) * 32 + l] nibble c // 2, high from
        # qh[l] bits 2c, 2c + 1
        lo = np.stack([ql[:, :, 0:32] & 0x0F, ql[:, :, 32:64] & 0x0F, ql[:, :, 0:32] >> 4, ql[:, :, 32:64] >> 4], 2)
        hi = np.stack([(qh >> (2 * c)) & 3 for c in range(4)], 2)
        q = ((lo | (hi << 4)).astype(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(np.float32)
        return ((d * s6)[:, :, None] * q).reshape(n, 256)
    # Q4_K, Q5_K: d | dmin | scales [12] | (Q5_K: qh [32]) | qs [128]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    qs = b[:, 16:144] if t.name == "Q4_K" else b[:, 48:176]
    qs = qs.reshape(n, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], 2).reshape(n, 8, 32)
    if t.name == "Q5_K":
        qh = b[:, 16:48]
        q = q | (np.stack([(qh >> j) & 1 for j in range(8)], 1) << 4)
    scale = (d * sc.astype(np.float32))[:, :, None]
    shift = (dmin * mn.astype(np.float32))[:, :, None]
    return (scale * q.astype(np.float32) - shift).reshape(n, 256)


DEQUANTIZE_PART_BLOCKS = 1 << 16  # blocks dequantized at once (16M float32 weights at most for K-quants)


def dequantize(t: BlockType, raw: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """float32 [out, k] of a tensor's checked bytes (`check`), a part of the blocks at a time."""
    out, k = shape
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, t.bytes)
    w = np.empty((blocks.shape[0], t.elements), np.float32)
    for i in range(0, blocks.shape[0], DEQUANTIZE_PART_BLOCKS):
        w[i : i + DEQUANTIZE_PART_BLOCKS] = _blocks(t, blocks[i : i + DEQUANTIZE_PART_BLOCKS])
    return w.reshape(out, k)


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
