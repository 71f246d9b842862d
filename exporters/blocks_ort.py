"""Decoder blocks of the `ort` flavor, written as the few large nodes ONNX Runtime's CPU kernels fuse.

Same math as blocks.py (the `trt` flavor keeps those portable ops); per-node cost, not memory, held
decode back on small models, so a layer is 10 nodes while the ring is a linear cache:

  - residual add + RMSNorm as one com.microsoft::SkipSimplifiedLayerNormalization,
  - q/k/v and gate/up each as one matmul over stacked weights (one MatMulNBits: on the 135M shape the
    121 fused MatMulNBits of a step run ~7% faster than 211 separate ones, measured side by side),
  - SiLU as com.microsoft::QuickGelu(alpha=1),
  - attention as an If on the host's `ring_full`: one com.microsoft::GroupQueryAttention (RoPE, in-place
    cache write and causal attention in one kernel) until some token is past S + W - 1; after that the
    general ring path (RoPE as RotaryEmbedding, TensorScatter, ONNX `Attention` with the sink term).
    Models whose head or rotary size GroupQueryAttention refuses (`gqa_can_run`) get the general path only.
    With edge-runtime's ops (`edge_ops`) the linear branch is LinearAttention and the general path is one
    RingAttention node (`ring_attention_can_run`), which computes a chunk's rows as decode steps bit for bit.

The cache is [1, Hkv, C, D] (GroupQueryAttention's layout), bound by the host as both past_* and
present_*: both branches write it in place.

Shapes: T = tokens in this call, C = buffer rows, S = sinks, Hq/Hkv = query/KV heads, D = head dim,
R = rotary dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper

from edge_runtime import kernels
from edge_runtime.manifest import CACHES_DIM, CAPACITY_DIM, LOCAL_CAPACITY_DIM
from edge_runtime.models import LayerWeights
from edge_runtime.models.base import Activation

from .blocks import WeightFormat
from .graph import ONNX_DTYPE, GraphBuilder
from .graph_folds import fold_gelu_mul, fold_silu_mul

MS = "com.microsoft"
# A uint8 cache holds q8 rows: each row's fp32 scale (4 bytes), then its head_dim int8 codes (csrc/simd.h).
Q8_ROW_EXTRA = 4


def gqa_can_run(head_dim: int, rotary_dim: int) -> bool:
    """ONNX Runtime 1.32's GroupQueryAttention refuses other shapes: "head_size shall be a multiple of
    16", "cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8"."""
    return head_dim % 16 == 0 and (rotary_dim // 2) % 8 == 0 and rotary_dim <= head_dim


def ring_attention_can_run(head_dim: int, rotary_dim: int) -> bool:
    """The shapes edge-runtime's RingAttention takes (csrc/ring_attention_op.c refuses the others)."""
    return head_dim % 8 == 0 and head_dim <= 512 and rotary_dim % 2 == 0 and rotary_dim <= head_dim


@dataclass(frozen=True)
class OrtStep:
    """Graph tensors every layer shares (edge_runtime.ring.StepInputs; computed once per call)."""

    cos: str  # [T, R/2] at absolute positions
    sin: str
    cos_sink: str  # [T, R/2] at cache-logical positions (the sink columns' query rotation)
    sin_sink: str
    attn_mask: str  # [T, C] additive
    sink_rows: str  # [1] int64: S, at least 1
    write_index: str  # [1] int64: buffer row of the first new token (in the local ring's buffers, for `local`)
    # The general path's sink term, declared only where some layer builds it (None otherwise):
    dcos: str | None = None  # [T, R/2]: (cos_sink - cos) / sqrt(D), the sink query's rotation minus the window one's
    dsin: str | None = None
    sink_pad: str | None = None  # [8] int64 Pad amounts [0,0,0,0, 0,0,0,C-S]
    # GroupQueryAttention's inputs, declared only where `gqa_can_run` (None otherwise):
    ring_full: str | None = None  # [] bool: some token of this call is past S + W - 1
    seqlens_k: str | None = None  # [1] int32: past rows + T - 1 (while not ring_full)
    total_len: str | None = None  # [] int32: past rows + T
    cos_cache: str | None = None  # [C, R/2] at the rows' positions while the ring is linear (row r = token r)
    sin_cache: str | None = None
    # A local layer's step (Gemma 3): cos/sin/attn_mask/write_index are its own RoPE and ring's, it has no sink
    # columns (no sink term) and takes the ring path at every fill (GroupQueryAttention would need its window).
    local: bool = False
    # [B] int64 or empty: each row's cache in a batch of caches, where the graph's RingAttention takes one
    # (edge-serve's batched decode; write_index then holds each row's buffer row). None: one cache per call.
    row_cache: str | None = None


@dataclass(frozen=True)
class HeadNorms:
    """Per-head RMS norms on the queries and keys before RoPE (Qwen3, Gemma 3): their weights [D] and epsilon."""

    q: np.ndarray
    k: np.ndarray
    eps: float

    def op_inputs(self, g: GraphBuilder, prefix: str) -> list[str]:
        """The weights as an edge attention op's q_norm and k_norm inputs (the names head_norms gives them)."""
        pairs = (("q_norm", self.q), ("k_norm", self.k))
        return [g.weight(f"{prefix}/{name}/weight", w.astype(np.float32)) for name, w in pairs]


def fused_matmuls(
    g: GraphBuilder, prefix: str, x: str, wf: WeightFormat, parts: list[tuple[np.ndarray, np.ndarray | None]]
) -> list[str]:
    """x @ [w_a; w_b; ...].T as one matmul, split back into one output per (w [out, in], bias) part."""
    y = wf.matmul_concat(g, prefix, x, [w for w, _ in parts], [b for _, b in parts])
    widths = g.const([w.shape[0] for w, _ in parts])
    return g.op_multi("Split", [y, widths], f"{prefix}/Split", n_out=len(parts), axis=-1)


def fused_rope(
    g: GraphBuilder, prefix: str, x: str, cos: str, sin: str, heads: int, rotary_dim: int, head_dim: int
) -> str:
    """The same rotation as `rope` on x [1, T, heads*D] or [1, heads, T, D], as one
    com.microsoft::RotaryEmbedding node.
    position_ids [0] makes it read cos/sin rows 0..T-1: the host already computed this call's rows."""
    g.domains["com.microsoft"] = 1
    attrs = {"rotary_embedding_dim": rotary_dim} if rotary_dim < head_dim else {}
    pos0 = g.const(np.zeros(1, np.int64))
    return g.op(
        "RotaryEmbedding",
        [x, pos0, cos, sin],
        f"{prefix}/RotaryEmbedding",
        domain="com.microsoft",
        num_heads=heads,
        interleaved=0,
        **attrs,
    )


def skip_norm(
    g: GraphBuilder, prefix: str, x: str, delta: str | None, weight: np.ndarray, eps: float
) -> tuple[str, str]:
    """(RMSNorm(x + delta) * weight, x + delta); without `delta` just the norm of x."""
    w = g.weight(f"{prefix}/weight", weight.astype(np.float32))
    if delta is None:
        return g.op("SimplifiedLayerNormalization", [x, w], f"{prefix}/SimplifiedLayerNorm", axis=-1, epsilon=eps), x
    g.domains[MS] = 1
    normed, _, _, total = g.op_multi(
        "SkipSimplifiedLayerNormalization", [x, delta, w], f"{prefix}/SkipLayerNorm", n_out=4, domain=MS, epsilon=eps
    )
    return normed, total


# ------------------------------------------------------------------------------------------------
#  h ─► qkv_proj (q|k|v packed) ─► If ring_full ─► out, present_key, present_value ─► o_proj
#
#  else (every token so far is inside the window: the ring is a plain linear cache, row r = token r):
#     GroupQueryAttention(qkv, past_key, past_value, seqlens_k, total_len, cos_cache, sin_cache):
#     RoPE at the row positions, the new rows written in place at [past, past + T), causal attention
#     over rows [0, past + T). One node.
#
#  then (the ring is full: rows are reused, old tokens leave the window, sinks need their rotation):
#     Reshape/Transpose ─► [1, Hq+2Hkv, T, D] ─► Split(axis 1)
#        ├─► q ─► RoPE(abs) ──────────────────────────────────────────────────────► q_abs ─┐
#        │    └► RoPE(dcos, dsin) = (q_sink - q_abs)/√D ─► dq ─┐                            │
#        ├─► k ─► RoPE(abs) ─► TensorScatter(past_key @ write_index, axis 2) ─► keys ───────┤
#        └─► v ──────────────► TensorScatter(past_value) ──────────────────► values ───────┤
#     dq · keys[:, :, :S]ᵀ (Attention's QK output) ─► Pad to C ─► + attn_mask ─► mask ──────┤
#                            Attention(q_abs, keys, values, mask) ─► Transpose/Reshape ─► [1,T,Hq*D]
#  The window columns see the query rotated at its absolute position, the sink columns at its
#  cache-logical one (ring.py): Attention takes one query, so the sink columns get the difference as
#  an additive mask term (exact: RoPE is linear in cos/sin).
# ------------------------------------------------------------------------------------------------
def _general_path(
    g: GraphBuilder,
    prefix: str,
    qkv: str,
    step: OrtStep,
    *,
    layer: int,
    hq: int,
    hkv: int,
    head_dim: int,
    rotary_dim: int,
    scale: float,
    cache_outs: tuple[str, str] | None = None,
) -> tuple[str, str, str]:
    """The ring at any fill, sinks included: (out [1, T, Hq*D], keys, values) over the whole buffer.
    `cache_outs` names the scattered buffers (the graph's present_* outputs: TensorScatter then writes
    the bound buffer in place instead of copying it)."""
    if not step.local and (step.dcos is None or step.dsin is None or step.sink_pad is None):
        raise ValueError(f"{prefix}: the general path's sink inputs were not declared")  # a builder bug
    d = head_dim
    qkv = g.op("Reshape", [qkv, g.const([1, -1, hq + 2 * hkv, d])], f"{prefix}/qkv/Reshape")
    qkv = g.op("Transpose", [qkv], f"{prefix}/qkv/Transpose", perm=[0, 2, 1, 3])  # [1, Hq + 2 Hkv, T, D]
    q, k, v = g.op_multi("Split", [qkv, g.const([hq, hkv, hkv])], f"{prefix}/qkv/Split", n_out=3, axis=1)
    q_abs = fused_rope(g, f"{prefix}/q_rope", q, step.cos, step.sin, hq, rotary_dim, d)  # [1, Hq, T, D]
    k = fused_rope(g, f"{prefix}/k_rope", k, step.cos, step.sin, hkv, rotary_dim, d)  # [1, Hkv, T, D]
    keys, values = (
        g.op(
            "TensorScatter",
            [f"past_{kind}.{layer}", new, step.write_index],
            f"{prefix}/{kind[0]}_cache/TensorScatter",
            out=out,
            axis=2,
        )
        for kind, new, out in zip(("key", "value"), (k, v), cache_outs or (None, None), strict=True)
    )  # [1, Hkv, C, D]
    mask = _sink_term(g, prefix, q, keys, step, hq=hq, hkv=hkv, head_dim=d, rotary_dim=rotary_dim)
    out = g.op(
        "Attention",
        [q_abs, keys, values, mask],
        f"{prefix}/Attention",
        q_num_heads=hq,
        kv_num_heads=hkv,
        scale=scale,
    )  # [1, Hq, T, D]
    out = g.op("Transpose", [out], f"{prefix}/out/Transpose", perm=[0, 2, 1, 3])
    return g.op("Reshape", [out, g.const([1, -1, hq * d])], f"{prefix}/out/Reshape"), keys, values


def _sink_term(
    g: GraphBuilder, prefix: str, q: str, keys: str, step: OrtStep, *, hq: int, hkv: int, head_dim: int, rotary_dim: int
) -> str:
    """attn_mask plus the sink columns' rotation difference (dq . sink keys), or just the mask without sinks."""
    if step.local:
        return step.attn_mask
    d = head_dim
    sinks = g.op(
        "Slice", [keys, g.const([0]), step.sink_rows, g.const([2])], f"{prefix}/sink_keys/Slice"
    )  # [1, Hkv, S, D]
    dq = fused_rope(g, f"{prefix}/dq_rope", q, step.dcos, step.dsin, hq, rotary_dim, d)
    if rotary_dim < d:  # RotaryEmbedding passes the unrotated dims through; their difference is 0
        dq = g.op("Mul", [dq, g.const((np.arange(d) < rotary_dim).astype(g.dtype))], f"{prefix}/dq_rotary_only")
    # dq · sinksᵀ per query head, GQA grouping included: an Attention node's raw QK output.
    _, _, _, corr = g.op_multi(
        "Attention",
        [dq, sinks, sinks],
        f"{prefix}/sink_corr/Attention",
        n_out=4,
        q_num_heads=hq,
        kv_num_heads=hkv,
        scale=1.0,
    )  # [1, Hq, T, S]
    corr = g.op("Pad", [corr, step.sink_pad], f"{prefix}/sink_corr/Pad")  # [1, Hq, T, C]
    return g.op("Add", [corr, step.attn_mask], f"{prefix}/mask/Add")


# ------------------------------------------------------------------------------------------------
#  edge-runtime's ops: the general path as one node
#     RingAttention(qkv, past_key, past_value, write_index, cos, sin, cos_sink, sin_sink, sink_rows,
#                   attn_mask): new keys rotated at their absolute position and written with their values
#     at rows [write_index, write_index + T) in place, then per (row, head) the same attention as above over
#     every unmasked buffer row, the first S columns with the query at its cache-logical rotation.
#     Optional after attn_mask: row_cache (a batch of caches), then ring_full, seqlens_k, cos_cache, sin_cache
#     (`by_fill`: while ring_full is false the node computes LinearAttention's linear-ring attention instead).
#  One task per (row, head) in a fixed order: a T-row chunk is T decode steps bit for bit (ONNX Attention's
#  T-row rounding differs from its one-row rounding by ~1e-6, which the next layer's int8 activations
#  amplify), and a decode step is one node a layer instead of ~15.
# ------------------------------------------------------------------------------------------------
def _ring_attention(
    g: GraphBuilder,
    prefix: str,
    qkv: str,
    step: OrtStep,
    *,
    layer: int,
    hq: int,
    hkv: int,
    head_dim: int,
    rotary_dim: int,
    scale: float,
    cache_outs: tuple[str, str] | None = None,
    by_fill: bool = False,
    norms: HeadNorms | None = None,
) -> list[str]:
    """What `_general_path` computes, as edge-runtime's RingAttention: (out [1, T, Hq*D], keys, values);
    `cache_outs` names the written buffers (the graph's present_* outputs). `by_fill`: the node also takes
    ring_full, seqlens_k and the rotary cache, and computes as LinearAttention while ring_full is false.
    `norms`: the node normalizes the query and key heads itself (its q_norm and k_norm inputs)."""
    g.domains[kernels.DOMAIN] = 1
    name = f"{prefix}/{kernels.RING_ATTENTION}"
    linear = [step.ring_full, step.seqlens_k, step.cos_cache, step.sin_cache] if by_fill else []
    if by_fill and None in linear:  # decoder.py declares these inputs exactly where gqa_can_run
        raise ValueError(f"{prefix}: the linear ring's inputs were not declared")  # a builder bug
    if norms is not None and not linear:  # the norms are inputs 15 and 16: the optional ones before them empty
        linear = ["", "", "", ""]
    batch = [step.row_cache or ""] if step.row_cache or linear else []
    extra = {} if norms is None else {"qk_norm_epsilon": float(norms.eps)}
    return g.op_multi(
        kernels.RING_ATTENTION,
        [qkv, f"past_key.{layer}", f"past_value.{layer}", step.write_index, step.cos, step.sin, step.cos_sink,
         step.sin_sink, step.sink_rows, step.attn_mask, *batch, *linear,
         *(norms.op_inputs(g, prefix) if norms is not None else [])],
        name,
        n_out=3,
        outs=[f"{name}/output_0", *cache_outs] if cache_outs else None,
        domain=kernels.DOMAIN,
        num_heads=hq,
        kv_num_heads=hkv,
        scale=scale,
        **extra,
    )  # fmt: skip


def _full_ring(
    g: GraphBuilder, prefix: str, qkv: str, step: OrtStep, *, edge: bool, norms: HeadNorms | None = None, **general
) -> tuple[str, str, str] | list[str]:
    """The ring at any fill: RingAttention with `edge` where it takes the shapes, else the general path.
    `norms` only where RingAttention runs (`attention` decides)."""
    if edge and ring_attention_can_run(general["head_dim"], general["rotary_dim"]):
        return _ring_attention(g, prefix, qkv, step, **general, norms=norms)
    if norms is not None:  # attention() fuses the norms only into the edge ops: a builder bug
        raise ValueError(f"{prefix}: head norms given to the general path")
    return _general_path(g, prefix, qkv, step, **general)


def cache_io(
    g: GraphBuilder, layer: int, hkv: int, head_dim: int, *, local: bool = False, batched: bool = False
) -> tuple[str, str, list[str]]:
    """Declare layer `layer`'s past_key/past_value inputs and present_* outputs: (past_k, past_v, present),
    all of the cache's dtype (g.kv_dtype), as many rows as the global ring (the local ring's, `local`).
    `batched`: the first dimension is the caches of a batch (RingAttention's row_cache), else 1."""
    rows = LOCAL_CAPACITY_DIM if local else CAPACITY_DIM
    first: int | str = CACHES_DIM if batched else 1
    cache_shape = [first, hkv, rows, head_dim + (Q8_ROW_EXTRA if g.kv_dtype == np.uint8 else 0)]
    past_k = g.input(f"past_key.{layer}", g.kv_dtype, cache_shape)
    past_v = g.input(f"past_value.{layer}", g.kv_dtype, cache_shape)
    present = [f"present_key.{layer}", f"present_value.{layer}"]
    for name in present:
        g.outputs.append(helper.make_tensor_value_info(name, ONNX_DTYPE[g.kv_dtype], cache_shape))
    return past_k, past_v, present


def branch_outputs(g: GraphBuilder, outs: list[str] | tuple[str, ...]) -> list[tuple[str, np.dtype]]:
    """An If branch's (activation, keys, values, ...) outputs with their dtypes: the cache's after the first."""
    return [(outs[0], g.dtype), *((t, g.kv_dtype) for t in outs[1:])]


def _gqa(
    g: GraphBuilder,
    prefix: str,
    qkv: str,
    step: OrtStep,
    *,
    layer: int,
    hq: int,
    hkv: int,
    d: int,
    edge: bool,
    scale: float,
    norms: HeadNorms | None = None,
) -> list[str]:
    """GroupQueryAttention on packed qkv, or with `edge` edge-runtime's LinearAttention (the same
    semantics: tests/test_kernels.py): (out [1, T, Hq*D], present_key, present_value); K/V are written
    in place at rows [past, past + T). `norms` (with `edge` only): LinearAttention normalizes the heads."""
    if step.ring_full is None:  # decoder.py declares these inputs exactly where gqa_can_run
        raise ValueError(f"{prefix}: GroupQueryAttention inputs were not declared")  # a builder bug
    cache = [f"past_key.{layer}", f"past_value.{layer}"]
    if edge:
        g.domains[kernels.DOMAIN] = 1
        extra = {} if norms is None else {"qk_norm_epsilon": float(norms.eps)}
        return g.op_multi(
            kernels.LINEAR_ATTENTION,
            [qkv, *cache, step.seqlens_k, step.cos_cache, step.sin_cache,
             *(norms.op_inputs(g, prefix) if norms is not None else [])],
            f"{prefix}/{kernels.LINEAR_ATTENTION}",
            n_out=3,
            domain=kernels.DOMAIN,
            num_heads=hq,
            kv_num_heads=hkv,
            scale=scale,
            **extra,
        )  # fmt: skip
    if norms is not None:  # attention() fuses the norms only into the edge ops: a builder bug
        raise ValueError(f"{prefix}: head norms given to GroupQueryAttention")
    g.domains[MS] = 1
    return g.op_multi(
        "GroupQueryAttention",
        [qkv, "", "", *cache, step.seqlens_k, step.total_len, step.cos_cache, step.sin_cache],
        f"{prefix}/GroupQueryAttention",
        n_out=3,
        domain=MS,
        num_heads=hq,
        kv_num_heads=hkv,
        do_rotary=1,
        rotary_interleaved=0,
        scale=scale,
    )


# ------------------------------------------------------------------------------------------------
#  qkv ─► Reshape [1, T, Hq + 2 Hkv, D] ─► Split ─┬─► q ─► RMSNorm(q_norm) ─┐
#                                                ├─► k ─► RMSNorm(k_norm) ─┼─► Concat ─► Reshape ─► qkv
#                                                └─► v ────────────────────┘
#  Qwen3's per-head norms, before RoPE: the attention ops below rotate the packed qkv themselves.
# ------------------------------------------------------------------------------------------------
def head_norms(
    g: GraphBuilder,
    prefix: str,
    qkv: str,
    q_norm: np.ndarray,
    k_norm: np.ndarray,
    *,
    hq: int,
    hkv: int,
    head_dim: int,
    eps: float,
) -> str:
    heads = g.op("Reshape", [qkv, g.const([0, 0, hq + 2 * hkv, head_dim])], f"{prefix}/head_norm/Reshape")
    q, k, v = g.op_multi("Split", [heads, g.const([hq, hkv, hkv])], f"{prefix}/head_norm/Split", n_out=3, axis=2)
    normed = [
        g.op(
            "SimplifiedLayerNormalization",
            [x, g.weight(f"{prefix}/{name}/weight", w.astype(np.float32))],
            f"{prefix}/{name}/SimplifiedLayerNorm",
            axis=-1,
            epsilon=eps,
        )
        for x, w, name in ((q, q_norm, "q_norm"), (k, k_norm, "k_norm"))
    ]
    heads = g.op("Concat", [*normed, v], f"{prefix}/head_norm/Concat", axis=2)
    return g.op("Reshape", [heads, g.const([0, 0, (hq + 2 * hkv) * head_dim])], f"{prefix}/head_norm/Flatten")


def attention(
    g: GraphBuilder,
    prefix: str,
    h: str,
    lw: LayerWeights,
    wf: WeightFormat,
    step: OrtStep,
    *,
    layer: int,
    head_dim: int,
    rotary_dim: int,
    linear: bool | None = None,
    edge_ops: bool = False,
    by_fill: bool = False,
    eps: float = 0.0,
    scale: float | None = None,
) -> tuple[str, str | None, str | None]:
    """One layer's attention: (o_proj output, keys, values).

    `linear` None: the layer declares its cache I/O and picks its path with its own If on ring_full (or
    takes the general path only); keys/values are then the graph's present_* outputs (None here).
    True / False: inside a branch of the decoder-wide If (the caller declares the I/O and collects the
    returned keys/values): GroupQueryAttention while the ring is linear, else the general path.
    `edge_ops`: edge-runtime's LinearAttention in place of GroupQueryAttention and RingAttention in place of
    the general path (where it takes the shapes: `ring_attention_can_run`). `eps`: the q/k norms' epsilon
    (layers with `q_norm`/`k_norm`); `scale`: the softmax scale (None: 1/sqrt(head_dim)). A local layer's
    `step` (`step.local`) takes the ring path at every fill. `by_fill` (with `linear` None and `edge_ops`, where
    RingAttention and GroupQueryAttention take the shapes): no If; a global layer's RingAttention computes as
    LinearAttention while ring_full is false."""
    d = head_dim
    scale = float(1.0 / np.sqrt(d)) if scale is None else scale
    hq, hkv = lw.num_heads(d), lw.num_kv_heads(d)
    qkv = wf.matmul_concat(
        g, f"{prefix}/qkv_proj", h, [lw.q, lw.k, lw.v], [lw.q_bias, lw.k_bias, lw.v_bias]
    )  # [1, T, (Hq + 2 Hkv) * D]
    norms = HeadNorms(lw.q_norm, lw.k_norm, eps) if lw.q_norm is not None and lw.k_norm is not None else None
    # The edge attention ops normalize the heads themselves, bit for bit as the six nodes of head_norms do (one node
    # a layer instead of seven: docs/decisions/folds-with-onnxruntime-rounding.md); every other path keeps the nodes.
    edge_only = edge_ops and ((linear is True and not step.local) or ring_attention_can_run(d, rotary_dim))
    if norms is not None and not edge_only:
        qkv = head_norms(g, prefix, qkv, norms.q, norms.k, hq=hq, hkv=hkv, head_dim=d, eps=eps)
        norms = None
    general = {"layer": layer, "hq": hq, "hkv": hkv, "head_dim": d, "rotary_dim": rotary_dim, "scale": scale}
    gqa_args = {"layer": layer, "hq": hq, "hkv": hkv, "d": d, "edge": edge_ops, "scale": scale, "norms": norms}
    if linear is not None:
        if linear and not step.local:
            out, keys, values = _gqa(g, prefix, qkv, step, **gqa_args)
        else:
            out, keys, values = _full_ring(g, prefix, qkv, step, edge=edge_ops, norms=norms, **general)
        return wf.matmul(g, f"{prefix}/o_proj", out, lw.o, lw.o_bias), keys, values

    _, _, present = cache_io(g, layer, hkv, d, local=step.local, batched=step.row_cache is not None)
    if step.local or not gqa_can_run(d, rotary_dim):  # the general path at every fill
        out, _, _ = _full_ring(g, prefix, qkv, step, edge=edge_ops, norms=norms, **general, cache_outs=tuple(present))
        return wf.matmul(g, f"{prefix}/o_proj", out, lw.o, lw.o_bias), None, None
    if by_fill and edge_ops and ring_attention_can_run(d, rotary_dim):  # one node at every fill
        out, _, _ = _ring_attention(
            g, prefix, qkv, step, **general, cache_outs=tuple(present), by_fill=True, norms=norms
        )
        return wf.matmul(g, f"{prefix}/o_proj", out, lw.o, lw.o_bias), None, None
    full = g.branch(f"{prefix}/ring_full/then")
    ring = _full_ring(full, prefix, qkv, step, edge=edge_ops, norms=norms, **general)
    lin = g.branch(f"{prefix}/ring_full/else")
    gqa = _gqa(lin, prefix, qkv, step, **gqa_args)
    out, _, _ = g.op_multi(
        "If",
        [step.ring_full],
        f"{prefix}/ring_full/If",
        n_out=3,
        outs=[f"{prefix}/attn_out", *present],
        then_branch=full.to_graph(branch_outputs(g, ring)),
        else_branch=lin.to_graph(branch_outputs(g, gqa)),
    )
    return wf.matmul(g, f"{prefix}/o_proj", out, lw.o, lw.o_bias), None, None


# ------------------------------------------------------------------------------------------------
#   h ─► gate_up_proj ─► Split ─► gate ─► QuickGelu(α=1) = SiLU ─┐
#                             └─► up ──────────────────────────► * ─► down_proj ─► y
#   silu_mul (edge-runtime's ops): h ─► gate_up_proj ─► ai.edge_runtime::SiluMul ─► down_proj ─► y
#     and where down_proj is a MatMulQ4/Q8, SiluMul folds into it:  gate_up ─► down_proj(silu_mul=1) ─► y
# ------------------------------------------------------------------------------------------------
def mlp(
    g: GraphBuilder,
    prefix: str,
    h: str,
    lw: LayerWeights,
    wf: WeightFormat,
    *,
    silu_mul: bool = False,
    activation: Activation = Activation.SILU,
) -> str:
    """`silu_mul`: edge-runtime's SiluMul (SiLU models only); GELU-tanh (Gemma) runs as com.microsoft FastGelu, folded
    into the down projection where that is an edge-runtime op."""
    if activation is Activation.GELU_TANH:
        gate, up = fused_matmuls(g, f"{prefix}/gate_up_proj", h, wf, [(lw.gate, lw.gate_bias), (lw.up, lw.up_bias)])
        g.domains[MS] = 1
        act = g.op("FastGelu", [gate], f"{prefix}/act/FastGelu", domain=MS)
        product = g.op("Mul", [act, up], f"{prefix}/Mul")
        y = wf.matmul(g, f"{prefix}/down_proj", product, lw.down, lw.down_bias)
        fold_gelu_mul(g, product)
        return y
    if silu_mul:
        parts = [lw.gate, lw.up]
        gate_up = wf.matmul_concat(g, f"{prefix}/gate_up_proj", h, parts, [lw.gate_bias, lw.up_bias])
        g.domains[kernels.DOMAIN] = 1
        act = g.op(kernels.SILU_MUL, [gate_up], f"{prefix}/act/{kernels.SILU_MUL}", domain=kernels.DOMAIN)
        y = wf.matmul(g, f"{prefix}/down_proj", act, lw.down, lw.down_bias)
        fold_silu_mul(g, act)
        return y
    gate, up = fused_matmuls(g, f"{prefix}/gate_up_proj", h, wf, [(lw.gate, lw.gate_bias), (lw.up, lw.up_bias)])
    g.domains[MS] = 1
    act = g.op("QuickGelu", [gate], f"{prefix}/act/QuickGelu", domain=MS, alpha=1.0)
    return wf.matmul(g, f"{prefix}/down_proj", g.op("Mul", [act, up], f"{prefix}/Mul"), lw.down, lw.down_bias)
