"""Structured pruning to a smaller dense model: MLP channels and whole GQA head groups (docs/architecture.md §6).

Importance is activation-weighted on the calibration text. Input channel c of down_proj (an MLP
channel) or of o_proj (one dim of one query head) adds the rank-1 term X[:, c] W[:, c]^T to the
residual stream, whose norm is

    score_c = ||X[:, c]||_2 * ||W[:, c]||_2           (Wanda's |W| * ||X||, taken per whole channel)

A removal *chunk* is `unit` MLP channels, or the `m` KV heads (each with its G query heads) whose
o_proj columns make a multiple of `unit`; it scores the sum over its channels. Chunks are removed
globally, cheapest score per parameter first, until `ratio` of the prunable parameters (every
attention and MLP weight) is gone. Every chunk is in the same units (the residual stream), so one
ranking spans layers and both kinds; within a layer chunks go in ascending order, at least one
chunk of each kind stays, and pruned widths are multiples of `unit` (32, or the INT4 block) so the
result stays quantizable. The result is a plain `ModelWeights` whose layers may differ in width;
the reference and the graph builder read widths from the weight shapes.

Reconstruction (`reconstruct`, on by default): removing input channels of o_proj / down_proj drops
their contribution X_c W_c^T; the kept columns are then refitted by least squares on the calibration
statistics, W' = argmin ||X W^T - X_k W'^T||^2 + lam ||W' - W[:, k]||^2, i.e.
(G_kk + lam I) W'^T = G_k: W^T + lam W[:, k]^T with G = X^T X of the unpruned model's inputs (one shot:
every layer is refitted on the unpruned model's activations, no re-calibration between layers). The
damping pulls toward the plainly sliced weights rather than toward zero, so the refit can never raise
the objective above slicing's (the damped objective at the solution is at most slicing's, whose damping
term is 0). Where the projection has a bias (Llama's attention_bias / mlp_bias) it is refitted with the
weights (a constant input column), which moves the dropped channels' mean contribution into the bias.

`prune_to_budget` finds the largest global ratio whose calibration perplexity stays within a budget,
by bisection over the same ranking (a global cut gives every layer its own ratio).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import numpy as np

from edge_runtime.errors import ExportError
from edge_runtime.models import LayerWeights, ModelArgs, ModelWeights

from .calibrate import InputStats, LinearInputs, copy_layer
from .prune_layers import BlockStats, choose_layers, layer_scores
from .prune_sequential import sequential_reconstruct

# lam = RECON_DAMP x the mean diagonal of G_kk, as GPTQ damps its Hessian: scale-free, and enough to
# make a rank-deficient G_kk (fewer distinct calibration rows than channels, or dead channels)
# solvable without noticeably biasing a well-conditioned one.
RECON_DAMP = 0.01
# Each sequence's first-token row (the attention sink every later query reads) counts once more per
# later token, as in GPTQ (quant_model.GPTQ_SINK_WEIGHT): an error on that row reaches every position.
RECON_SINK_WEIGHT = 1.0
BUDGET_STEPS = 7  # bisection steps over (0, max ratio): a resolution of max/128, ~0.007 of the parameters


class Reconstruction(str, Enum):
    """How the pruned layers are refitted after slicing."""

    NONE = "none"  # plain slicing
    ONE_SHOT = "one-shot"  # o_proj / down_proj on the unpruned model's calibration X^T X (`reconstruct`)
    SEQUENTIAL = "sequential"  # layer by layer on the pruned model's own inputs (prune_sequential.py)
    SEQUENTIAL_ALL = "sequential-all"  # the same, q/k/v and gate/up refitted too
    SEQUENTIAL_RESIDUAL = "sequential-residual"  # o/down also take up the residual stream's drift


@dataclass(frozen=True)
class PruneConfig:
    ratio: float  # fraction of the attention + MLP parameters to remove as channels and heads (0: none)
    unit: int = 32  # pruned widths are multiples of this
    reconstruction: Reconstruction = Reconstruction.ONE_SHOT
    layers: int = 0  # whole layers removed besides (prune_layers.py), chosen by score

    def __post_init__(self) -> None:
        if not (isinstance(self.ratio, (int, float)) and 0 <= self.ratio < 1 and (self.ratio > 0 or self.layers)):
            raise ExportError(
                f"prune ratio {self.ratio!r} must be in (0, 1): the fraction of attention and MLP parameters "
                f"to remove (e.g. --prune 0.25)"
            )
        if not isinstance(self.layers, int) or self.layers < 0:
            raise ExportError(f"layers to prune {self.layers!r} must be a whole number, 0 or more")
        if self.layers and self.reconstruction is not Reconstruction.ONE_SHOT:
            raise ExportError("whole-layer pruning refits down_proj one-shot; it takes no other reconstruction")
        if self.unit < 1:
            raise ExportError(f"pruning unit {self.unit} must be a positive number of channels")
        if not isinstance(self.reconstruction, Reconstruction):
            choices = ", ".join(r.value for r in Reconstruction)
            raise ExportError(f"pruning reconstruction {self.reconstruction!r} is not one of: {choices}")

    @property
    def sequential(self) -> bool:
        return self.reconstruction.value.startswith("sequential")


@dataclass(frozen=True)
class _Chunk:
    layer: int
    kind: str  # "mlp" (channel indices) | "heads" (KV head indices)
    index: np.ndarray
    score: float
    params: int


def _chunks(order: np.ndarray, total: int, step: int, keep_min: int) -> list[np.ndarray]:
    """Ascending-importance chunks of `order`: first `total % step` items (so the rest is a multiple
    of `step`), then `step` at a time, never touching the last `keep_min` items."""
    sizes = ([total % step] if total % step else []) + [step] * ((total - total % step) // step)
    out, pos = [], 0
    for n in sizes:
        if total - pos - n < keep_min:
            break
        out.append(order[pos : pos + n])
        pos += n
    return out


def _layer_chunks(i: int, lw: LayerWeights, acts: LinearInputs, d: int, unit: int) -> list[list[_Chunk]]:
    h = lw.q.shape[1]
    inter = lw.down.shape[1]
    ch = acts.down[i].column_norms * np.linalg.norm(lw.down, axis=0)  # [I]
    per_channel = 3 * h  # weights only (biases are noise): the same count as `prunable` below
    mlp = [
        _Chunk(i, "mlp", idx, float(ch[idx].sum()), per_channel * len(idx))
        for idx in _chunks(np.argsort(ch, kind="stable"), inter, unit, unit)
    ]

    hq, hkv = lw.num_heads(d), lw.num_kv_heads(d)
    grp = hq // hkv
    col = acts.o[i].column_norms * np.linalg.norm(lw.o, axis=0)  # [Hq*D], grouped by KV head
    head = col.reshape(hkv, grp * d).sum(axis=1)
    m = unit // math.gcd(unit, grp * d)  # fewest KV heads whose o_proj columns are a multiple of unit
    per_head = (2 * grp + 2) * d * h  # q, o: G*D*H each; k, v: D*H each
    heads = [
        _Chunk(i, "heads", idx, float(head[idx].sum()), per_head * len(idx))
        for idx in _chunks(np.argsort(head, kind="stable"), hkv, m, m)
    ]
    return [mlp, heads]


@dataclass(frozen=True)
class Ranking:
    """Every layer's removal chunks, ascending importance within a layer (computed once per model)."""

    queues: list[list[_Chunk]]
    prunable: int  # attention + MLP weights of the unpruned model

    @property
    def max_ratio(self) -> float:
        """The most a cut of this ranking's chunks removes (layers removed whole not counted)."""
        return sum(c.params for q in self.queues for c in q) / self.prunable


def rank(
    args: ModelArgs, weights: ModelWeights, acts: LinearInputs, unit: int, skip: frozenset[int] = frozenset()
) -> Ranking:
    """`skip`: layers removed whole, whose chunks are not candidates (their parameters count as gone)."""
    d = args.head_dim
    queues = [q for i, lw in enumerate(weights.layers) if i not in skip for q in _layer_chunks(i, lw, acts, d, unit)]
    return Ranking(queues, sum(_prunable(lw) for lw in weights.layers))


def _prunable(lw: LayerWeights) -> int:
    return sum(getattr(lw, f).size for f in ("q", "k", "v", "o", "gate", "up", "down"))


def _select(ranking: Ranking, target: float) -> tuple[dict[tuple[int, str], list[np.ndarray]], int]:
    """Chunks removed globally, cheapest score per parameter first, until `target` parameters are gone."""
    queues = ranking.queues
    heap = [(q[0].score / q[0].params, n, 0) for n, q in enumerate(queues) if q]
    heapq.heapify(heap)
    removed: dict[tuple[int, str], list[np.ndarray]] = {}
    gone = 0
    while gone < target and heap:
        _, n, k = heapq.heappop(heap)
        c = queues[n][k]
        removed.setdefault((c.layer, c.kind), []).append(c.index)
        gone += c.params
        if k + 1 < len(queues[n]):
            nxt = queues[n][k + 1]
            heapq.heappush(heap, (nxt.score / nxt.params, n, k + 1))
    return removed, gone


def prune_model(
    args: ModelArgs,
    weights: ModelWeights,
    acts: LinearInputs,
    config: PruneConfig,
    progress: Callable[[str], None] = lambda _m: None,
    ranking: Ranking | None = None,
    sequences: list[np.ndarray] | None = None,
    blocks: BlockStats | None = None,
) -> tuple[ModelWeights, dict[str, Any]]:
    """`sequences`: the calibration token sequences, which sequential reconstruction runs through both
    models (the others read `acts` only). `blocks`: whole-layer pruning's statistics (config.layers > 0).
    The result may have fewer layers than `args` says: `pruned_args` gives the matching ModelArgs."""
    d = args.head_dim
    if config.sequential and not sequences:
        raise ExportError(f"{config.reconstruction.value} reconstruction needs the calibration sequences")
    scores: dict[int, float] = {}
    if config.layers:
        if blocks is None:  # a caller bug: the calibration pass was not asked for them
            raise ValueError("whole-layer pruning needs the BlockStats of the calibration pass")
        scores = layer_scores(blocks)
    dropped = frozenset(choose_layers(scores, config.layers)) if config.layers else frozenset()
    ranking = ranking or rank(args, weights, acts, config.unit, skip=dropped)
    prunable = ranking.prunable
    removed, gone = _select(ranking, config.ratio * prunable)
    if gone < config.ratio * prunable:
        raise ExportError(
            f"prune ratio {config.ratio} is not reachable: keeping one {config.unit}-wide chunk of MLP channels and "
            f"of heads per layer allows at most {gone / prunable:.2f}; use a smaller --prune"
        )

    layers = []
    for i, lw in enumerate(weights.layers):
        if i in dropped:
            continue
        drop_ch = np.concatenate(removed.get((i, "mlp"), [np.zeros(0, int)]))
        drop_kv = np.concatenate(removed.get((i, "heads"), [np.zeros(0, int)]))
        refit = (acts.o[i], acts.down[i]) if config.reconstruction is Reconstruction.ONE_SHOT else None
        absorb = None
        if i + 1 in dropped:  # this layer's down_proj takes up the removed block's contribution
            absorb = (blocks.cross[i + 1], blocks.delta_sum[i + 1])
        layers.append(_slice_layer(lw, d, drop_ch, drop_kv, refit, absorb))
    pruned = ModelWeights(weights.embed, weights.final_norm, weights.lm_head, layers)
    if config.sequential:
        t0 = time.perf_counter()
        pruned = sequential_reconstruct(
            args, weights, pruned, sequences, damp=RECON_DAMP, sink_weight=RECON_SINK_WEIGHT,
            inputs=config.reconstruction is Reconstruction.SEQUENTIAL_ALL,
            residual=config.reconstruction is Reconstruction.SEQUENTIAL_RESIDUAL, progress=progress,
        )  # fmt: skip
        seconds = round(time.perf_counter() - t0, 2)
    after = sum(_prunable(lw) for lw in layers)
    record = {
        "ratio": config.ratio,
        "removed": round(1 - after / prunable, 4),
        "unit": config.unit,
        "importance": "||X[:, c]|| * ||W[:, c]|| of o_proj / down_proj input channels on the calibration text",
        "reconstruction": _reconstruction_record(config, sequences, seconds if config.sequential else None),
        "prunable_parameters_before": int(prunable),
        "prunable_parameters_after": int(after),
        "layers_removed": sorted(dropped),
        "intermediate_size": [lw.down.shape[1] for lw in layers],
        "num_heads": [lw.num_heads(d) for lw in layers],
        "num_kv_heads": [lw.num_kv_heads(d) for lw in layers],
    }
    if config.layers:
        record["layer_scores"] = {str(k): round(v, 6) for k, v in sorted(scores.items())}
        record["layer_importance"] = (
            "mean over the calibration tokens (each sequence's first left out) of ||block output||^2 / ||residual "
            "stream after it||^2 (prune_layers.py)"
        )
    gone_layers = f", layers {sorted(dropped)} removed" if dropped else ""
    progress(
        f"pruned {1 - after / prunable:.1%} of attention+MLP parameters{gone_layers}: MLP widths "
        f"{record['intermediate_size']}, KV heads {record['num_kv_heads']}"
    )
    return pruned, record


def pruned_args(args: ModelArgs, weights: ModelWeights) -> ModelArgs:
    """`args` with the layer count of `weights` (whole-layer pruning removes some)."""
    return args if len(weights.layers) == args.num_layers else replace(args, num_layers=len(weights.layers))


_RECON_METHODS = {
    Reconstruction.ONE_SHOT: "least squares of o_proj / down_proj on the kept inputs' calibration X^T X of the "
    "unpruned model (bias refitted where the projection has one)",
    Reconstruction.SEQUENTIAL: "least squares of o_proj / down_proj, layer by layer, from the pruned model's own "
    "inputs to the unpruned model's outputs on the calibration sequences",
    Reconstruction.SEQUENTIAL_RESIDUAL: "least squares of o_proj / down_proj, layer by layer, from the pruned "
    "model's own inputs to the unpruned model's outputs plus the residual stream's error so far",
    Reconstruction.SEQUENTIAL_ALL: "least squares of every Linear, layer by layer, from the pruned model's own "
    "inputs to the unpruned model's outputs on the calibration sequences",
}


def _reconstruction_record(
    config: PruneConfig, sequences: list[np.ndarray] | None, seconds: float | None
) -> dict[str, Any] | None:
    if config.reconstruction is Reconstruction.NONE:
        return None
    rec: dict[str, Any] = {
        "kind": config.reconstruction.value,
        "method": _RECON_METHODS[config.reconstruction],
        "damp": RECON_DAMP,
        "sink_weight": RECON_SINK_WEIGHT,
    }
    if config.sequential:
        rec.update(tokens=int(sum(len(s) for s in sequences)), seconds=seconds)
    return rec


def prune_to_budget(
    args: ModelArgs,
    weights: ModelWeights,
    acts: LinearInputs,
    budget_pct: float,
    evaluate: Callable[[ModelWeights], float],
    unit: int = 32,
    reconstruction: Reconstruction = Reconstruction.ONE_SHOT,
    progress: Callable[[str], None] = lambda _m: None,
    sequences: list[np.ndarray] | None = None,
    blocks: BlockStats | None = None,
) -> tuple[ModelWeights, dict[str, Any]]:
    """The most pruning whose `evaluate` (calibration perplexity) is at most (1 + budget_pct/100) x the
    unpruned model's. With `blocks` (one-shot reconstruction), whole layers first: the next-cheapest layer
    by score while the budget holds (one evaluation each; on SmolLM2-135M a layer with its refit cost less
    held-out perplexity per parameter than channels did). Then channels and heads of the layers left, by
    BUDGET_STEPS bisection steps over (0, the ranking's maximum): 1 + BUDGET_STEPS evaluations at most
    (fewer where two ratios select the same chunks). Perplexity need not be monotone in the ratio; the
    result is always a measured point within the budget."""
    if not (isinstance(budget_pct, (int, float)) and budget_pct > 0):
        raise ExportError(f"prune budget {budget_pct!r} must be a positive percentage (e.g. --prune-budget 10)")
    t0 = time.perf_counter()
    base = evaluate(weights)
    limit = base * (1 + budget_pct / 100)
    progress(f"prune budget: calibration perplexity {base:.3f}, at most {limit:.3f} (+{budget_pct:g}%)")
    best: tuple[ModelWeights, dict[str, Any], float] | None = None
    trials: list[dict[str, float]] = []
    layers = 0
    scores = layer_scores(blocks) if blocks is not None and blocks.cross else {}
    while scores and reconstruction is Reconstruction.ONE_SHOT:
        try:
            choose_layers(scores, layers + 1)
        except ExportError:  # no further layer can go
            break
        config = PruneConfig(0.0, unit, reconstruction, layers=layers + 1)
        cand, record = prune_model(args, weights, acts, config, blocks=blocks)
        ppl = evaluate(cand)
        trials.append({"layers": layers + 1, "removed": record["removed"], "calibration_ppl": round(ppl, 4)})
        progress(f"  layers {record['layers_removed']} removed: calibration perplexity {ppl:.3f}")
        if ppl > limit:
            break
        layers, best = layers + 1, (cand, record, ppl)
    dropped = frozenset(choose_layers(scores, layers)) if layers else frozenset()
    ranking = rank(args, weights, acts, unit, skip=dropped)
    lo, hi = 0.0, ranking.max_ratio
    seen: dict[int, float] = {}  # parameters removed -> perplexity (two ratios may select the same chunks)
    for _ in range(BUDGET_STEPS):
        mid = (lo + hi) / 2
        gone = _select(ranking, mid * ranking.prunable)[1]
        ppl = seen.get(gone)
        if ppl is None:  # a new selection: prune (and reconstruct) only then
            config = PruneConfig(mid, unit, reconstruction, layers=layers)
            cand, record = prune_model(
                args, weights, acts, config, ranking=ranking, sequences=sequences, blocks=blocks
            )  # fmt: skip
            ppl = seen[gone] = evaluate(cand)
            trials.append(
                {
                    "ratio": round(mid, 4),
                    "layers": layers,
                    "removed": record["removed"],
                    "calibration_ppl": round(ppl, 4),
                }
            )
            progress(f"  ratio {mid:.3f} (removed {record['removed']:.1%}): calibration perplexity {ppl:.3f}")
            if ppl <= limit and (best is None or record["removed"] > best[1]["removed"]):
                best = (cand, record, ppl)
        if ppl <= limit:
            lo = mid
        else:
            hi = mid
    if best is None:
        raise ExportError(
            f"no pruning stays within +{budget_pct:g}% calibration perplexity: removing "
            f"{trials[-1]['removed']:.1%} already gives {trials[-1]['calibration_ppl']:.3f} against {base:.3f}; "
            f"raise --prune-budget or drop it"
        )
    pruned, record, ppl = best
    record["budget"] = {
        "budget_pct": budget_pct,
        "evaluations": len(trials) + 1,
        "trials": trials,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    record["calibration_ppl"] = calibration_record(base, ppl)
    progress(
        f"prune budget: removed {record['removed']:.1%} of attention+MLP parameters, calibration perplexity "
        f"{base:.3f} -> {ppl:.3f} ({100 * (ppl / base - 1):+.2f}%), {len(trials) + 1} evaluations"
    )
    return pruned, record


def calibration_record(before: float, after: float) -> dict[str, float]:
    return {"unpruned": round(before, 4), "pruned": round(after, 4), "change_pct": round(100 * (after / before - 1), 3)}


def reconstruct(
    w: np.ndarray,
    stats: InputStats,
    keep: np.ndarray,
    bias: np.ndarray | None = None,
    damp: float = RECON_DAMP,
    sink_weight: float = RECON_SINK_WEIGHT,
    absorb: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """W' [out, len(keep)] (and the refitted bias) minimising ||X W^T + b + D - X_k W'^T - b'||^2 +
    lam ||W' - W[:, keep]||^2 over the (sink-weighted) calibration rows X of `stats`; D is 0, or with
    `absorb` = (X^T D [K, out], the sum of D's rows [out]) a removed block's output (prune_layers.py)."""
    w = np.asarray(w, dtype=np.float64)
    g_k = stats.gram[keep]  # [k, K]: only the kept rows of G, never a second full copy
    if sink_weight:
        s = np.asarray(stats.sinks).reshape(-1, stats.gram.shape[0])
        g_k = g_k + sink_weight * (s[:, keep].T @ s)
    z = g_k[:, keep]
    rhs = g_k @ w.T  # [k, out]
    if absorb is not None:
        rhs = rhs + absorb[0][keep]
    prior = w[:, keep].T
    lam = damp * float(np.mean(np.diag(z)))
    damping = np.full(len(keep), lam)
    if bias is not None:
        b = np.asarray(bias, dtype=np.float64)
        col = stats.col_sum + sink_weight * stats.sink_sum  # the constant column's products with X
        n = stats.rows + sink_weight * (stats.rows - len(stats.sinks))  # sum of (T - 1) = rows - sequences
        z = np.block([[z, col[keep][:, None]], [col[keep][None, :], np.array([[n]])]])
        extra = 0.0 if absorb is None else absorb[1]
        rhs = np.vstack([rhs + np.outer(col[keep], b), (col @ w.T + n * b + extra)[None, :]])
        prior = np.vstack([prior, b[None, :]])
        damping = np.append(damping, 0.0)  # n > 0 rows: the constant column needs none
    sol = np.linalg.solve(z + np.diag(damping), rhs + damping[:, None] * prior)
    if bias is not None:
        return sol[:-1].T, sol[-1]
    return sol.T, None


def _slice_layer(
    lw: LayerWeights,
    d: int,
    drop_ch: np.ndarray,
    drop_kv: np.ndarray,
    refit: tuple[InputStats, InputStats] | None = None,  # o_proj's and down_proj's input statistics
    absorb: tuple[np.ndarray, np.ndarray] | None = None,  # a removed next block's X^T D and D's row sum
) -> LayerWeights:
    keep_ch = np.setdiff1d(np.arange(lw.down.shape[1]), drop_ch)
    hq, hkv = lw.num_heads(d), lw.num_kv_heads(d)
    grp = hq // hkv
    keep_kv = np.setdiff1d(np.arange(hkv), drop_kv)
    q_rows = (keep_kv[:, None] * grp * d + np.arange(grp * d)[None, :]).reshape(-1)  # query heads of kept groups
    kv_rows = (keep_kv[:, None] * d + np.arange(d)[None, :]).reshape(-1)

    def rows(a: np.ndarray | None, idx: np.ndarray) -> np.ndarray | None:
        return None if a is None else np.asarray(a)[idx]

    o, o_bias = np.asarray(lw.o)[:, q_rows], lw.o_bias
    down, down_bias = np.asarray(lw.down)[:, keep_ch], lw.down_bias
    if refit is not None and len(drop_kv):
        o, o_bias = reconstruct(lw.o, refit[0], q_rows, lw.o_bias)
    if refit is not None and (len(drop_ch) or absorb is not None):
        down, down_bias = reconstruct(lw.down, refit[1], keep_ch, lw.down_bias, absorb=absorb)
    return copy_layer(
        lw,
        q=rows(lw.q, q_rows),
        k=rows(lw.k, kv_rows),
        v=rows(lw.v, kv_rows),
        o=o,
        o_bias=lw.o_bias if o_bias is None else o_bias,
        q_bias=rows(lw.q_bias, q_rows),
        k_bias=rows(lw.k_bias, kv_rows),
        v_bias=rows(lw.v_bias, kv_rows),
        gate=rows(lw.gate, keep_ch),
        up=rows(lw.up, keep_ch),
        down=down,
        down_bias=lw.down_bias if down_bias is None else down_bias,
        gate_bias=rows(lw.gate_bias, keep_ch),
        up_bias=rows(lw.up_bias, keep_ch),
    )
