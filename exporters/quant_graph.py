"""Quantized weight formats for the graph builder: drop-in replacements for `blocks.FloatWeights`.

Both write the same `QuantizedMatrix` codes and scales (docs/architecture.md §5, §6):

  ort flavor (ONNX Runtime CPU), codes + 2^(bits-1) as unsigned, no zero points (symmetric), or with
  asymmetric INT4 blocks their zeros + 8 as MatMulNBits' zero_points (two nibbles a byte, block 0 low):
    x ─► com.microsoft::MatMulNBits(B [N, k_blocks, blob], scales [N, k_blocks][, zp], accuracy_level) ─► y
    ids ─► com.microsoft::GatherBlockQuantized(the same B, scales [V, k_blocks, 1]) ─► [1, T, k_blocks, blk]
        ─► Reshape [1, T, H]                        (the tied table is stored once, read by both ops)
    an INT8 block-32 table of fp16 scales (a GGUF's Q8_0) with --kernel edge: stored once as Q8_0 rows,
    ids ─► ai.edge_runtime::GatherGGUF(rows, type=Q8_0) ─► [1, T, H];  x ─► MatMulGGUF(the same rows) ─► logits

  ort flavor with --kernel edge: products whose K is a multiple of 64 run edge-runtime's own ops on the
  same B (csrc/, x86-64 AVX2 or AVX-512 VNNI; activations int8 in blocks of 32, as accuracy_level 4):
    INT4 block 32:    x ─► ai.edge_runtime::MatMulQ4(B [N, K/32, 16], scales float16 [N, K/32]) ─► y
    INT8 per channel: x ─► ai.edge_runtime::MatMulQ8(B [N, K/blk, blk], scales float [N])      ─► y
    GGUF blocks:      x ─► ai.edge_runtime::MatMulGGUF(B uint8 [N, row bytes], type=ggml type) ─► y
                      (a Linear kept as the GGUF stores it: gguf_blocks.py; fused parts of different types
                      are one node each, concatenated; in the accuracy_level 0 twin with fp32_compute=1)

  trt flavor (TensorRT 10.3: standard domain, opset 21; scales in the activation dtype):
    INT4 codes [K, N] ─► DequantizeLinear(scales [K/blk, N], axis 0, block_size blk) ─► MatMul
    INT8 codes [K, N] ─► DequantizeLinear(scales [N], axis 1)  (per channel)     ─► MatMul
    INT8 table [V, H] ─► DequantizeLinear(scales [V], axis 0) ─► Gather (embedding) / Gemm transB (LM head)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edge_runtime.errors import ExportError
from edge_runtime.kernels import DOMAIN as EDGE_DOMAIN
from edge_runtime.kernels import GATHER_GGUF, MATMUL_GGUF, MATMUL_Q4, MATMUL_Q8

from .blocks import FloatWeights, WeightFormat, concat_biases
from .blocks_ort import Q8_ROW_EXTRA
from .gguf_blocks import GGUFMatrix
from .graph import GraphBuilder
from .quant import MatMulKernel, QuantizedMatrix
from .quant_model import QuantizedModel

MS_DOMAIN = "com.microsoft"
NBITS_BLOCKS = (128, 64, 32, 16)  # MatMulNBits: a power of two >= 16


def edge_matmul(bits: int, per_channel: bool, block: int, k: int) -> str | None:
    """The op --kernel edge computes this product with: MatMulQ4 (INT4 blocks of 32), MatMulQ8 (INT8 per
    output channel, what --quant int8 and the INT8 tables write), or None for MatMulNBits."""
    if k % 64:
        return None
    if bits == 4 and block == 32 and not per_channel:
        return MATMUL_Q4
    return MATMUL_Q8 if bits == 8 and per_channel else None


def nbits_block(qm: QuantizedMatrix, name: str) -> int:
    """MatMulNBits' block for `qm`: its own, or for per-channel codes the largest power of two
    dividing K (the per-channel scale is repeated over the row's blocks, which is exact)."""
    if not qm.per_channel:
        return qm.block
    k = qm.shape[1]
    for b in NBITS_BLOCKS:
        if k % b == 0:
            return b
    raise ExportError(
        f"'{name}': input dimension {k} is not a multiple of 16, which MatMulNBits needs; "
        f"export it with --flavor trt or without quantization"
    )


def pack_zero_points(qm: QuantizedMatrix) -> np.ndarray | None:
    """MatMulNBits' 4-bit zero_points, uint8 [N, ceil(k_blocks / 2)] (the first block in the low nibble),
    or None for symmetric codes (MatMulNBits' default zero point 2^(bits-1))."""
    if qm.zeros is None:
        return None
    if qm.bits != 4:
        raise ValueError("zero points are written for INT4 blocks only")  # QuantConfig allows no other
    u = (qm.zeros.astype(np.int16) + 8).astype(np.uint8)
    if u.shape[1] % 2:
        u = np.pad(u, ((0, 0), (0, 1)), constant_values=8)
    return np.ascontiguousarray(u[:, 0::2] | (u[:, 1::2] << 4))


PACK_PART_ELEMENTS = 1 << 24  # codes widened at once by pack_nbits (64 MB as int16 temporaries)


def pack_nbits(qm: QuantizedMatrix, name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(B uint8 [N, k_blocks, blob], scales float32 [N, k_blocks], block) in MatMulNBits' layout."""
    n, k = qm.shape
    blk = nbits_block(qm, name)
    b = np.empty((n, k * qm.bits // 8), np.uint8)
    # A part of the rows at a time: widening a 128k-vocabulary table's codes whole took 1.2 GB.
    step = max(1, PACK_PART_ELEMENTS // k)
    for r in range(0, n, step):
        rows = slice(r, min(r + step, n))
        u = (qm.codes_rows(rows).astype(np.int16) + 2 ** (qm.bits - 1)).astype(np.uint8)  # zero point 2^(bits-1)
        b[rows] = u[:, 0::2] | (u[:, 1::2] << 4) if qm.bits == 4 else u  # first of a pair in the low nibble
    scales = np.repeat(qm.scales, k // blk, axis=1) if qm.per_channel else qm.scales
    return b.reshape(n, k // blk, blk * qm.bits // 8), scales.astype(np.float32), blk


def int4_tensor(name: str, codes: np.ndarray) -> TensorProto:
    """ONNX INT4 initializer: row-major, two values per byte, the first in the low nibble."""
    flat = codes.reshape(-1).astype(np.int16) & 0xF
    if flat.size % 2:
        flat = np.append(flat, 0)
    raw = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8).tobytes()
    return helper.make_tensor(name, TensorProto.INT4, list(codes.shape), raw, raw=True)


def _bias(g: GraphBuilder, prefix: str, y: str, bias: np.ndarray | None) -> str:
    return y if bias is None else g.op("Add", [y, g.const(bias.astype(g.dtype))], f"{prefix}/BiasAdd")


# Rows of a quantized table one MatMulNBits at accuracy_level 0 multiplies (matmul_table): 128 MB of float32
# at hidden size 2048, against 1 GB for a 128k-vocabulary head in one node.
FP32_TABLE_PART_ROWS = 16384
# The largest LM head the twin holds as float32 instead (NBitsWeights._float_head). Its session then peaks at
# about two float32 copies (the mapped initializer while ONNX Runtime prepacks it, and the packed one: with
# SmolLM2's 113 MB head validation peaks 118 MiB above MatMulNBits' temporaries, memory_plan.TWIN_HEAD_COPIES);
# larger heads (a 1B model's 1 GB) keep the parts above.
FP32_HEAD_MAX_BYTES = 128 * 2**20


Q8_0_ID = 8  # ggml's type number of Q8_0 (gguf_blocks.BLOCK_TYPES)


def _q8_0_rows(qm: QuantizedMatrix, scales: np.ndarray) -> bool:
    """Whether `qm` (with MatMulNBits' float32 `scales`) is exactly a Q8_0 tensor: INT8 codes in blocks of 32, no
    zero points, every scale an fp16 value."""
    if qm.bits != 8 or qm.block != 32 or qm.per_channel or qm.zeros is not None or qm.shape[1] % 64:
        return False
    return bool(np.array_equal(scales.astype(np.float16).astype(np.float32), scales))


def q8_0_bytes(qm: QuantizedMatrix, scales: np.ndarray) -> np.ndarray:
    """uint8 [N, K / 32 * 34]: each row's blocks as Q8_0 stores them (fp16 d, then 32 int8 codes)."""
    n, k = qm.shape
    nb = k // 32
    out = np.empty((n, nb, 34), np.uint8)
    step = max(1, PACK_PART_ELEMENTS // k)
    for r in range(0, n, step):
        rows = slice(r, min(r + step, n))
        out[rows, :, :2] = scales[rows].astype(np.float16).view(np.uint8).reshape(-1, nb, 2)
        out[rows, :, 2:] = qm.codes_rows(rows).view(np.uint8).reshape(-1, nb, 32)
    return out.reshape(n, nb * 34)


@dataclass(frozen=True)
class NBitsWeights:
    """`ort` flavor: MatMulNBits for every quantized product, GatherBlockQuantized for the embedding."""

    model: QuantizedModel
    accuracy_level: int
    floats: FloatWeights  # tables kept in float (--fp-embeddings)
    kernel: MatMulKernel = MatMulKernel.MLAS
    _tables: dict[str, tuple[QuantizedMatrix, np.ndarray, int]] = field(default_factory=dict, compare=False)
    _q8_0_tables: dict[str, QuantizedMatrix] = field(default_factory=dict, compare=False)  # stored as Q8_0 rows

    def matmul(self, g: GraphBuilder, prefix: str, x: str, w: np.ndarray, bias: np.ndarray | None = None) -> str:
        qm = self.model.require(w, prefix)
        if isinstance(qm, GGUFMatrix):
            return _bias(g, prefix, self._gguf(g, prefix, x, [qm]), bias)
        b, scales, blk = pack_nbits(qm, prefix)
        w_q = g.weight(f"{prefix}/weight_q", b)
        y = self._nbits(g, prefix, x, w_q, (*qm.shape, qm.bits), scales, blk, qm, pack_zero_points(qm))
        return _bias(g, prefix, y, bias)

    def matmul_concat(
        self, g: GraphBuilder, prefix: str, x: str, ws: list[np.ndarray], biases: list[np.ndarray | None]
    ) -> str:
        """One MatMulNBits over the parts' rows stacked along N (blocks run along K, so stacking is exact)."""
        qms = [self.model.require(w, prefix) for w in ws]
        if any(isinstance(qm, GGUFMatrix) for qm in qms):
            return _bias(g, prefix, self._gguf(g, prefix, x, qms), concat_biases(ws, biases))
        packed = [pack_nbits(qm, prefix) for qm in qms]
        forms = {(qm.bits, blk, qm.zeros is None) for qm, (_, _, blk) in zip(qms, packed, strict=True)}
        if len(forms) != 1:  # one QuantConfig and whole groups in --mixed: a builder bug
            raise ValueError(f"{prefix}: fused parts differ in bits, block or zero points")
        b = np.concatenate([p[0] for p in packed])
        scales = np.concatenate([p[1] for p in packed])
        zps = [pack_zero_points(qm) for qm in qms]
        zp = None if zps[0] is None else np.concatenate(zps)
        nkb = (b.shape[0], qms[0].shape[1], qms[0].bits)
        w_q = g.weight(f"{prefix}/weight_q", b)
        y = self._nbits(g, prefix, x, w_q, nkb, scales, packed[0][2], qms[0], zp)
        return _bias(g, prefix, y, concat_biases(ws, biases))

    def _gguf(self, g: GraphBuilder, prefix: str, x: str, qms: list) -> str:
        """x @ concat(qms).T for parts of which one at least is kept in GGUF blocks: one MatMulGGUF over the
        stacked rows of each run of parts of one block type, a MatMulNBits / MatMulQ4 / MatMulQ8 for a part in
        our own codes, their outputs concatenated. In the accuracy_level 0 twin (export._twin_session) a GGUF
        part's MatMulGGUF takes fp32_compute=1: the same bytes, float activations."""
        runs: list[list] = []
        for qm in qms:
            same = runs and isinstance(qm, GGUFMatrix) and isinstance(runs[-1][0], GGUFMatrix)
            if same and runs[-1][0].type == qm.type:
                runs[-1].append(qm)
            else:
                runs.append([qm])
        outputs = []
        for i, run in enumerate(runs):
            part = prefix if len(runs) == 1 else f"{prefix}/part_{i}"
            if not isinstance(run[0], GGUFMatrix):
                b, scales, blk = pack_nbits(run[0], part)
                w_q = g.weight(f"{part}/weight_q", b)
                outputs.append(self._nbits(g, part, x, w_q, (*run[0].shape, run[0].bits), scales, blk, run[0]))
                continue
            n, k = sum(qm.shape[0] for qm in run), run[0].shape[1]
            raw = np.concatenate([qm.raw_rows(slice(None)) for qm in run])
            g.domains[EDGE_DOMAIN] = 1
            # accuracy_level 0 (the rebuilt twin): float activations, the weights as gguf-py forms them
            fp32 = {"fp32_compute": 1} if self.accuracy_level == 0 else {}
            outputs.append(g.op(
                MATMUL_GGUF, [x, g.weight(f"{part}/weight_gguf", raw)], f"{part}/{MATMUL_GGUF}",
                domain=EDGE_DOMAIN, K=k, N=n, type=run[0].type.ggml_id, **fp32,
            ))  # fmt: skip
        return outputs[0] if len(outputs) == 1 else g.op("Concat", outputs, f"{prefix}/parts/Concat", axis=-1)

    def table(self, g: GraphBuilder, prefix: str, w: np.ndarray) -> str:
        qm = self.model.lookup(w)
        if qm is None:
            return self.floats.table(g, prefix, w)
        b, scales, blk = pack_nbits(qm, prefix)
        if self.kernel is MatMulKernel.EDGE and _q8_0_rows(qm, scales):
            # A GGUF's kept Q8_0 table (or any INT8 block-32 table of fp16 scales) is stored once, in Q8_0's
            # layout: GatherGGUF reads the embedding's rows from it and MatMulGGUF the LM head's product, where
            # MatMulNBits' B for GatherBlockQuantized and a Q8_0 copy for the head held it twice.
            name = g.weight(f"{prefix}/weight_q8_0", q8_0_bytes(qm, scales))
            self._q8_0_tables[name] = qm
            return name
        name = g.weight(f"{prefix}/weight_q", b)
        self._tables[name] = (qm, scales, blk)
        return name

    def gather_rows(self, g: GraphBuilder, prefix: str, table: str, ids: str) -> str:
        if table in self._q8_0_tables:
            g.domains[EDGE_DOMAIN] = 1
            k = self._q8_0_tables[table].shape[1]
            return g.op(
                GATHER_GGUF, [table, ids], f"{prefix}/{GATHER_GGUF}", domain=EDGE_DOMAIN, K=k, type=Q8_0_ID
            )  # [1, T, H]
        if table not in self._tables:
            return self.floats.gather_rows(g, prefix, table, ids)
        qm, scales, blk = self._tables[table]
        rows = g.op(
            "GatherBlockQuantized",
            [table, ids, g.weight(f"{prefix}/scales_gather", scales[:, :, None])],
            f"{prefix}/GatherBlockQuantized",
            domain=MS_DOMAIN,
            bits=qm.bits,
            block_size=blk,
            gather_axis=0,
            quantize_axis=2,
        )  # [1, T, k_blocks, blk]
        g.domains[MS_DOMAIN] = 1
        return g.op("Reshape", [rows, g.const([0, 0, qm.shape[1]])], f"{prefix}/rows/Reshape")

    def matmul_table(self, g: GraphBuilder, prefix: str, x2d: str, table: str) -> str:
        if table in self._q8_0_tables:
            # MatMulNBits' 8-bit blocks of 32 (MLAS) took this LM head once; MatMulGGUF reads the table's Q8_0
            # bytes as they are and leaves the fused argmax as MatMulQ8 does. In the accuracy_level 0 twin
            # (rebuilt: export._twin_session) it takes float activations.
            n, k = self._q8_0_tables[table].shape
            g.domains[EDGE_DOMAIN] = 1
            fp32 = {"fp32_compute": 1} if self.accuracy_level == 0 else {}
            return g.op(
                MATMUL_GGUF, [x2d, table], f"{prefix}/{MATMUL_GGUF}", domain=EDGE_DOMAIN, K=k, N=n, type=Q8_0_ID, **fp32
            )
        if table not in self._tables:
            return self.floats.matmul_table(g, prefix, x2d, table)
        qm, scales, blk = self._tables[table]
        n, k = qm.shape
        if self._float_head(qm):
            # MLAS has no fp32 kernel for 8-bit codes: MatMulNBits at accuracy_level 0 dequantizes all of B on
            # every call (3.4 ns a weight: 0.17 s a call for SmolLM2's 49152 x 576 head, most of its twin's
            # validation time). The same values dequantized once (exact: quant.py) make a float Gemm.
            head = self.floats.table(g, f"{prefix}/fp32_twin", qm.dequantize())
            return self.floats.matmul_table(g, prefix, x2d, head)
        if self.accuracy_level != 0 or self.kernel is MatMulKernel.EDGE or n <= FP32_TABLE_PART_ROWS:
            return self._nbits(g, prefix, x2d, table, (*qm.shape, qm.bits), scales, blk, qm)
        # MatMulNBits computing in fp32 dequantizes its whole B on every call, which for a 1B model's LM head
        # is a 1 GB float32 temporary (the accuracy_level 0 twin's peak): run the head in parts of
        # rows, each its own node over its own copy of those rows' codes, and concatenate the logits.
        b = pack_nbits(qm, prefix)[0]
        parts = []
        for r in range(0, n, FP32_TABLE_PART_ROWS):
            rows = slice(r, min(r + FP32_TABLE_PART_ROWS, n))
            part = f"{prefix}/rows_{r}"
            w_q = g.weight(f"{part}/weight_q", b[rows])
            parts.append(self._nbits(g, part, x2d, w_q, (rows.stop - r, k, qm.bits), scales[rows], blk, qm))
        return g.op("Concat", parts, f"{prefix}/rows/Concat", axis=-1)

    def _float_head(self, qm: QuantizedMatrix) -> bool:
        """Whether the accuracy_level 0 twin's LM head runs as a float32 Gemm (matmul_table): 8-bit codes of a
        head whose float32 copy fits FP32_HEAD_MAX_BYTES, in a float32 graph."""
        n, k = qm.shape
        return (
            self.accuracy_level == 0
            and self.kernel is not MatMulKernel.EDGE
            and qm.bits == 8
            and n * k * 4 <= FP32_HEAD_MAX_BYTES
            and np.dtype(self.floats.storage) == np.float32
        )

    def _nbits(
        self,
        g: GraphBuilder,
        prefix: str,
        x: str,
        b: str,
        nkb: tuple[int, int, int],
        scales: np.ndarray,
        blk: int,
        qm: QuantizedMatrix,
        zero_points: np.ndarray | None = None,
    ) -> str:
        """`nkb`: (N, K, bits) of the packed matrix `b`; `qm`: (one of) the matrices it packs, for its form."""
        n, k, bits = nkb
        edge = self.kernel is MatMulKernel.EDGE and zero_points is None  # MatMulQ4's zero point is fixed at 8
        op = edge_matmul(bits, qm.per_channel, blk, k) if edge else None
        if op == MATMUL_Q4:
            g.domains[EDGE_DOMAIN] = 1
            # fp16 scales are exact (block_scales makes them fp16-representable) and cut a decode step's
            # bytes from 5 to 4.5 bits a weight; MatMulNBits' float path would need them in float32
            s = g.weight(f"{prefix}/scales_f16", scales.astype(np.float16))
            return g.op(MATMUL_Q4, [x, b, s], f"{prefix}/{MATMUL_Q4}", domain=EDGE_DOMAIN, K=k, N=n)
        if op == MATMUL_Q8:
            g.domains[EDGE_DOMAIN] = 1
            s = g.weight(f"{prefix}/scales_channel", np.ascontiguousarray(scales[:, 0]))  # [N]: one per row
            return g.op(MATMUL_Q8, [x, b, s], f"{prefix}/{MATMUL_Q8}", domain=EDGE_DOMAIN, K=k, N=n)
        g.domains[MS_DOMAIN] = 1
        inputs = [x, b, g.weight(f"{prefix}/scales", scales)]
        if zero_points is not None:
            inputs.append(g.weight(f"{prefix}/zero_points", zero_points))
        return g.op(
            "MatMulNBits",
            inputs,
            f"{prefix}/MatMulNBits",
            domain=MS_DOMAIN,
            K=k,
            N=n,
            bits=bits,
            block_size=blk,
            accuracy_level=self.accuracy_level,
        )


@dataclass(frozen=True)
class QdqWeights:
    """`trt` flavor: DequantizeLinear (opset 21) on integer initializers, feeding plain MatMul/Gather/Gemm."""

    model: QuantizedModel
    floats: FloatWeights  # storage = the activation dtype: dequantized tables need no Cast

    def matmul(self, g: GraphBuilder, prefix: str, x: str, w: np.ndarray, bias: np.ndarray | None = None) -> str:
        qm = self.model.require(w, prefix)
        if qm.zeros is not None:  # check_options refuses asymmetric blocks with --flavor trt: a caller bug
            raise ValueError(f"{prefix}: the trt flavor writes symmetric codes only")
        # Codes transposed to [K, N] (MatMul's B); blocks run along K = axis 0.
        if qm.per_channel:
            codes = g.weight(f"{prefix}/weight_q", qm.codes.T)  # int8
            scales, attrs = qm.scales[:, 0], {"axis": 1}
        else:
            g.initializers.append(int4_tensor(f"{prefix}/weight_q", qm.codes.T))
            codes, scales, attrs = f"{prefix}/weight_q", qm.scales.T, {"axis": 0, "block_size": qm.block}
        wd = self._dequantize(g, prefix, codes, scales, attrs)
        return _bias(g, prefix, g.op("MatMul", [x, wd], f"{prefix}/MatMul"), bias)

    def table(self, g: GraphBuilder, prefix: str, w: np.ndarray) -> str:
        qm = self.model.lookup(w)
        if qm is None:
            return self.floats.table(g, prefix, w)
        codes = g.weight(f"{prefix}/weight_q", qm.codes)  # int8 [V, H], one scale per row
        return self._dequantize(g, prefix, codes, qm.scales[:, 0], {"axis": 0})

    def gather_rows(self, g: GraphBuilder, prefix: str, table: str, ids: str) -> str:
        return self.floats.gather_rows(g, prefix, table, ids)

    def matmul_table(self, g: GraphBuilder, prefix: str, x2d: str, table: str) -> str:
        return self.floats.matmul_table(g, prefix, x2d, table)

    @staticmethod
    def _dequantize(g: GraphBuilder, prefix: str, codes: str, scales: np.ndarray, attrs: dict) -> str:
        # Zero point omitted (= 0): TensorRT accepts only symmetric Q/DQ. DQ's output dtype is the scale's.
        s = g.weight(f"{prefix}/scales", np.ascontiguousarray(scales.astype(g.dtype)))
        return g.op("DequantizeLinear", [codes, s], f"{prefix}/DequantizeLinear", **attrs)


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `graph` and of the subgraphs its nodes hold (If branches)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                yield from _nodes(sub)


def fp32_compute_twin(model: onnx.ModelProto, data_dir: Path) -> bool:
    """Make `model` (an ort-flavor graph, weights left external in `data_dir`) its own fp32 twin in place: every
    MatMulQ8 with fp32_compute=1, and every MatMulNBits of 8-bit per-channel codes (pack_nbits repeats a row's
    scale over its blocks) a MatMulQ8 with fp32_compute=1 over the same B and that row's scale (a small
    initializer kept in `model`): the same weight bytes with float activations. False, with `model` untouched,
    where another product is quantized: MatMulQ4 has no float mode, and other MatMulNBits at accuracy_level 0 want
    the rebuilt twin (its LM head in parts of rows, FP32_TABLE_PART_ROWS). MatMulGGUF takes fp32_compute=1 too."""
    nodes = list(_nodes(model.graph))
    tensors = {t.name: t for t in model.graph.initializer}
    channel_scales: dict[str, np.ndarray] = {}
    for node in nodes:
        if node.op_type == MATMUL_Q4:
            return False
        if node.op_type == "MatMulNBits" and _q8_channel_scales(node, tensors, data_dir, channel_scales) is None:
            return False
    _to_q8_fp32(model, [n for n in nodes if n.op_type == "MatMulNBits"], channel_scales)
    for node in nodes:
        if node.op_type in (MATMUL_Q8, MATMUL_GGUF) and node.domain == EDGE_DOMAIN:
            _set_int(node, "fp32_compute", 1)
    return True


def float32_cache(model: onnx.ModelProto) -> None:
    """Give `model` (an ort-flavor graph of edge-runtime's attention ops) an fp32 KV cache in place: its past_*
    inputs, present_* outputs and the If branches' outputs that carry them, where they are fp16 or q8 rows (a q8
    row's scale bytes dropped from its width). LinearAttention and RingAttention are registered once per cache
    type, so the same nodes then read and write float32 rows: an fp32_compute_twin held to the fp32 tolerance,
    which a narrow cache's rounding does not allow for (validate.with_kv_dtype), without rebuilding the graph."""
    past = next((v for v in model.graph.input if v.name.startswith("past_key.")), None)
    narrow = TensorProto.FLOAT if past is None else past.type.tensor_type.elem_type
    if narrow == TensorProto.FLOAT:
        return
    extra = Q8_ROW_EXTRA if narrow == TensorProto.UINT8 else 0

    def widen(value: onnx.ValueInfoProto) -> None:
        t = value.type.tensor_type
        if t.elem_type != narrow:
            return
        t.elem_type = TensorProto.FLOAT
        last = t.shape.dim[-1] if t.HasField("shape") and t.shape.dim else None
        if extra and last is not None and last.HasField("dim_value"):
            last.dim_value -= extra

    for value in model.graph.input:
        if value.name.startswith(("past_key.", "past_value.")):
            widen(value)
    for value in model.graph.output:
        if value.name.startswith(("present_key.", "present_value.")):
            widen(value)
    for node in _nodes(model.graph):
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                for value in sub.output:  # a branch's outputs: the layers' output (fp32) and their present_*
                    widen(value)


def fp32_compute_int8(model: onnx.ModelProto, data_dir: Path) -> int:
    """In a rebuilt accuracy_level 0 twin (every product a MatMulNBits), make each one of 8-bit per-channel codes a
    MatMulQ8 with fp32_compute=1, as fp32_compute_twin does, and leave the 4-bit ones as they are; how many it
    changed. MatMulNBits at accuracy_level 0 dequantizes an 8-bit B whole on every call: Gemma 3 270M's INT8 LM
    head (262,144 x 640) made its twin's 68 validation steps take 87 s, where MatMulQ8 reads the codes as they are."""
    tensors = {t.name: t for t in model.graph.initializer}
    channel_scales: dict[str, np.ndarray] = {}
    eight = [
        n
        for n in _nodes(model.graph)
        if n.op_type == "MatMulNBits" and _q8_channel_scales(n, tensors, data_dir, channel_scales) is not None
    ]
    _to_q8_fp32(model, eight, channel_scales)
    return len(eight)


def _q8_channel_scales(
    node: onnx.NodeProto, tensors: dict[str, onnx.TensorProto], data_dir: Path, seen: dict[str, np.ndarray]
) -> np.ndarray | None:
    """A MatMulNBits' per-row scales where MatMulQ8 can run it (8-bit codes with one scale a row, K a multiple
    of 64), remembered in `seen` by the scales' name; None where it cannot."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("bits") != 8 or attrs["K"] % 64 or len(node.input) != 3 or node.input[2] not in tensors:
        return None
    if node.input[2] not in seen:
        scales = numpy_helper.to_array(tensors[node.input[2]], base_dir=str(data_dir))
        if not np.array_equal(scales, np.broadcast_to(scales[:, :1], scales.shape)):
            return None  # INT8 in blocks (--int8-block): MatMulQ8 holds one scale a row
        seen[node.input[2]] = np.ascontiguousarray(scales[:, 0])
    return seen[node.input[2]]


def _to_q8_fp32(model: onnx.ModelProto, nodes: list[onnx.NodeProto], channel_scales: dict[str, np.ndarray]) -> None:
    """`nodes` (MatMulNBits whose scales are in `channel_scales`) made MatMulQ8 with fp32_compute=1."""
    for name, scales in channel_scales.items():
        model.graph.initializer.append(numpy_helper.from_array(scales, f"{name}/fp32_twin_channel"))
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        node.input[2] = f"{node.input[2]}/fp32_twin_channel"
        node.op_type, node.domain = MATMUL_Q8, EDGE_DOMAIN
        del node.attribute[:]
        node.attribute.extend([helper.make_attribute("K", attrs["K"]), helper.make_attribute("N", attrs["N"])])
        _set_int(node, "fp32_compute", 1)
    if channel_scales and not any(o.domain == EDGE_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(EDGE_DOMAIN, 1))


def _set_int(node: onnx.NodeProto, name: str, value: int) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])


def quantized_format(
    model: QuantizedModel, *, trt: bool, storage: np.dtype, activation: np.dtype, accuracy_level: int
) -> WeightFormat:
    if trt:
        return QdqWeights(model, FloatWeights(np.dtype(activation)))
    return NBitsWeights(model, accuracy_level, FloatWeights(np.dtype(storage)), model.config.kernel)
