"""Decoder blocks of the `ort` flavor, written as the few large nodes ONNX Runtime's CPU kernels fuse.

Same math as blocks.py (the `trt` flavor keeps those portable ops); here a layer is 16 nodes instead
of ~40, because per-node cost, not memory, held decode back on small models (issue 7):

  - residual add + RMSNorm as one com.microsoft::SkipSimplifiedLayerNormalization,
  - q/k/v and gate/up each as one matmul over stacked weights (one MatMulNBits: on the 135M shape the
    121 fused MatMulNBits of a step run ~7% faster than 211 separate ones, measured side by side),
  - SiLU as com.microsoft::QuickGelu(alpha=1),
  - RoPE as com.microsoft::RotaryEmbedding, attention as ONNX `Attention` (opset 23) over the cache
    laid out [1, rows, Hkv*D]: no Transpose anywhere, and the host binds each buffer's filled prefix
    (a contiguous view) so attention reads only those rows, without a copy.

Shapes: T = tokens in this call, L = attended buffer rows (the filled prefix), S = sinks,
Hq/Hkv = query/KV heads, G = Hq / Hkv, D = head dim, R = rotary dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_runtime.models import LayerWeights

from .blocks import WeightFormat
from .graph import GraphBuilder

MS = "com.microsoft"


@dataclass(frozen=True)
class OrtStep:
    """Graph tensors every layer shares (edge_runtime.ring.StepInputs; computed once per call)."""

    cos: str  # [T, R/2] at absolute positions
    sin: str
    dcos: str  # [T, R/2]: (cos_sink - cos) / sqrt(D), the sink query's rotation minus the window one's
    dsin: str
    attn_mask: str  # [T, L] additive
    sink_pad: str  # [8] int64 Pad amounts [0,0,0,0, 0,0,0,L-S]
    write_index: str  # [1] int64: buffer row of the first new token
    sink_correction: str  # [] bool: some row's sink rotation differs from its window one (the ring wrapped)


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
    """The same rotation as `rope` on x [1, T, heads*D], as one com.microsoft::RotaryEmbedding node.
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


def sink_correction(
    g: GraphBuilder,
    prefix: str,
    q: str,
    sinks: str,
    step: OrtStep,
    *,
    hq: int,
    hkv: int,
    head_dim: int,
    rotary_dim: int,
) -> str:
    """attn_mask + (q_sink - q_abs)/sqrt(D) · sinksᵀ on the sink columns: [1, Hq, T, L]."""
    d = head_dim
    # Without sinks (Mistral's sliding window) the host feeds S = 1 and equal rotations: dq = 0 exactly.
    dq = fused_rope(g, f"{prefix}/dq_rope", q, step.dcos, step.dsin, hq, rotary_dim, d)
    if rotary_dim < d:  # RotaryEmbedding passes the unrotated dims through; their difference is 0
        keep = np.tile((np.arange(d) < rotary_dim).astype(g.dtype), hq)
        dq = g.op("Mul", [dq, g.const(keep)], f"{prefix}/dq_rotary_only")
    # dq · sinksᵀ per query head, GQA grouping included: an Attention node's raw QK output (its own
    # output is unused); one node where Einsum needed three Reshapes around it and ran slower.
    _, _, _, corr = g.op_multi(
        "Attention",
        [dq, sinks, sinks],
        f"{prefix}/sink_corr/Attention",
        n_out=4,
        q_num_heads=hq,
        kv_num_heads=hkv,
        scale=1.0,
    )  # [1, Hq, T, S]
    corr = g.op("Pad", [corr, step.sink_pad], f"{prefix}/sink_corr/Pad")  # [1, Hq, T, L]
    return g.op("Add", [corr, step.attn_mask], f"{prefix}/mask/Add")


# ------------------------------------------------------------------------------------------------
#  h ─► qkv_proj ─► Split ─► q ─► RoPE(abs) ───────────────────────────────► q_abs ──┐
#                        │    └► RoPE(dcos, dsin) = (q_sink - q_abs)/√D ─► dq ─┐    │
#                        ├─► k ─► RoPE(abs) ─► TensorScatter(past_key @ write_index)├─ keys [1,L,.]┐
#                        └─► v ─────────────► TensorScatter(past_value) ───────────┼─ values ─────┤
#     If sink_correction: dq · sink_keyᵀ (Attention's QK output) ─► Pad to L ─► + attn_mask ─► mask ┤
#     else: attn_mask               (sink_key: the host's view of the buffer's first S rows)
#                                                                   Attention(q_abs, keys, values, mask) ─► o_proj
# The window columns must see the query rotated at its absolute position, the sink columns at its
# cache-logical one (ring.py). Attention takes one query, so the sink columns get the difference as
# an additive mask term: exact (RoPE is linear in cos/sin), and zero until the ring first wraps.
# ------------------------------------------------------------------------------------------------
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
) -> str:
    d = head_dim
    hq, hkv = lw.num_heads(d), lw.num_kv_heads(d)
    q, k, v = fused_matmuls(
        g, f"{prefix}/qkv_proj", h, wf, [(lw.q, lw.q_bias), (lw.k, lw.k_bias), (lw.v, lw.v_bias)]
    )  # [1, T, Hq*D], [1, T, Hkv*D] x2
    q_abs = fused_rope(g, f"{prefix}/q_rope", q, step.cos, step.sin, hq, rotary_dim, d)
    k = fused_rope(g, f"{prefix}/k_rope", k, step.cos, step.sin, hkv, rotary_dim, d)

    # The host binds each buffer's filled prefix (its first L rows: contiguous in this layout) as both
    # past_* and present_*, so attention reads exactly those rows and nothing is copied.
    cache_shape = [1, "span", hkv * d]
    keys, values = (
        g.op(
            "TensorScatter",
            [g.input(f"past_{kind}.{layer}", g.dtype, cache_shape), new, step.write_index],
            f"{prefix}/{kind[0]}_cache/TensorScatter",
            out=g.output(f"present_{kind}.{layer}", f"present_{kind}.{layer}", g.dtype, cache_shape),
            axis=1,
        )
        for kind, new in (("key", k), ("value", v))
    )
    # The sink rows arrive as their own input, bound by the host to the first S rows of the same K
    # buffer (no Slice, no copy). ONNX Runtime may read it before this call's TensorScatter writes:
    # harmless, because sinks change only while t < S, where dq = 0.
    sinks = g.input(f"sink_key.{layer}", g.dtype, [1, "sink_rows", hkv * d])
    # Until the ring first wraps every row's sink and window rotations agree (dq = 0): the host says
    # so with `sink_correction` and an If skips the four correction nodes (~2 us for the If instead).
    then = g.branch(f"{prefix}/sink_corr/then")
    corrected = sink_correction(then, prefix, q, sinks, step, hq=hq, hkv=hkv, head_dim=d, rotary_dim=rotary_dim)
    otherwise = g.branch(f"{prefix}/sink_corr/else")
    unchanged = otherwise.op("Identity", [step.attn_mask], f"{prefix}/sink_corr/else/Identity")
    mask = g.op(
        "If",
        [step.sink_correction],
        f"{prefix}/sink_corr/If",
        then_branch=then.to_graph([(corrected, g.dtype)]),
        else_branch=otherwise.to_graph([(unchanged, g.dtype)]),
    )  # [1, Hq, T, L] or [T, L]
    out = g.op(
        "Attention",
        [q_abs, keys, values, mask],
        f"{prefix}/Attention",
        q_num_heads=hq,
        kv_num_heads=hkv,
        scale=float(1.0 / np.sqrt(d)),
    )  # [1, T, Hq*D]
    return wf.matmul(g, f"{prefix}/o_proj", out, lw.o, lw.o_bias)


# ------------------------------------------------------------------------------------------------
#   h ─► gate_up_proj ─► Split ─► gate ─► QuickGelu(α=1) = SiLU ─┐
#                             └─► up ──────────────────────────► * ─► down_proj ─► y
# ------------------------------------------------------------------------------------------------
def mlp(g: GraphBuilder, prefix: str, h: str, lw: LayerWeights, wf: WeightFormat) -> str:
    gate, up = fused_matmuls(g, f"{prefix}/gate_up_proj", h, wf, [(lw.gate, lw.gate_bias), (lw.up, lw.up_bias)])
    g.domains[MS] = 1
    act = g.op("QuickGelu", [gate], f"{prefix}/act/QuickGelu", domain=MS, alpha=1.0)
    return wf.matmul(g, f"{prefix}/down_proj", g.op("Mul", [act, up], f"{prefix}/Mul"), lw.down, lw.down_bias)
