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
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_runtime.errors import ExportError
from edge_runtime.models import LayerWeights, ModelArgs, ModelWeights

from .calibrate import LinearInputs, copy_layer


@dataclass(frozen=True)
class PruneConfig:
    ratio: float  # fraction of the attention + MLP parameters to remove
    unit: int = 32  # pruned widths are multiples of this

    def __post_init__(self) -> None:
        if not (isinstance(self.ratio, (int, float)) and 0 < self.ratio < 1):
            raise ExportError(
                f"prune ratio {self.ratio!r} must be in (0, 1): the fraction of attention and MLP parameters "
                f"to remove (e.g. --prune 0.25)"
            )
        if self.unit < 1:
            raise ExportError(f"pruning unit {self.unit} must be a positive number of channels")


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


def prune_model(
    args: ModelArgs,
    weights: ModelWeights,
    acts: LinearInputs,
    config: PruneConfig,
    progress: Callable[[str], None] = lambda _m: None,
) -> tuple[ModelWeights, dict[str, Any]]:
    d = args.head_dim
    queues = [q for i, lw in enumerate(weights.layers) for q in _layer_chunks(i, lw, acts, d, config.unit)]
    prunable = sum(
        sum(getattr(lw, f).size for f in ("q", "k", "v", "o", "gate", "up", "down")) for lw in weights.layers
    )
    target = config.ratio * prunable
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
    if gone < target:
        raise ExportError(
            f"prune ratio {config.ratio} is not reachable: keeping one {config.unit}-wide chunk of MLP channels and "
            f"of heads per layer allows at most {gone / prunable:.2f}; use a smaller --prune"
        )

    layers = []
    for i, lw in enumerate(weights.layers):
        drop_ch = np.concatenate(removed.get((i, "mlp"), [np.zeros(0, int)]))
        drop_kv = np.concatenate(removed.get((i, "heads"), [np.zeros(0, int)]))
        layers.append(_slice_layer(lw, d, drop_ch, drop_kv))
    pruned = ModelWeights(weights.embed, weights.final_norm, weights.lm_head, layers)
    after = sum(sum(getattr(lw, f).size for f in ("q", "k", "v", "o", "gate", "up", "down")) for lw in layers)
    record = {
        "ratio": config.ratio,
        "unit": config.unit,
        "importance": "||X[:, c]|| * ||W[:, c]|| of o_proj / down_proj input channels on the calibration text",
        "prunable_parameters_before": int(prunable),
        "prunable_parameters_after": int(after),
        "intermediate_size": [lw.down.shape[1] for lw in layers],
        "num_heads": [lw.num_heads(d) for lw in layers],
        "num_kv_heads": [lw.num_kv_heads(d) for lw in layers],
    }
    progress(
        f"pruned {1 - after / prunable:.1%} of attention+MLP parameters: MLP widths {record['intermediate_size']}, "
        f"KV heads {record['num_kv_heads']}"
    )
    return pruned, record


def _slice_layer(lw: LayerWeights, d: int, drop_ch: np.ndarray, drop_kv: np.ndarray) -> LayerWeights:
    keep_ch = np.setdiff1d(np.arange(lw.down.shape[1]), drop_ch)
    hq, hkv = lw.num_heads(d), lw.num_kv_heads(d)
    grp = hq // hkv
    keep_kv = np.setdiff1d(np.arange(hkv), drop_kv)
    q_rows = (keep_kv[:, None] * grp * d + np.arange(grp * d)[None, :]).reshape(-1)  # query heads of kept groups
    kv_rows = (keep_kv[:, None] * d + np.arange(d)[None, :]).reshape(-1)

    def rows(a: np.ndarray | None, idx: np.ndarray) -> np.ndarray | None:
        return None if a is None else np.asarray(a)[idx]

    return copy_layer(
        lw,
        q=rows(lw.q, q_rows),
        k=rows(lw.k, kv_rows),
        v=rows(lw.v, kv_rows),
        o=np.asarray(lw.o)[:, q_rows],
        q_bias=rows(lw.q_bias, q_rows),
        k_bias=rows(lw.k_bias, kv_rows),
        v_bias=rows(lw.v_bias, kv_rows),
        gate=rows(lw.gate, keep_ch),
        up=rows(lw.up, keep_ch),
        down=np.asarray(lw.down)[:, keep_ch],
        gate_bias=rows(lw.gate_bias, keep_ch),
        up_bias=rows(lw.up_bias, keep_ch),
    )
