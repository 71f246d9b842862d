"""Weight quantization numerics: symmetric INT8 per-channel and INT4 block-wise codes (RTN, GPTQ), and
asymmetric INT4 blocks (a zero point per block).

A `QuantizedMatrix` is the one integer form of a Linear weight `[out, in]`: signed codes and one
positive scale per block of `block` consecutive input channels (`block == in`: per channel), and for
asymmetric blocks a signed zero offset per block (w = (code - zero) * scale). Both
graph flavors are written from it (MatMulNBits for `ort`, DequantizeLinear for `trt`; see
quant_graph.py), so the two graphs compute with the same dequantized weights, bit for bit.

The rounding rule is ours, not MLAS's: ONNX Runtime's symmetric quantizers
(`quantize_matmul_4bits`, `quantize_qdq_matmul_4bits`) map a block's largest-magnitude value to -8
with a *negative* scale when that value is positive [measured, ORT 1.32]. TensorRT's explicit
quantization is specified with positive scales, so we pick the smallest positive scale whose
[-8, 7] (or [-128, 127]) grid covers the block: `max(max(w) / 7, -min(w) / 8)`. Where the block's
most negative value dominates this is MLAS's rule, exactly so when that scale is fp16-representable
(a test checks it against ORT).
Scales are rounded *up* to fp16-representable values so an fp16 TensorRT graph holds the same
scales as an fp32 CPU graph; codes are computed with the rounded scale.

Asymmetric INT4 (`QuantConfig.asymmetric`, MatMulNBits' zero_points; `ort` flavor with ONNX Runtime's
kernels only: TensorRT 10.3 takes symmetric Q/DQ and MatMulQ4 a fixed zero point of 8): the 16 levels
span [min(w, 0), max(w, 0)] of the block instead of [-8, 7] steps of max|w|, so a block whose values lean
to one side wastes no levels; zero stays exactly representable. Codes and zeros are kept signed
(code - 8, zero - 8), the graph stores both + 8 as MatMulNBits' unsigned nibbles.

GPTQ (Frantar et al. 2023) is implemented here in numpy because ONNX Runtime's copy
(`onnxruntime.quantization.neural_compressor.gptq`) cannot serve: its package imports `onnx_ir`
(not a dependency of ours), it needs a data reader feeding every input of a KV-cache decoder graph,
and its symmetric output is re-quantized by `quant_tensor` onto a different grid than the one GPTQ
optimised. Ours uses the calibration activations of the float64 reference and the grid above.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edge_runtime.errors import ExportError

from .hessian import inverse_cholesky_upper, permute_in_place
from .scratch import OnDisk, Scratch, load, load_rows
from .tables import RowSelection, RowTable

INT4_BLOCKS = (32, 64, 128)
TRT_INT4_BLOCKS = (64, 128)  # TensorRT's INT4 weight-only blocks
ACCURACY_LEVELS = (0, 1, 2, 3, 4)  # MatMulNBits: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8
_FP16_TINY = float(np.finfo(np.float16).smallest_subnormal)


class MatMulKernel(enum.Enum):
    """Whose kernels an ort-flavor quantized graph runs on."""

    MLAS = "mlas"  # ONNX Runtime's own (MatMulNBits, QuickGelu, ...): every platform
    # edge-runtime's ops where they apply (csrc/, x86-64 AVX2): MatMulQ4 for INT4 block-32 products and MatMulQ8
    # for INT8 ones with K % 64 == 0 (same weight bytes; the rest stay MatMulNBits), SiluMul and
    # LinearAttention; faster at decode
    EDGE = "edge"


class QuantMethod(enum.Enum):
    NONE = "none"
    INT8 = "int8"  # every weight INT8, per output channel (or in blocks: QuantConfig.int8_block)
    INT4 = "int4"  # Linear weights INT4 blocks, round to nearest (the baseline)
    INT4_AWQ = "int4-awq"  # activation-aware per-input-channel scales, then round to nearest
    INT4_GPTQ = "int4-gptq"  # GPTQ's error-compensating rounding on calibration activations
    # AWQ's per-input-channel scales folded in first, then GPTQ's rounding of the scaled weights
    INT4_AWQ_GPTQ = "int4-awq-gptq"

    @classmethod
    def parse(cls, text: str) -> QuantMethod:
        try:
            return cls(text)
        except ValueError:
            known = ", ".join(m.value for m in cls)
            raise ExportError(f"unknown quantization method {text!r}; choose one of: {known}") from None

    @property
    def linear_bits(self) -> int | None:
        return {QuantMethod.NONE: None, QuantMethod.INT8: 8}.get(self, 4)

    @property
    def needs_calibration(self) -> bool:
        return self in (QuantMethod.INT4_AWQ, QuantMethod.INT4_GPTQ, QuantMethod.INT4_AWQ_GPTQ)

    @property
    def awq(self) -> bool:
        return self in (QuantMethod.INT4_AWQ, QuantMethod.INT4_AWQ_GPTQ)

    @property
    def gptq(self) -> bool:
        return self in (QuantMethod.INT4_GPTQ, QuantMethod.INT4_AWQ_GPTQ)


class MixedPlan(enum.Enum):
    """Which of an INT4 export's fused Linear groups (per layer: qkv, o, gate_up, down; the `ort` graph runs
    q/k/v and gate/up as one matmul each) stay INT8 per output channel (quant_model.py, docs §6)."""

    NONE = "none"  # every Linear INT4
    # down in the layers where llama.cpp's Q4_K_M gives ffn_down Q6_K (its use_more_bits: the first and last
    # eighth and every third layer between): 14 of SmolLM2-135M's 30 down_projs, 11.7% of its Linear weights
    LLAMA_DOWN = "llama-down"
    # the groups whose INT4 rounding adds the most error to the residual stream per weight, on the
    # calibration inputs, until the Linears average MIXED_CODE_BITS code bits a weight (needs calibration)
    SENSITIVITY = "sensitivity"

    @classmethod
    def parse(cls, text: str) -> MixedPlan:
        try:
            return cls(text)
        except ValueError:
            known = ", ".join(m.value for m in cls)
            raise ExportError(f"unknown mixed-precision plan {text!r}; choose one of: {known}") from None

    @property
    def needs_calibration(self) -> bool:
        return self is MixedPlan.SENSITIVITY


MIXED_CODE_BITS = 4.5  # the sensitivity plan's default budget: average code bits per Linear weight (INT4 4, INT8 8)


@dataclass(frozen=True)
class QuantConfig:
    """How the weights are stored. `block` applies to INT4; INT8 Linears are per output channel unless
    `int8_block` is set."""

    method: QuantMethod = QuantMethod.NONE
    block: int = 32
    fp_embeddings: bool = False  # keep the embedding table / LM head in the float precision
    accuracy_level: int = 4  # MatMulNBits compute type; 4 = int8 activations (the fast CPU path)
    # Embedding table / LM head: INT8 per row, or INT4 in `block`s (half the bytes of the LM head, which
    # a small model reads in full every token; `ort` flavor only: TensorRT 10.3 gathers no INT4 table).
    table_bits: int = 8
    kernel: MatMulKernel = MatMulKernel.MLAS
    asymmetric: bool = False  # INT4 Linear blocks with a zero point each (MatMulNBits; module docstring)
    mixed: MixedPlan = MixedPlan.NONE  # Linear groups kept INT8 per channel in an INT4 export
    mixed_bits: float = MIXED_CODE_BITS  # the sensitivity plan's budget (average Linear code bits, 4 < b <= 8)
    # --quant int8 Linears in blocks of this many input channels (llama.cpp's Q8_0 form at 32) instead of one
    # scale per output channel: less error (docs/benchmarks/quality.md) for 1 bit a weight of fp32 scales (about 0.5
    # more than MatMulNBits' per-channel form, which repeats each scale per 64-128 inputs), and MatMulNBits
    # instead of the faster per-channel MatMulQ8 under --kernel edge. None: per channel.
    int8_block: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.method, QuantMethod):
            raise ExportError(f"quantization method {self.method!r} must be a QuantMethod")
        if self.method.linear_bits == 4 and self.block not in INT4_BLOCKS:
            known = ", ".join(map(str, INT4_BLOCKS))
            raise ExportError(f"INT4 block size {self.block} is not supported; use one of {known} (--block)")
        if self.table_bits not in (4, 8):
            raise ExportError(f"embedding/LM-head bits {self.table_bits} must be 4 or 8 (--table-bits)")
        if self.table_bits == 4 and self.block not in INT4_BLOCKS:
            raise ExportError(f"INT4 block size {self.block} is not supported for the INT4 table (--block)")
        if not isinstance(self.kernel, MatMulKernel):
            raise ExportError(f"matmul kernel {self.kernel!r} must be a MatMulKernel")
        if self.kernel is MatMulKernel.EDGE and self.accuracy_level != 4:
            raise ExportError("the edge MatMulQ4/Q8 kernels compute with int8 activations (accuracy_level 4) only")
        if self.accuracy_level not in ACCURACY_LEVELS:
            raise ExportError(f"MatMulNBits accuracy_level {self.accuracy_level} must be one of {ACCURACY_LEVELS}")
        if not isinstance(self.mixed, MixedPlan):
            raise ExportError(f"mixed-precision plan {self.mixed!r} must be a MixedPlan")
        if self.mixed is not MixedPlan.NONE and self.method.linear_bits != 4:
            raise ExportError(
                f"--mixed {self.mixed.value} keeps some INT4 Linears at INT8; it needs --quant int4, int4-awq or "
                f"int4-gptq, not {self.method.value}"
            )

        if self.asymmetric and self.method.linear_bits != 4:
            raise ExportError(f"asymmetric blocks apply to INT4 Linears; --quant {self.method.value} has none")
        if self.asymmetric and self.kernel is MatMulKernel.EDGE:
            raise ExportError("asymmetric INT4 needs --kernel mlas: MatMulQ4 computes with a fixed zero point of 8")
        if self.int8_block is not None:
            if self.method is not QuantMethod.INT8:
                raise ExportError(f"INT8 blocks apply to --quant int8, not {self.method.value}")
            if self.int8_block not in INT4_BLOCKS:
                known = ", ".join(map(str, INT4_BLOCKS))
                raise ExportError(f"INT8 block size {self.int8_block} is not supported; use one of {known} (--block)")
        bits = self.mixed_bits
        if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not 4 < bits <= 8:
            raise ExportError(f"mixed-precision budget {bits!r} must be average code bits in (4, 8], e.g. 4.5")

    @property
    def enabled(self) -> bool:
        return self.method is not QuantMethod.NONE

    @property
    def needs_calibration(self) -> bool:
        return self.method.needs_calibration or self.mixed.needs_calibration


class QuantizedMatrix:
    """Integer form of a Linear weight `[out, in]`: `w ~= codes * scales` block-wise along `in`.

    INT4 codes are held two to a byte while the export carries them (an 8B model's are 3.5 GB
    packed, 7 GB as int8) and unpacked when read; codes outside [-8, 7] (a sign-flipped GGUF block) stay int8.
    `spill` moves codes, scales and zero points to a Scratch file, read back on each use."""

    __slots__ = ("_cols", "_scales", "_stored", "_zeros", "bits", "block")

    def __init__(self, codes: np.ndarray, scales: np.ndarray, bits: int, block: int, zeros: np.ndarray | None = None):
        self._scales: np.ndarray | OnDisk = scales  # float32 [out, in // block], positive, fp16-representable
        self.bits = bits
        self.block = block  # input channels per scale; == in for per-channel
        self._zeros: np.ndarray | OnDisk | None = zeros  # int8 [out, in // block] in the codes' range; None: 0
        self._cols = codes.shape[1]
        self._stored: np.ndarray | OnDisk = _pack_nibbles(codes) if bits == 4 and _fits_nibbles(codes) else codes

    @property
    def scales(self) -> np.ndarray:
        return load(self._scales)

    @property
    def zeros(self) -> np.ndarray | None:
        return load(self._zeros)

    def spill(self, scratch: Scratch) -> None:
        """Hold nothing but where the arrays went (a spilled matrix reads its file on every use, only the
        rows asked for where a part is asked for: codes_rows, dequantize_rows)."""
        if not isinstance(self._stored, OnDisk):
            self._stored, self._scales = scratch.put(self._stored), scratch.put(self._scales)
            self._zeros = None if self._zeros is None else scratch.put(self._zeros)

    @property
    def codes(self) -> np.ndarray:
        """int8 [out, in], in [-2^(bits-1), 2^(bits-1) - 1]: a new array where they are held packed."""
        return self.codes_rows(slice(None))

    def codes_rows(self, rows: slice) -> np.ndarray:
        """int8 [n, in] of a slice of output rows: a table's codes a part at a time (a 128k-vocabulary
        table's are 0.26 GB as int8, and its consumers widen them further)."""
        stored = load_rows(self._stored, rows)
        if stored.shape[1] == self._cols and stored.dtype == np.int8:
            return stored
        return _unpack_nibbles(stored, self._cols)

    @property
    def shape(self) -> tuple[int, int]:
        return (self._stored.shape[0], self._cols)

    @property
    def per_channel(self) -> bool:
        return self.block == self._cols

    def dequantize(self) -> np.ndarray:
        """float32 [out, in]; exact (a <= 8-bit code times an fp16 scale fits fp32's mantissa)."""
        return self.dequantize_rows(slice(None))

    def dequantize_rows(self, rows: slice | np.ndarray) -> np.ndarray:
        """float32 [n, in] of the selected output rows (a slice or integer indices), as dequantize() has them."""
        codes = self.codes_rows(rows)
        n, k = codes.shape
        blocks = codes.reshape(n, k // self.block, self.block).astype(np.float32)
        if self._zeros is not None:  # code - zero is an integer of <= bits + 1 bits: still exact
            blocks -= load_rows(self._zeros, rows)[:, :, None]
        blocks *= load_rows(self._scales, rows)[:, :, None]  # in place: no second copy of a large table
        return blocks.reshape(n, k)

    def storage_bytes(self, scale_bytes: int = 4) -> int:
        scales = int(np.prod(self._scales.shape))
        zeros = 0 if self._zeros is None else int(np.prod(self._zeros.shape)) * self.bits // 8
        return self.shape[0] * self._cols * self.bits // 8 + scales * scale_bytes + zeros

    def held_bytes(self) -> int:
        """What this form occupies in the exporter's memory (nothing once spilled)."""
        parts = (self._stored, self._scales, self._zeros)
        return sum(a.nbytes for a in parts if isinstance(a, np.ndarray))


class QuantizedTable(RowTable):
    """What ModelWeights holds for a quantized matrix (a Linear, the embedding table, the LM head): a
    RowTable (tables.py) carrying its integer form in `.qm` (an 8B layer's Linears are 0.9 GB
    and a 128k-vocabulary table 1-2 GB as float32). The graph builder reads `.qm` (QuantizedModel.lookup);
    the reference reads rows and logit blocks dequantized from it."""

    qm: QuantizedMatrix | None

    def __new__(cls, qm: QuantizedMatrix) -> QuantizedTable:
        obj = super().__new__(cls, qm.shape)
        obj.qm = qm
        return obj

    def __array_finalize__(self, obj: object) -> None:
        self.qm = None  # a view numpy made (`.T` of a square matrix keeps its shape) is not these rows

    def rows(self, sel: RowSelection) -> np.ndarray:
        if self.qm is None:
            raise TypeError("a view of a QuantizedTable holds no rows")
        return self.qm.dequantize_rows(sel)


def _fits_nibbles(codes: np.ndarray) -> bool:
    return codes.dtype == np.int8 and codes.ndim == 2 and bool(codes.min(initial=0) >= -8 and codes.max(initial=0) <= 7)


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """int8 [out, k] in [-8, 7] -> uint8 [out, ceil(k / 2)]: column 2j in the low nibble, 2j + 1 in the high."""
    u = codes.astype(np.uint8) & 0x0F
    if u.shape[1] % 2:
        u = np.pad(u, ((0, 0), (0, 1)))
    return u[:, 0::2] | (u[:, 1::2] << 4)


def _unpack_nibbles(packed: np.ndarray, cols: int) -> np.ndarray:
    out = np.empty((packed.shape[0], 2 * packed.shape[1]), np.int8)
    out[:, 0::2] = (packed & 0x0F).view(np.int8)
    out[:, 1::2] = (packed >> 4).view(np.int8)
    out = ((out ^ 8) - 8).astype(np.int8)  # sign-extend the 4-bit values
    return out[:, :cols]


def check_block(name: str, w: np.ndarray, block: int, bits: int = 4) -> None:
    if w.shape[1] % block:
        fits = [b for b in INT4_BLOCKS if w.shape[1] % b == 0]
        fallback = "export with --quant int8" if bits == 4 else "drop --block (INT8 per channel)"
        hint = f"use --block {fits[-1]}" if fits else f"no supported block divides it; {fallback}"
        raise ExportError(
            f"INT{bits} block size {block} does not divide the input dimension {w.shape[1]} of '{name}' "
            f"{tuple(w.shape)}; {hint}"
        )


def block_scales(w: np.ndarray, bits: int) -> np.ndarray:
    """Positive, fp16-representable scales for groups `w [..., block]` (the last axis is one block)."""
    qmax = 2 ** (bits - 1) - 1
    w = w.astype(np.float64)
    return _fp16_up(np.maximum(w.max(axis=-1) / qmax, -w.min(axis=-1) / (qmax + 1)), w)


def block_scales_asym(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Asymmetric (scales, zeros) for groups `w [..., block]`: 2^bits levels over [min(w, 0), max(w, 0)],
    zeros signed like the codes (the level of 0.0, minus 2^(bits-1))."""
    levels = 2**bits - 1
    w = w.astype(np.float64)
    lo, hi = np.minimum(w.min(axis=-1), 0.0), np.maximum(w.max(axis=-1), 0.0)
    s = _fp16_up((hi - lo) / levels, w)
    zeros = np.clip(np.rint(-lo / s.astype(np.float64)), 0, levels) - 2 ** (bits - 1)
    return s, zeros.astype(np.int8)


def _fp16_up(s: np.ndarray, w: np.ndarray) -> np.ndarray:
    s = np.maximum(s, _FP16_TINY)  # an all-zero block still gets a valid (non-zero) scale
    s16 = s.astype(np.float16)
    low = s16.astype(np.float64) < s  # round up so the grid still covers the block
    s16[low] = np.nextafter(s16[low], np.float16(np.inf))
    if not np.isfinite(s16).all():
        raise ExportError(f"weights too large for fp16 quantization scales (max |w| {np.abs(w).max():.3g})")
    return s16.astype(np.float32)


def round_codes(w: np.ndarray, scales: np.ndarray, bits: int, zeros: np.ndarray | None = None) -> np.ndarray:
    qmax = 2 ** (bits - 1) - 1
    q = np.rint(w / scales)
    return np.clip(q if zeros is None else q + zeros, -qmax - 1, qmax).astype(np.int8)


# Rows rounded at a time by quantize_rtn: rows are independent, and a whole embedding table at once (263M
# values on a 1B model) would make float64 temporaries of several GB.
RTN_CHUNK_ELEMENTS = 1 << 22


def quantize_rtn(w: np.ndarray, bits: int, block: int | None = None, asymmetric: bool = False) -> QuantizedMatrix:
    """Round to nearest: INT4 blocks of `block`, or (block None) INT8/INT4 per output channel. Rows are
    rounded independently, so `w` is read a part of the rows at a time (a RowTable's from its file) into
    preallocated codes: no float64 copy of a 128k-vocabulary table, nor its parts' codes concatenated."""
    out, k = w.shape
    block = k if block is None else block
    step = max(1, RTN_CHUNK_ELEMENTS // max(k, 1))
    codes = np.empty((out, k), np.int8)
    scales = np.empty((out, k // block), np.float32)
    zeros = np.empty((out, k // block), np.int8) if asymmetric else None
    for r in range(0, out, step):
        part = slice(r, min(r + step, out))
        codes[part], scales[part], z = _rtn_rows(w[part], bits, block, asymmetric)
        if zeros is not None:
            zeros[part] = z
    return QuantizedMatrix(codes=codes, scales=scales, bits=bits, block=block, zeros=zeros)


def _rtn_rows(
    w: np.ndarray, bits: int, block: int, asymmetric: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(codes [n, k], scales [n, k // block], zero points or None) of some rows."""
    n, k = w.shape
    groups = np.asarray(w, dtype=np.float64).reshape(n, k // block, block)
    if asymmetric:
        scales, zeros = block_scales_asym(groups, bits)
        codes = round_codes(groups, scales[:, :, None].astype(np.float64), bits, zeros[:, :, None])
        return codes.reshape(n, k), scales, zeros
    scales = block_scales(groups, bits)
    return round_codes(groups, scales[:, :, None].astype(np.float64), bits).reshape(n, k), scales, None


GPTQ_ROWS = 2048  # output rows a batch of GPTQ's column steps updates at a time (gptq_rows)
GPTQ_STEP = 32  # columns whose errors reach each other one by one, within a batch of 128 (gptq_rows)


def gptq(
    w: np.ndarray,
    hessian: np.ndarray,
    bits: int,
    block: int,
    damp: float = 0.01,
    act_order: bool = False,
    asymmetric: bool = False,
) -> QuantizedMatrix:
    """GPTQ: quantize input columns one at a time, spreading each column's rounding error over the
    columns not yet quantized through the inverse Hessian `H = X^T X` of the calibration inputs
    (dampened by `damp` times its mean diagonal).

    In input order, each block's scale is taken from the *updated* weights when its first column is
    reached. With `act_order` the columns go in order of decreasing H[j, j] (the most active inputs
    first, while the most columns are left to absorb their error) and every block's scale is fixed
    beforehand from the original weights ("static groups"), since a block's columns are then spread
    over the whole order. Lazy batches of 128 columns keep the updates matrix-sized. `asymmetric`: each
    block's grid has a zero point too (block_scales_asym), fixed where its scale is.
    """
    return gptq_rows([w], hessian, bits, block, damp, act_order, asymmetric)[0]


def gptq_rows(
    ws: Sequence[np.ndarray],
    hessian: np.ndarray,
    bits: int,
    block: int,
    damp: float = 0.01,
    act_order: bool = False,
    asymmetric: bool = False,
    *,
    overwrite_hessian: bool = False,
) -> list[QuantizedMatrix]:
    """gptq() of several weights that read the same inputs (q, k and v; gate and up) as one: GPTQ treats
    each output row on its own given H, so stacking the rows gives each weight its own result, for one
    factorisation of H and one pass over the columns instead of one per weight (a Llama layer's 7
    become 4). The columns are walked in a transposed copy W^T [K, out], so each step reads and updates
    contiguous rows. `overwrite_hessian`: `hessian` (float64) may be used as scratch, saving a K x K copy
    (0.5 GB at K = 8192)."""
    sizes = [w.shape[0] for w in ws]
    out, k = sum(sizes), ws[0].shape[1]
    WT = np.empty((k, out), np.float64)  # one input column of every output row per row
    r = 0
    for w in ws:
        WT[:, r : r + w.shape[0]] = np.asarray(w).T
        r += w.shape[0]
    H = np.asarray(hessian, np.float64) if overwrite_hessian else np.array(hessian, np.float64)
    # K x K float64 arrays are 0.5 GB each at K = 8192 (a 1B model's down_proj): drop each as soon as it is
    # used up (a caller that passes its Hessian inline frees it here too)
    del hessian
    dead = np.diag(H) == 0  # channels never active in calibration: nothing to compensate with
    H[dead, dead] = 1.0
    WT[dead, :] = 0.0
    scalesT = np.zeros((k // block, out), np.float32)
    zerosT = np.zeros((k // block, out), np.int8)

    def grid(wb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # wb [..., block]
        if asymmetric:
            return block_scales_asym(wb, bits)
        return block_scales(wb, bits), np.zeros(wb.shape[:-1], np.int8)

    if act_order:
        sc, zc = grid(WT.T.reshape(out, k // block, block))
        scalesT, zerosT = np.ascontiguousarray(sc.T), np.ascontiguousarray(zc.T)
        perm = np.argsort(-np.diag(H), kind="stable")
        WT = WT[perm]
    else:
        perm = np.arange(k)
    # H in the column order, reversed for inverse_cholesky_upper, factorised and inverted where it lies: at
    # K = 8192 each K x K copy is 0.5 GB, and a 1B model's down_proj peaked with three of them beside its Grams
    permute_in_place(H, perm[::-1])
    H[np.diag_indices(k)] += damp * np.mean(np.diag(H))
    try:
        Hinv = inverse_cholesky_upper(H)  # a reversed view of H's memory
        del H
    except np.linalg.LinAlgError as e:
        raise ExportError(f"GPTQ: calibration Hessian of a [{out}, {k}] weight is not positive definite ({e})") from e

    codesT = np.zeros((k, out), np.int8)
    lazy = max(128, block)
    for i1 in range(0, k, lazy):
        i2 = min(i1 + lazy, k)
        err = np.zeros((i2 - i1, out))
        panel = np.ascontiguousarray(Hinv[i1:i2, i1:])  # the batch's rows of Hinv (a reversed view)
        Hinv1 = panel[:, : i2 - i1]
        # A batch's column steps a slice of output rows at a time, so the rows they update stay in cache
        # (a 1B model's fused gate/up batch is 16 MB of float64; GPTQ_ROWS rows of it 2 MB)
        for r1 in range(0, out, GPTQ_ROWS):
            rows = slice(r1, min(r1 + GPTQ_ROWS, out))
            W1 = WT[i1:i2, rows].copy()
            # and within the batch, the same once more: a column's error reaches the rest of its group of
            # GPTQ_STEP columns one outer product at a time, the batch's later columns by one product a group
            # (each weight gets the same updates; the elementwise ones were most of a 1B model's gate/up time)
            for j1 in range(0, i2 - i1, GPTQ_STEP):
                j2 = min(j1 + GPTQ_STEP, i2 - i1)
                for i in range(j1, j2):
                    col = i1 + i
                    if act_order:  # the static grid of the block this column came from
                        g = perm[col] // block
                        s, z = scalesT[g, rows].astype(np.float64), zerosT[g, rows].astype(np.float64)
                    elif col % block == 0:
                        sb, zb = grid(W1[i : i + block].T)
                        scalesT[col // block, rows], zerosT[col // block, rows] = sb, zb
                        s, z = sb.astype(np.float64), zb.astype(np.float64)
                    q = round_codes(W1[i], s, bits, z)
                    codesT[perm[col], rows] = q
                    e = (W1[i] - (q - z) * s) / Hinv1[i, i]
                    W1[i:j2] -= np.outer(Hinv1[i, i:j2], e)
                    err[i, rows] = e
                W1[j2:] -= Hinv1[j1:j2, j2:].T @ err[j1:j2, rows]
        WT[i2:] -= panel[:, i2 - i1 :].T @ err
    parts, r = [], 0
    for n in sizes:
        part = slice(r, r + n)
        zeros = np.ascontiguousarray(zerosT[:, part].T) if asymmetric else None
        parts.append(QuantizedMatrix(np.ascontiguousarray(codesT[:, part].T), np.ascontiguousarray(scalesT[:, part].T),
                                     bits, block, zeros))  # fmt: skip
        r += n
    return parts


def table_error(qm: QuantizedMatrix, exact: np.ndarray) -> tuple[float, bool]:
    """relative_error(qm.dequantize(), exact) and whether they are equal, a chunk of rows at a time: a
    table is never dequantized whole."""
    rows = max(1, RTN_CHUNK_ELEMENTS // max(exact.shape[1], 1))
    num = den = 0.0
    equal = True
    for r in range(0, exact.shape[0], rows):
        deq, ex = qm.dequantize_rows(slice(r, r + rows)), np.asarray(exact[r : r + rows])
        equal = equal and np.array_equal(deq, ex)
        ec = ex.astype(np.float64)
        num += float(np.sum(np.square(deq.astype(np.float64) - ec)))
        den += float(np.sum(np.square(ec)))
    return (math.sqrt(num / den) if den else 0.0), equal


def relative_error(approx: np.ndarray, exact: np.ndarray) -> float:
    """Relative Frobenius error ||approx - exact|| / ||exact||, summed in float64 a chunk of rows at a time."""
    a, e = np.asarray(approx).reshape(len(approx), -1), np.asarray(exact).reshape(len(exact), -1)
    rows = max(1, RTN_CHUNK_ELEMENTS // max(e.shape[1], 1))
    num = den = 0.0
    for r in range(0, e.shape[0], rows):
        ec = e[r : r + rows].astype(np.float64)
        num += float(np.sum(np.square(a[r : r + rows].astype(np.float64) - ec)))
        den += float(np.sum(np.square(ec)))
    return math.sqrt(num / den) if den else 0.0
