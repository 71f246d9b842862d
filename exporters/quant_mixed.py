"""Mixed precision: which fused Linear groups of an INT4 export stay INT8 per output channel (--mixed).

The unit is the fused group the `ort` graph runs as one matmul (blocks_ort.py): per layer qkv, o, gate_up
and down; a group is INT8 or INT4 as a whole, so MatMulNBits (bits 8 / 4) and --kernel edge (MatMulQ8 /
MatMulQ4) each see one precision per product. INT8 is per output channel, which every writer holds
(MatMulNBits, MatMulQ8, the trt flavor's DequantizeLinear axis 1).

Plans (quant.MixedPlan):
  llama-down   down_proj in llama.cpp Q4_K_M's Q6_K layers (use_more_bits below), no calibration needed.
  sensitivity  a greedy knapsack on a calibration proxy within QuantConfig.mixed_bits code bits per Linear
               weight (default MIXED_CODE_BITS, 4.5).

The sensitivity proxy, per group g of layer i, from the calibration Gram matrices alone (no extra forward):

    score(g) = rel(g)^2 * E(block of g)

rel(g)^2 = ||X dW^T||^2 / ||X W^T||^2 is the INT4 rounding's relative output error energy over the group's
stacked outputs (the Gram matrix of q/k/v sink-weighted, as GPTQ's: the first token's key and value are
read by every later query), and E is the per-token energy of the block's output that g feeds (the
attention block's o_proj output for qkv and o, the MLP's down_proj output for gate_up and down). A relative
error in v, o or down carries through linearly to the block's output, and in gate/up nearly so, so the
product estimates the squared error g's rounding adds to the residual stream, in the same units for every
layer and group. INT8 leaves ~1/16 of INT4's step, so the INT8 error is neglected and each group buys
score(g) for 4 extra bits on each of its weights: groups are taken by score per weight, largest first,
while they fit the budget. What the proxy leaves out: how later layers amplify or damp an error, and the
nonlinear path of q/k through softmax; the held-out measurement (docs/benchmarks/quality.md) is what judges the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_runtime.models import LayerWeights

from .calibrate import InputStats, LayerInputs
from .quant import MIXED_CODE_BITS, MixedPlan, QuantizedMatrix

GROUPS: dict[str, tuple[str, ...]] = {"qkv": ("q", "k", "v"), "o": ("o",), "gate_up": ("gate", "up"), "down": ("down",)}
SINK_WEIGHTED = ("qkv",)  # groups whose error at the first token reaches every later position


def llama_use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits (llama-quant.cpp): the layers whose attn_v / ffn_down Q4_K_M makes Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _energy(stats: InputStats, w: np.ndarray, gram: np.ndarray | None = None) -> float:
    g = stats.gram if gram is None else gram
    w = np.asarray(w, dtype=np.float64)
    return float(((w @ g) * w).sum())


def layer_scores(
    lw: LayerWeights,
    int4: Mapping[str, QuantizedMatrix],
    x: LayerInputs,
    sink_weight: float,
    energies: Mapping[str, tuple[float, float]] | None = None,
) -> dict[str, float]:
    """score(g) of the module docstring for each group of one layer, from its INT4 forms `int4[linear]` and its
    calibration statistics: computed as the layer is quantized, so no layer's statistics outlive it.
    `energies`: a Linear's (||X dW^T||^2, ||X W^T||^2) over the plain Gram matrix where already computed (the
    record's output errors, InputStats.output_energies), used instead of computing them again: at the 1B shape
    each of down_proj's is a [2048, 8192] x [8192, 8192] float64 product."""
    energies = energies or {}

    def pair(f: str, gram: np.ndarray, plain: bool) -> tuple[float, float]:
        if plain and f in energies:
            return energies[f]
        stats, w = x.of(f), getattr(lw, f)
        return _energy(stats, int4[f].dequantize() - w, gram), _energy(stats, w, gram)

    def output(f: str) -> float:  # the block output energy per token that g feeds
        total = energies[f][1] if f in energies else _energy(x.of(f), getattr(lw, f))
        return total / max(x.of(f).rows, 1)

    block_energy = {"attn": output("o"), "mlp": output("down")}
    scores = {}
    for group, parts in GROUPS.items():
        stats = x.of(parts[0])
        plain = group not in SINK_WEIGHTED
        gram = stats.gram if plain else stats.sink_weighted(sink_weight)
        pairs = [pair(f, gram, plain) for f in parts]
        err, ref = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        block = "attn" if group in ("qkv", "o") else "mlp"
        scores[group] = (err / ref if ref > 0 else 0.0) * block_energy[block]
    return scores


def group_sizes(lw: LayerWeights) -> dict[str, int]:
    """Each group's weights in one layer (its widths may be pruned)."""
    return {g: sum(getattr(lw, f).size for f in parts) for g, parts in GROUPS.items()}


def fixed_int8_groups(plan: MixedPlan, n: int) -> set[tuple[int, str]]:
    """The (layer, group) pairs a plan without calibration keeps INT8."""
    if plan is MixedPlan.LLAMA_DOWN:
        return {(i, "down") for i in range(n) if llama_use_more_bits(i, n)}
    if plan is MixedPlan.NONE:
        return set()
    raise ValueError(f"--mixed {plan.value} is chosen from calibration scores (choose_by_scores)")  # a caller bug


def choose_by_scores(
    scores: Mapping[tuple[int, str], float], sizes: Mapping[tuple[int, str], int], budget_bits: float = MIXED_CODE_BITS
) -> set[tuple[int, str]]:
    """The sensitivity plan: groups by score per weight, largest first, while they fit the budget."""
    budget = (budget_bits - 4) / 4 * sum(sizes.values())  # weights that may move from 4 to 8 code bits
    chosen, spent = set(), 0
    for key in sorted(scores, key=lambda k: -scores[k] / sizes[k]):
        if scores[key] > 0 and spent + sizes[key] <= budget:
            chosen.add(key)
            spent += sizes[key]
    return chosen


def mixed_record(
    plan: MixedPlan,
    chosen: set[tuple[int, str]],
    sizes: Mapping[tuple[int, str], int],
    scores: Mapping[tuple[int, str], float] | None = None,
    budget_bits: float = MIXED_CODE_BITS,
) -> dict[str, Any]:
    """The manifest's `mixed` record."""
    record: dict[str, Any] = {"plan": plan.value}
    if plan is MixedPlan.NONE:
        return record
    if scores is not None:
        record["budget_code_bits"] = budget_bits
        record["proxy"] = "INT4 relative output error energy x the block's output energy (quant_mixed.py)"
        record["scores"] = {f"{i}.{g}": float(f"{s:.4g}") for (i, g), s in sorted(scores.items())}
    total = sum(sizes.values())
    int8 = sum(sizes[k] for k in chosen)
    record["int8_groups"] = [f"{i}.{g}" for i, g in sorted(chosen, key=lambda k: (k[0], list(GROUPS).index(k[1])))]
    record["int8_weight_share"] = round(int8 / total, 5)
    record["linear_code_bits"] = round(4 + 4 * int8 / total, 4)
    return record
