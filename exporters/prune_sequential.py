"""Sequential reconstruction of a pruned model (docs/architecture.md §6).

One-shot reconstruction (prune.reconstruct) refits every layer's o_proj / down_proj on the *unpruned*
model's activations, so from the second layer on each refit is fitted to inputs its layer never sees:
the earlier layers' pruning has already moved them. Here the calibration sequences go through the
unpruned model and the pruned model side by side, one layer at a time, and each pruned layer is refitted
on the inputs the already-refitted earlier layers give it, towards the *unpruned* layer's outputs on the
unpruned stream:

    W' = argmin ||Y - X_p W'^T - b'||^2 + lam ||W' - W_sliced||^2

X_p: the pruned layer's input rows, Y: the unpruned layer's output rows at the same point (both
sink-weighted as prune.reconstruct weighs them; b' only where the projection has a bias). Because the
target is the unpruned model's output and not the unpruned layer applied to the pruned stream, each layer
also absorbs what the earlier ones could not reproduce, and layers with nothing removed are refitted too.
The damping pulls toward the plainly sliced weights, so a refit never does worse than slicing on these
rows. With `inputs`, the layer's first projections (q/k/v, gate/up) are refitted the same way, from the
pruned stream's normed input to the unpruned projections' outputs.

Cost: both models' float64 forward over the calibration sequences once (about twice a calibration
capture), and per layer one solve of the o_proj and one of the down_proj width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from edge_runtime.models import LayerWeights, ModelArgs, ModelWeights, RopeKind

from .calibrate import copy_layer
from .reference import DenseKVCache, ReferenceModel, post_norm, rms_norm


class _Fit:
    """X^T X and X^T Y over sink-weighted rows, for W' = argmin ||Y - X W'^T - b'||^2 + lam ||W' - prior||^2."""

    def __init__(self, k: int, out: int, bias: bool, sink_weight: float):
        self.k, self.bias, self.sink_weight = k, bias, sink_weight
        self.g = np.zeros((k + bias, k + bias))
        self.r = np.zeros((k + bias, out))

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        """One sequence's input rows x [T, k] and target rows y [T, out], first token first."""
        if self.bias:
            x = np.hstack([x, np.ones((x.shape[0], 1))])
        self.g += x.T @ x
        self.r += x.T @ y
        if self.sink_weight:  # the sink's row once more per later token, as prune.reconstruct counts it
            w = self.sink_weight * (x.shape[0] - 1)
            self.g += w * np.outer(x[0], x[0])
            self.r += w * np.outer(x[0], y[0])

    def solve(self, prior: np.ndarray, prior_bias: np.ndarray | None, damp: float) -> tuple[np.ndarray, np.ndarray]:
        lam = damp * float(np.mean(np.diag(self.g)[: self.k]))
        d = np.full(self.k, lam)
        p = np.asarray(prior, np.float64).T  # [k, out]
        if self.bias:
            d = np.append(d, 0.0)  # the constant column has every row: it needs no damping
            p = np.vstack([p, np.asarray(prior_bias, np.float64)[None, :]])
        sol = np.linalg.solve(self.g + np.diag(d), self.r + d[:, None] * p)
        return sol[: self.k].T, (sol[self.k] if self.bias else None)


def _cache(i: int, hkv: int, d: int, positions: np.ndarray) -> DenseKVCache:
    """An empty cache for layer i alone (ReferenceModel._attention indexes the cache by layer)."""
    empty = [np.zeros((1, 0, d))] * i + [np.zeros((hkv, 0, d))]
    return DenseKVCache(keys=list(empty), values=list(empty), positions=positions)


def _split(w: np.ndarray, b: np.ndarray | None, sizes: list[int]) -> list[tuple[np.ndarray, np.ndarray | None]]:
    cuts = np.cumsum(sizes)[:-1]
    ws = np.split(w, cuts, axis=0)
    bs = [None] * len(sizes) if b is None else np.split(b, cuts)
    return list(zip(ws, bs, strict=True))


def _refit_inputs(
    names: tuple[str, ...], lo_h: list[np.ndarray], lp_h: list[np.ndarray], lp: LayerWeights, sw: float, damp: float
) -> dict[str, np.ndarray | None]:
    """q/k/v (or gate/up) of the pruned layer refitted from its normed inputs lp_h to the same rows'
    outputs on the unpruned stream lo_h (the sliced rows are the unpruned layer's own rows)."""
    w = np.vstack([getattr(lp, n) for n in names])
    biases = [getattr(lp, f"{n}_bias") for n in names]
    has_bias = biases[0] is not None
    b = np.concatenate(biases) if has_bias else None
    fit = _Fit(w.shape[1], w.shape[0], has_bias, sw)
    for ho, hp in zip(lo_h, lp_h, strict=True):
        fit.add(hp, ho @ w.T if b is None else ho @ w.T + b)
    w2, b2 = fit.solve(w, b, damp)
    out: dict[str, np.ndarray | None] = {}
    for n, (wn, bn) in zip(names, _split(w2, b2, [getattr(lp, n).shape[0] for n in names]), strict=True):
        out[n] = wn
        if has_bias:
            out[f"{n}_bias"] = bn
    return out


def sequential_reconstruct(
    args: ModelArgs,
    weights: ModelWeights,
    pruned: ModelWeights,
    sequences: list[np.ndarray],
    *,
    damp: float,
    sink_weight: float,
    inputs: bool = False,
    residual: bool = False,
    progress: Callable[[str], None] = lambda _m: None,
) -> ModelWeights:
    """`pruned` (the sliced model: same layers, kept rows and columns of `weights`) with every layer's
    o_proj / down_proj (and with `inputs` its q/k/v, gate/up) refitted layer by layer (module docstring)."""
    orig = ReferenceModel(args, weights, dtype=np.float64)
    new = ReferenceModel(args, pruned, dtype=np.float64)
    eps, d = args.rms_norm_eps, args.head_dim
    seqs = [np.asarray(s, np.int64) for s in sequences]
    pos = [np.arange(len(s)) for s in seqs]
    angles = {}
    for p in pos:
        for kind in RopeKind:
            angles.setdefault((len(p), kind), orig.rope_cos_sin(p, kind))
    xo = [orig.embed_rows(s) for s in seqs]  # the residual streams, one [T, H] per sequence
    xp = [new.embed_rows(s) for s in seqs]

    def drift(n: int, norm: np.ndarray | None) -> np.ndarray | float:
        """With `residual`, what the sublayer should add besides the unpruned output: the stream's error so
        far (only where its output enters the stream linearly, i.e. without a post-norm)."""
        return xo[n] - xp[n] if residual and norm is None else 0.0

    def refit(
        ctx: list[np.ndarray],
        target: list[np.ndarray],
        w: np.ndarray,
        b: np.ndarray | None,
        norm_o: np.ndarray | None,
        norm_p: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The projection refitted from the pruned rows `ctx` to the unpruned outputs `target`, and both
        residual streams advanced past it (each through its own post-norm, where the layer has one)."""
        fit = _Fit(w.shape[1], w.shape[0], b is not None, sink_weight)
        for n, (c, t) in enumerate(zip(ctx, target, strict=True)):
            fit.add(c, t + drift(n, norm_p))
        w2, b2 = fit.solve(w, b, damp)
        for n, (c, t) in enumerate(zip(ctx, target, strict=True)):
            xo[n] = xo[n] + post_norm(t, norm_o, eps)
            xp[n] = xp[n] + post_norm(c @ w2.T if b2 is None else c @ w2.T + b2, norm_p, eps)
        return w2, b2

    layers = []
    for i, (lo, lp) in enumerate(zip(orig.layers, new.layers, strict=True)):
        kind = args.rope_kind(i)
        changes: dict[str, np.ndarray | None] = {}

        ho = [rms_norm(x, lo.attn_norm, eps) for x in xo]
        hp = [rms_norm(x, lp.attn_norm, eps) for x in xp]
        if inputs:
            changes.update(_refit_inputs(("q", "k", "v"), ho, hp, lp, sink_weight, damp))
            lp = replace(lp, **changes)
        ctx_only = replace(lp, o=np.eye(lp.o.shape[1]), o_bias=None)  # the attention's rows before o_proj
        hkv_o, hkv_p = lo.num_kv_heads(d), lp.num_kv_heads(d)
        ctx, target = [], []
        for n, p in enumerate(pos):
            cos, sin = angles[(len(p), kind)]
            target.append(orig._attention(i, lo, ho[n], p, cos, sin, _cache(i, hkv_o, d, p)))
            ctx.append(new._attention(i, ctx_only, hp[n], p, cos, sin, _cache(i, hkv_p, d, p)))
        o, o_bias = refit(ctx, target, lp.o, lp.o_bias, lo.post_attn_norm, lp.post_attn_norm)
        changes.update(o=o, o_bias=o_bias)
        del ctx, target

        ho = [rms_norm(x, lo.mlp_norm, eps) for x in xo]
        hp = [rms_norm(x, lp.mlp_norm, eps) for x in xp]
        if inputs:
            up_changes = _refit_inputs(("gate", "up"), ho, hp, lp, sink_weight, damp)
            changes.update(up_changes)
            lp = replace(lp, **up_changes)
        ctx, target = [], []
        for n in range(len(pos)):
            target.append(orig._mlp(lo, ho[n]))
            g = hp[n] @ lp.gate.T if lp.gate_bias is None else hp[n] @ lp.gate.T + lp.gate_bias
            u = hp[n] @ lp.up.T if lp.up_bias is None else hp[n] @ lp.up.T + lp.up_bias
            ctx.append(new.act(g) * u)
        down, down_bias = refit(ctx, target, lp.down, lp.down_bias, lo.post_mlp_norm, lp.post_mlp_norm)
        changes.update(down=down, down_bias=down_bias)
        del ctx, target

        # biases the layer does not have stay None (copy_layer keeps the pruned layer's own)
        layers.append(copy_layer(pruned.layers[i], **{k: v for k, v in changes.items() if v is not None}))
        progress(f"  sequential reconstruction: layer {i + 1}/{len(orig.layers)}")
    return ModelWeights(pruned.embed, pruned.final_norm, pruned.lm_head, layers)
