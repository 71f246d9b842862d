"""Whole-layer pruning (docs/architecture.md §6): a decoder block removed, what it added to the residual
stream absorbed by the previous block's down_proj.

Removing block l deletes its contribution D_l = h_(l+1) - h_l from the residual stream h. The block
before it adds X W^T there (X: its down_proj inputs, W: down_proj), so W is refitted to add D_l too:

    W' = argmin ||X W'^T - (X W^T + D_l)||^2 + lam ||W' - W||^2,   (G + lam I) W'^T = G W^T + C_l + lam W^T

with G = X^T X (the statistics channel pruning already holds) and C_l = X^T D_l, gathered in the same
calibration pass (`BlockStats`); the rows are sink-weighted as every refit here (prune.RECON_SINK_WEIGHT).
This is ReplaceMe's linear replacement of a block (Shopkhoev et al. 2025), folded into down_proj, without
training. Layers are ranked by how much a block changes each token's stream, relative to the stream
(the next block reads it through an RMSNorm, so a change matters relative to the token's norm), over
every token but each sequence's first:

    score_l = mean_t ||D_l,t||^2 / ||h_(l+1),t||^2        (ShortGPT's block influence, in squared norms)

The first token is left out because on SmolLM2-135M a few blocks write "massive activations" of 1e4
times the typical norm into it: by energy those blocks looked cheapest (the refit carries their share
almost exactly), yet removing them destroys the model (+2,654% to +186,018% held-out perplexity).
What the refit cannot carry, in energy, ranked worse than this score too (layer 1 came first).

Layer 0 always stays: nothing before it can absorb it. No two adjacent layers go: C_l is measured against
the unpruned previous block's inputs, so that block must stay. Models whose MLP output is normed before
the residual add (Gemma's sandwich norms) are refused: a refitted down_proj cannot add D_l there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edge_runtime.errors import ExportError
from edge_runtime.models import ModelArgs


@dataclass
class BlockStats:
    """Per layer l >= 1: C_l = X_(down, l-1)^T D_l and the sum of D_l's rows over the calibration rows (each
    sequence's first row counted once more per later token, as in InputStats), and score_l."""

    sink_weight: float
    cross: dict[int, np.ndarray] = field(default_factory=dict)  # l -> [I_(l-1), H] float64
    delta_sum: dict[int, np.ndarray] = field(default_factory=dict)  # l -> [H] float64 (a refitted bias's share)
    relative_change: dict[int, float] = field(default_factory=dict)  # l -> score_l
    _prev_rows: list[np.ndarray] | None = None
    _prev_layer: int = -1

    def add_layer(self, i: int, before: list[np.ndarray], after: list[np.ndarray], down_rows: list[np.ndarray]) -> None:
        """Layer i ran: each sequence's residual stream before and after it, and its down_proj inputs."""
        if self._prev_rows is not None and self._prev_layer == i - 1:
            cross, total, rel, count = 0.0, 0.0, 0.0, 0
            for x, h0, h1 in zip(self._prev_rows, before, after, strict=True):
                x32 = np.asarray(x, np.float32).reshape(-1, x.shape[-1])
                d32 = np.asarray(h1 - h0, np.float32).reshape(-1, h0.shape[-1])
                w = self.sink_weight * (x32.shape[0] - 1)  # the first row again per later token (input_stats)
                cross = cross + (x32.T @ d32).astype(np.float64) + w * np.outer(x32[0], d32[0]).astype(np.float64)
                total = total + d32.sum(axis=0, dtype=np.float64) + w * d32[0].astype(np.float64)
                h = np.asarray(h1, np.float64).reshape(-1, h1.shape[-1])[1:]
                change = np.square(d32[1:], dtype=np.float64).sum(axis=1) / np.maximum(np.square(h).sum(axis=1), 1e-300)
                rel, count = rel + float(change.sum()), count + len(change)
            self.cross[i], self.delta_sum[i] = cross, total
            self.relative_change[i] = rel / max(count, 1)
        self._prev_rows, self._prev_layer = down_rows, i

    def finish(self) -> None:
        self._prev_rows = None  # the last layer's down inputs: no block after it to absorb


def layer_scores(blocks: BlockStats) -> dict[int, float]:
    """score_l for every layer l >= 1 (lower: cheaper to remove)."""
    return dict(blocks.relative_change)


def choose_layers(scores: dict[int, float], count: int) -> list[int]:
    """The `count` lowest-scored layers taken greedily, skipping a neighbour of one taken (a removed block is
    taken up by the down_proj of the block before it, whose inputs C_l is measured against), in the order
    chosen: the choice for k layers is a prefix of the one for k + 1, which the budget search relies on."""
    chosen: list[int] = []
    for layer in sorted(scores, key=lambda i: (scores[i], i)):
        if len(chosen) == count:
            break
        if layer - 1 not in chosen and layer + 1 not in chosen:
            chosen.append(layer)
    if len(chosen) < count:
        raise ExportError(
            f"cannot remove {count} layers: taken by score, at most {len(chosen)} of {len(scores) + 1} can go "
            "(never the first, never two adjacent ones)"
        )
    return chosen


def check_layer_pruning(args: ModelArgs, count: int) -> None:
    """Refuse whole-layer pruning where the layer index means something beyond the weights."""
    if count < 0:
        raise ExportError(f"--prune-layers {count}: give a number of layers to remove, 0 or more")
    if count and (args.local_layers or args.nope_layers):
        kinds = "local and global" if args.local_layers else "RoPE and NoPE"
        raise ExportError(
            f"--prune-layers: {args.model_type} interleaves {kinds} layers by index, which removing a "
            "layer would shift; prune its channels (--prune) instead"
        )
    if count and args.sandwich_norms:
        raise ExportError(
            f"--prune-layers: {args.model_type} norms each block's MLP output before adding it to the residual "
            "stream, so the previous block cannot take a removed one over; prune its channels (--prune) instead"
        )
    most = args.num_layers // 2  # layers 1..L-1, no two adjacent
    if count > most:
        raise ExportError(
            f"--prune-layers {count}: the model has {args.num_layers} layers, of which at most {most} can go "
            "(never the first, never two adjacent ones)"
        )


def supports_layer_pruning(args: ModelArgs) -> bool:
    """Whether whole layers are candidates at all (what --prune-budget considers)."""
    return args.num_layers > 1 and not args.local_layers and not args.nope_layers and not args.sandwich_norms
