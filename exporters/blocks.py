"""Graph blocks of a Llama-family decoder, each a free function over a GraphBuilder.

Shapes: T = tokens in this call, H = hidden, D = head dim, R = rotary dim, Hq/Hkv = query/KV heads,
G = Hq / Hkv, K = attended cache columns. Batch is 1 (an edge runtime serves one stream).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edge_runtime.manifest import CAPACITY_DIM, LOCAL_CAPACITY_DIM
from edge_runtime.models import LayerWeights
from edge_runtime.models.base import Activation

from .graph import ONNX_DTYPE, GraphBuilder

INT64_MAX = np.iinfo(np.int64).max


class WeightFormat(Protocol):
    """How weights become initializers and nodes: FloatWeights here, the quantized formats in quant_graph.py."""

    def matmul(self, g: GraphBuilder, prefix: str, x: str, w: np.ndarray, bias: np.ndarray | None = None) -> str: ...

    def table(self, g: GraphBuilder, prefix: str, w: np.ndarray) -> str: ...

    def gather_rows(self, g: GraphBuilder, prefix: str, table: str, ids: str) -> str: ...

    def matmul_table(self, g: GraphBuilder, prefix: str, x2d: str, table: str) -> str: ...

    def matmul_concat(
        self, g: GraphBuilder, prefix: str, x: str, ws: list[np.ndarray], biases: list[np.ndarray | None]
    ) -> str:
        """x @ concat(ws).T (+ biases): one node for several Linears reading the same input (`ort` blocks)."""
        ...


def concat_biases(ws: list[np.ndarray], biases: list[np.ndarray | None]) -> np.ndarray | None:
    if all(b is None for b in biases):
        return None
    return np.concatenate(
        [np.zeros(w.shape[0], np.float32) if b is None else b for w, b in zip(ws, biases, strict=True)]
    )


@dataclass(frozen=True)
class FloatWeights:
    """Weights stored as fp32 or fp16 initializers."""

    storage: np.dtype

    def matmul(self, g: GraphBuilder, prefix: str, x: str, w: np.ndarray, bias: np.ndarray | None = None) -> str:
        """x [.., in] @ w.T (w is HF's [out, in]) + bias."""
        wt = g.weight(f"{prefix}/weight", w.T.astype(self.storage))  # [in, out]
        wt = self._to_compute(g, prefix, wt)
        y = g.op("MatMul", [x, wt], f"{prefix}/MatMul")
        if bias is not None:
            y = g.op("Add", [y, g.const(bias.astype(g.dtype))], f"{prefix}/BiasAdd")
        return y

    def matmul_concat(
        self, g: GraphBuilder, prefix: str, x: str, ws: list[np.ndarray], biases: list[np.ndarray | None]
    ) -> str:
        return self.matmul(g, prefix, x, np.concatenate(ws), concat_biases(ws, biases))

    def gather_rows(self, g: GraphBuilder, prefix: str, table: str, ids: str) -> str:
        rows = g.op("Gather", [table, ids], f"{prefix}/Gather")
        return self._to_compute(g, f"{prefix}/rows", rows)

    def table(self, g: GraphBuilder, prefix: str, w: np.ndarray) -> str:
        """A [V, H] table shared by the embedding Gather and a tied LM head."""
        return g.weight(f"{prefix}/weight", w.astype(self.storage))

    def matmul_table(self, g: GraphBuilder, prefix: str, x2d: str, table: str) -> str:
        """x [N, H] @ table.T -> [N, V] without storing a transposed copy."""
        return g.op("Gemm", [x2d, self._to_compute(g, f"{prefix}/table", table)], f"{prefix}/Gemm", transB=1)

    def _to_compute(self, g: GraphBuilder, prefix: str, value: str) -> str:
        if np.dtype(self.storage) == g.dtype:
            return value
        return g.op("Cast", [value], f"{prefix}/Cast", to=ONNX_DTYPE[g.dtype])


# ------------------------------------------------------------------------------------------------
#   x ──► Pow 2 ─► ReduceMean ─► + eps ─► Sqrt ─┐
#   └──────────────────────────────────────────► Div ─► * weight ─► y
# The pattern onnxruntime fuses into SimplifiedLayerNormalization. With fp16 activations it runs
# in fp32: a sum of squares overflows fp16 for hidden values above ~256.
# ------------------------------------------------------------------------------------------------
def rms_norm(g: GraphBuilder, prefix: str, x: str, weight: np.ndarray, eps: float) -> str:
    f32 = np.dtype(np.float32)
    if g.dtype != f32:
        x = g.op("Cast", [x], f"{prefix}/CastUp", to=ONNX_DTYPE[f32])
    sq = g.op("Pow", [x, g.const(np.array(2.0, f32))], f"{prefix}/Pow")
    mean = g.op("ReduceMean", [sq, g.const([-1])], f"{prefix}/ReduceMean", keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [mean, g.const(np.array(eps, f32))], f"{prefix}/AddEps")], f"{prefix}/Sqrt")
    y = g.op("Mul", [g.op("Div", [x, std], f"{prefix}/Div"), g.const(weight.astype(f32))], f"{prefix}/MulWeight")
    if g.dtype != f32:
        y = g.op("Cast", [y], f"{prefix}/CastDown", to=ONNX_DTYPE[g.dtype])
    return y


# ------------------------------------------------------------------------------------------------
#   x [.., R | D-R] ─► x1 = x[..:R/2], x2 = x[R/2:R], rest = x[R:]
#   y = concat(x1*cos - x2*sin, x2*cos + x1*sin, rest)          (rotate-half, as in transformers)
# cos/sin arrive from the host, already computed in float64 and broadcastable to x1.
# ------------------------------------------------------------------------------------------------
def rope(g: GraphBuilder, prefix: str, x: str, cos: str, sin: str, rotary_dim: int, head_dim: int) -> str:
    half = rotary_dim // 2

    def part(lo: int, hi: int, tag: str) -> str:
        return g.op("Slice", [x, g.const([lo]), g.const([hi]), g.const([-1])], f"{prefix}/Slice{tag}")

    x1, x2 = part(0, half, "1"), part(half, rotary_dim, "2")
    a = g.op(
        "Sub", [g.op("Mul", [x1, cos], f"{prefix}/Mul1c"), g.op("Mul", [x2, sin], f"{prefix}/Mul2s")], f"{prefix}/Sub"
    )
    b = g.op(
        "Add", [g.op("Mul", [x2, cos], f"{prefix}/Mul2c"), g.op("Mul", [x1, sin], f"{prefix}/Mul1s")], f"{prefix}/Add"
    )
    parts = [a, b] + ([part(rotary_dim, head_dim, "Rest")] if rotary_dim < head_dim else [])
    return g.op("Concat", parts, f"{prefix}/Concat", axis=-1)


@dataclass(frozen=True)
class StepTensors:
    """Graph inputs shared by every layer of the portable (`trt`) graph (see edge_runtime.ring.StepInputs)."""

    cos_q: str  # [1, T, 1, 1, R/2]  absolute positions, broadcast over [1, T, Hkv, G, R/2]
    sin_q: str
    cos_q_sink: str  # [1, T, 1, 1, R/2] cache-logical positions, for the sink columns
    sin_q_sink: str
    cos_k: str  # [1, T, 1, R/2]
    sin_k: str
    attn_mask: str  # [T, K] additive
    sink_mask: str  # [K] bool
    # Local layers (Gemma 3): their own RoPE at absolute positions (no sink rotation) and their window's mask.
    cos_q_local: str | None = None
    sin_q_local: str | None = None
    cos_k_local: str | None = None
    sin_k_local: str | None = None
    attn_mask_local: str | None = None


# ------------------------------------------------------------------------------------------------
#  h ─► q_proj ─► [1,T,Hkv,G,D] ─*scale─► RoPE(abs) ──► q_abs ─┐            ┌─► s_abs ─┐
#                                     └─► RoPE(sink) ─► q_sink ─┼─► @ keysᵀ ──┤          ├ Where(sink col)
#  h ─► k_proj ─► [1,T,Hkv,D] ─► RoPE(abs) ─► k_new ─┐          │            └─► s_sink ┘      │
#  h ─► v_proj ─► [1,T,Hkv,D] ───────────────► v_new ┤          │                       + attn_mask
#        keys = Concat(past_key, k_new); k_new is an output the host copies into its row      Softmax
#                                                                     values ─► probs @ values ─► o_proj
# The portable (`trt`) attention: standard ops only. The `ort` flavor's is in blocks_ort.py.
# ------------------------------------------------------------------------------------------------
def attention(
    g: GraphBuilder,
    prefix: str,
    h: str,
    lw: LayerWeights,
    wf: WeightFormat,
    step: StepTensors,
    *,
    layer: int,
    head_dim: int,
    rotary_dim: int,
    eps: float,
    scale: float,
    local: bool = False,
) -> str:
    """`eps`: the q/k norms' epsilon (layers with `q_norm`/`k_norm`); `scale`: the softmax scale of q.k;
    `local`: a local layer (its own RoPE at absolute positions, no sink columns, its window's mask)."""
    d = head_dim
    hq, hkv = lw.num_heads(d), lw.num_kv_heads(d)
    grp = hq // hkv
    q = wf.matmul(g, f"{prefix}/q_proj", h, lw.q, lw.q_bias)  # [1, T, Hq*D]
    k = wf.matmul(g, f"{prefix}/k_proj", h, lw.k, lw.k_bias)  # [1, T, Hkv*D]
    v = wf.matmul(g, f"{prefix}/v_proj", h, lw.v, lw.v_bias)
    perm_q = [0, 2, 3, 1, 4]  # [1, T, Hkv, G, D] -> [1, Hkv, G, T, D]
    q = g.op("Reshape", [q, g.const([0, 0, hkv, grp, d])], f"{prefix}/q_reshape")  # [1, T, Hkv, G, D]
    if lw.q_norm is not None:  # before the scale: a norm after it would undo it
        q = rms_norm(g, f"{prefix}/q_norm", q, lw.q_norm, eps)
    q = g.op("Mul", [q, g.const(np.array(scale, g.dtype))], f"{prefix}/q_scale")
    if local:
        if step.cos_q_local is None or step.sin_q_local is None or step.cos_k_local is None:
            raise ValueError(f"{prefix}: the local layers' inputs were not declared")  # a builder bug
        cos_q, sin_q, cos_k, sin_k = step.cos_q_local, step.sin_q_local, step.cos_k_local, step.sin_k_local
    else:
        cos_q, sin_q, cos_k, sin_k = step.cos_q, step.sin_q, step.cos_k, step.sin_k
    q_abs = rope(g, f"{prefix}/q_rope", q, cos_q, sin_q, rotary_dim, d)
    q_sink = None if local else rope(g, f"{prefix}/q_sink_rope", q, step.cos_q_sink, step.sin_q_sink, rotary_dim, d)
    k = g.op("Reshape", [k, g.const([0, 0, hkv, d])], f"{prefix}/k_reshape")  # [1, T, Hkv, D]
    if lw.k_norm is not None:
        k = rms_norm(g, f"{prefix}/k_norm", k, lw.k_norm, eps)
    k = rope(g, f"{prefix}/k_rope", k, cos_k, sin_k, rotary_dim, d)
    q_abs = g.op("Transpose", [q_abs], f"{prefix}/q_abs_transpose", perm=perm_q)
    if q_sink is not None:
        q_sink = g.op("Transpose", [q_sink], f"{prefix}/q_sink_transpose", perm=perm_q)
    k = g.op("Transpose", [k], f"{prefix}/k_transpose", perm=[0, 2, 1, 3])  # [1, Hkv, T, D]
    v = g.op("Reshape", [v, g.const([0, 0, hkv, d])], f"{prefix}/v_reshape")
    v = g.op("Transpose", [v], f"{prefix}/v_transpose", perm=[0, 2, 1, 3])  # [1, Hkv, T, D]

    cache_shape = [1, hkv, LOCAL_CAPACITY_DIM if local else CAPACITY_DIM, d]
    past_k = g.input(f"past_key.{layer}", g.dtype, cache_shape)
    past_v = g.input(f"past_value.{layer}", g.dtype, cache_shape)
    keys = g.op("Concat", [past_k, k], f"{prefix}/k_cache/Concat", axis=2)  # [1, Hkv, C + T, D]
    values = g.op("Concat", [past_v, v], f"{prefix}/v_cache/Concat", axis=2)
    g.output(k, f"new_key.{layer}", g.dtype, [1, hkv, "tokens", d])
    g.output(v, f"new_value.{layer}", g.dtype, [1, hkv, "tokens", d])

    keys_t = g.op(
        "Transpose",
        [g.op("Unsqueeze", [keys, g.const([2])], f"{prefix}/k_unsqueeze")],
        f"{prefix}/k_transpose_t",
        perm=[0, 1, 2, 4, 3],
    )  # [1, Hkv, 1, D, K]
    values = g.op("Unsqueeze", [values, g.const([2])], f"{prefix}/v_unsqueeze")  # [1, Hkv, 1, K, D]
    s_abs = g.op("MatMul", [q_abs, keys_t], f"{prefix}/qk_abs/MatMul")  # [1, Hkv, G, T, K]
    if q_sink is None:  # a local layer: no sink columns
        scores = g.op("Add", [s_abs, step.attn_mask_local], f"{prefix}/mask/Add")
    else:
        s_sink = g.op("MatMul", [q_sink, keys_t], f"{prefix}/qk_sink/MatMul")
        scores = g.op("Where", [step.sink_mask, s_sink, s_abs], f"{prefix}/sink_select/Where")
        scores = g.op("Add", [scores, step.attn_mask], f"{prefix}/mask/Add")
    probs = g.op("Softmax", [scores], f"{prefix}/Softmax", axis=-1)
    out = g.op("MatMul", [probs, values], f"{prefix}/pv/MatMul")  # [1, Hkv, G, T, D]
    out = g.op("Reshape", [out, g.const([1, hq, -1, d])], f"{prefix}/out_heads")  # [1, Hq, T, D]
    out = g.op("Transpose", [out], f"{prefix}/out_transpose", perm=[0, 2, 1, 3])  # [1, T, Hq, D]
    out = g.op("Reshape", [out, g.const([0, 0, hq * d])], f"{prefix}/out_reshape")  # [1, T, Hq*D]
    return wf.matmul(g, f"{prefix}/o_proj", out, lw.o, lw.o_bias)


# ------------------------------------------------------------------------------------------------
#   h ─► gate_proj ─► SiLU ─┐
#   h ─► up_proj ───────────► * ─► down_proj ─► y             SiLU(x) = x * Sigmoid(x)
# ------------------------------------------------------------------------------------------------
def mlp(
    g: GraphBuilder, prefix: str, h: str, lw: LayerWeights, wf: WeightFormat, activation: Activation = Activation.SILU
) -> str:
    gate = wf.matmul(g, f"{prefix}/gate_proj", h, lw.gate, lw.gate_bias)  # [1, T, I]
    up = wf.matmul(g, f"{prefix}/up_proj", h, lw.up, lw.up_bias)
    if activation is Activation.GELU_TANH:
        act = gelu_tanh(g, f"{prefix}/act", gate)
    else:
        act = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{prefix}/act/Sigmoid")], f"{prefix}/act/Mul")
    return wf.matmul(g, f"{prefix}/down_proj", g.op("Mul", [act, up], f"{prefix}/Mul"), lw.down, lw.down_bias)


# ------------------------------------------------------------------------------------------------
#   GELU-tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))         (transformers' gelu_pytorch_tanh)
# Elementwise ops TensorRT parses; computed in fp32 (x^3 overflows fp16 for |x| > ~40).
# ------------------------------------------------------------------------------------------------
def gelu_tanh(g: GraphBuilder, prefix: str, x: str) -> str:
    f32 = np.dtype(np.float32)
    if g.dtype != f32:
        x = g.op("Cast", [x], f"{prefix}/CastUp", to=ONNX_DTYPE[f32])
    cube = g.op("Mul", [g.op("Mul", [x, x], f"{prefix}/Square"), x], f"{prefix}/Cube")
    inner = g.op(
        "Add", [x, g.op("Mul", [cube, g.const(np.array(0.044715, f32))], f"{prefix}/MulCube")], f"{prefix}/Add"
    )
    t = g.op(
        "Tanh", [g.op("Mul", [inner, g.const(np.array(np.sqrt(2 / np.pi), f32))], f"{prefix}/MulC")], f"{prefix}/Tanh"
    )
    half_x = g.op("Mul", [x, g.const(np.array(0.5, f32))], f"{prefix}/Half")
    y = g.op("Mul", [half_x, g.op("Add", [t, g.const(np.array(1.0, f32))], f"{prefix}/AddOne")], f"{prefix}/Mul")
    if g.dtype != f32:
        y = g.op("Cast", [y], f"{prefix}/CastDown", to=ONNX_DTYPE[g.dtype])
    return y
