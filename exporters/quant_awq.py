"""Activation-aware per-input-channel scaling (AWQ, Lin et al. 2024), folded exactly into the float model.

For a group of Linears sharing one input X, scale input channel j of their weights by
s_j = mean|X_j|^alpha (normalised) and divide the input by s_j: the float model is unchanged, but
the salient channels (large activations) get finer quantization steps. alpha is grid-searched per
group to minimise || X W^T - (X/s) Q(W s)^T ||^2 on the calibration inputs; alpha = 0 is plain RTN,
so the search can only improve on it (on calibration data). The division by s is folded where it
is exact:

    q, k, v  <- input_layernorm weight / s
    o        <- v_proj rows / s   (s shared by the G query heads of a KV head: attention is linear in V)
    gate, up <- post_attention_layernorm weight / s
    down     <- up_proj rows / s  (SiLU(gate) * up is linear in up)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edge_runtime.models import LayerWeights, ModelArgs

from .calibrate import InputStats, LayerInputs, copy_layer
from .quant import quantize_rtn

# The search's loss is measured on at most this many output rows of each Linear (every k-th): an unbiased
# estimate, since each row's error is independent of the others' (blocks run along the input). Only wider
# models' Linears are thinned (SmolLM2-135M's widest has 1536 rows): the Llama-3.1-8B shape's gate_proj
# has 14,336, and its 20 candidates would cost 20 x 14336 x 4096 x 2048 x 2 = 4.8 TFLOP.
LOSS_ROWS = 2048
FOLD_BLOCK_ELEMENTS = 1 << 22
ALPHAS = tuple(np.round(np.arange(20) * 0.05, 2))  # 0, 0.05, ..., 0.95 as in the AWQ paper


@dataclass(frozen=True)
class ScaleSearch:
    scales: np.ndarray  # [K] float64, divides the group's input
    alpha: float
    loss_ratio: float  # best loss / RTN loss (alpha = 0) on the calibration inputs


def search_scales(
    x: InputStats,
    weights: list[np.ndarray],
    block: int,
    tie: tuple[int, int, int] | None = None,
    sink_weight: float = 0.0,
    asymmetric: bool = False,
) -> ScaleSearch:
    """Grid-search alpha for Linears `weights` ([out, K] each) that share the input X (statistics `x`).

    `tie = (Hkv, G, D)` makes the scale equal across the G query heads of each KV head (o_proj).
    `sink_weight`: the loss counts each sequence's first row that many times per later
    token (InputStats.sink_weighted, as GPTQ's Hessian).
    """
    squared = x.squared_output(sink_weight)
    thinned = [(w[::k], float(k)) for w in weights for k in [-(-w.shape[0] // LOSS_ROWS)]]
    mean = x.mean_abs
    if tie is not None:
        hkv, grp, d = tie
        mean = np.broadcast_to(mean.reshape(hkv, grp, d).mean(axis=1, keepdims=True), (hkv, grp, d)).reshape(-1)
    mean = np.maximum(mean, 1e-8)
    losses = []
    for alpha in ALPHAS:
        s = mean.astype(np.float64) ** alpha
        s = s / np.sqrt(s.max() * s.min())
        loss = 0.0
        for w, k in thinned:  # (X/s) Q(W s)^T = X (Q(W s)/s)^T: the error in the original coordinates
            delta = w - quantize_rtn(w * s, 4, block, asymmetric).dequantize() / s
            loss += squared(delta) * k  # each kept row stands for k
        losses.append((loss, alpha, s))
    best = min(losses, key=lambda t: t[0])
    rtn = losses[0][0]
    return ScaleSearch(scales=best[2], alpha=float(best[1]), loss_ratio=best[0] / rtn if rtn else 1.0)


def folded(w: np.ndarray, col: np.ndarray, row: np.ndarray | None = None) -> np.ndarray:
    """float32 w * col (per input channel) / row (per output channel), each product in float64 as a whole
    array would have it, a block of rows at a time: an 8B gate_proj is 0.47 GB in float64."""
    out = np.empty(w.shape, np.float32)
    step = max(1, FOLD_BLOCK_ELEMENTS // max(w.shape[1], 1))
    for r in range(0, w.shape[0], step):
        part = w[r : r + step] * col
        out[r : r + step] = part if row is None else (part.T / row[r : r + step]).T
    return out


def awq_layer(
    args: ModelArgs,
    i: int,
    lw: LayerWeights,
    x: LayerInputs,
    block: int,
    progress: Callable[[str], None] = lambda _m: None,
    sink_weight: float = 0.0,
    asymmetric: bool = False,
) -> tuple[LayerWeights, LayerInputs, dict]:
    """Layer i with its scales folded in (the same function), the inputs its Linears now see, and its record."""
    d = args.head_dim
    hq, hkv = lw.num_heads(d), lw.num_kv_heads(d)
    kw = {"sink_weight": sink_weight, "asymmetric": asymmetric}
    qkv = search_scales(x.attn, [lw.q, lw.k, lw.v], block, **kw)
    o = search_scales(x.o, [lw.o], block, tie=(hkv, hq // hkv, d), **kw)
    gu = search_scales(x.mlp, [lw.gate, lw.up], block, **kw)
    dn = search_scales(x.down, [lw.down], block, **kw)
    s_kv = o.scales.reshape(hkv, hq // hkv, d)[:, 0, :].reshape(-1)  # per v_proj output row

    def bias(b: np.ndarray | None, s: np.ndarray) -> np.ndarray | None:
        return None if b is None else b / s

    scaled = copy_layer(
        lw,
        attn_norm=lw.attn_norm / qkv.scales,
        q=folded(lw.q, qkv.scales),
        k=folded(lw.k, qkv.scales),
        v=folded(lw.v, qkv.scales, s_kv),
        v_bias=bias(lw.v_bias, s_kv),
        o=folded(lw.o, o.scales),
        mlp_norm=lw.mlp_norm / gu.scales,
        gate=folded(lw.gate, gu.scales),
        up=folded(lw.up, gu.scales, dn.scales),
        up_bias=bias(lw.up_bias, dn.scales),
        down=folded(lw.down, dn.scales),
    )
    seen = LayerInputs(
        x.attn.divided(qkv.scales), x.o.divided(o.scales), x.mlp.divided(gu.scales), x.down.divided(dn.scales)
    )
    found = (("qkv", qkv), ("o", o), ("gate_up", gu), ("down", dn))
    record = {name: {"alpha": r.alpha, "loss_vs_rtn": round(r.loss_ratio, 4)} for name, r in found}
    progress(
        f"  awq layer {i}: alpha / squared output error vs RTN: "
        + ", ".join(f"{n} {r.alpha:.2f} / {r.loss_ratio:.2f}" for n, r in found)
    )
    return scaled, seen, record
