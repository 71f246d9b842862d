"""The export's weight stage: [calibrate] -> [prune] -> [quantize] -> held-out perplexity (docs/architecture.md §2, §6).

The options were checked before any work by the export's plan (plan.py), so a bad one fails fast and leaves
nothing behind; what needs the model (layers to prune, blocks that divide each Linear) is checked here.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_runtime.models import ModelArgs, ModelWeights

from .calibrate import (
    CalibrationSet,
    LayerInputStream,
    LinearInputs,
    calibration_perplexity,
    capture_linear_inputs,
    heldout_ids,
    heldout_perplexity,
    load_calibration,
)
from .checkpoint import Checkpoint
from .plan import check_options as check_options  # the plan checks a QuantConfig against the flavor; for importers
from .progress import Progress, as_progress
from .prune import RECON_SINK_WEIGHT, PruneConfig, calibration_record, prune_model, prune_to_budget
from .prune_layers import BlockStats, check_layer_pruning, supports_layer_pruning
from .quant import MatMulKernel, QuantConfig
from .quant_model import LINEARS, QuantizedModel, check_blocks, quantize_model
from .scratch import Scratch

if TYPE_CHECKING:
    from .gguf_quant import SourceCodes

ProgressArg = Progress | Callable[[str], None]
# Pruning is judged on this many calibration tokens (the first sequences; at least one): one float64
# forward per evaluation, ~20 s on SmolLM2-135M, where all 16,384 would take minutes each. They are also
# reconstruction's fitting data, so the figure is optimistic; the manifest's held-out perplexity is not.
PRUNE_EVAL_TOKENS = 2048
# A plain --prune whose calibration perplexity rises more than this has destroyed the model: warn.
DESTRUCTIVE_PRUNE_PCT = 50.0


class PruneQualityWarning(UserWarning):
    """--prune R raised the calibration perplexity past DESTRUCTIVE_PRUNE_PCT."""


@dataclass
class PreparedWeights:
    weights: ModelWeights  # what the graph holds (pruned, dequantized); validated against the reference
    quantized: QuantizedModel | None
    record: dict[str, Any]  # the manifest's `quantization`
    pruned: bool


def samples_wide_inputs(quant: QuantConfig) -> bool:
    """AWQ and the manifest's record only measure output errors, which a row sample of a wide input gives
    (input_stats.py); GPTQ's Hessian and --mixed sensitivity's energies need X^T X itself."""
    return not quant.method.gptq and not quant.mixed.needs_calibration


def pruning_unit(quant: QuantConfig) -> int:
    """Pruned widths stay multiples of 32 (MatMulNBits' fast ARM path) or of the INT4 (INT8) block."""
    block = quant.block if quant.method.linear_bits == 4 else quant.int8_block
    return max(32, block or 32)


def prepare_weights(
    ckpt: Checkpoint,
    quant: QuantConfig,
    prune_ratio: float | None,
    calibration: Path | None,
    *,
    prune_budget: float | None = None,
    prune_layers: int = 0,
    trt: bool,
    weights_label: str,
    progress: ProgressArg | None,
    source_codes: SourceCodes | None = None,
    scratch: Scratch | None = None,
) -> PreparedWeights:
    """`source_codes`: a GGUF source's codes to keep as they are (gguf_quant.py; its record goes into the
    manifest even when it imports nothing, saying why). `scratch`: where quantized Linears' codes wait
    between uses instead of memory (quantize_model)."""
    progress = as_progress(progress)
    check_layer_pruning(ckpt.args, prune_layers)
    prune = None
    if prune_ratio is not None or prune_layers:
        prune = PruneConfig(prune_ratio or 0.0, unit=pruning_unit(quant), layers=prune_layers)
    pruning = prune is not None or prune_budget is not None
    args, weights = ckpt.args, ckpt.weights
    # Pruning changes the inputs of o_proj and down_proj only (to multiples of the block).
    check_blocks(weights, ckpt.arch.weights, quant, ("q", "k", "v", "gate", "up") if pruning else LINEARS)
    record: dict[str, Any] = {"method": quant.method.value, "weights": weights_label, "per_tensor": {}}
    imported = source_codes.tensors if source_codes is not None else {}
    if source_codes is not None:
        record["gguf_codes"] = source_codes.record
    if imported and (pruning or quant.method.needs_calibration or not quant.enabled):
        raise ValueError("GGUF codes are imported by plain int4/int8 exports only")  # plan_import refuses the rest
    if not quant.enabled and not pruning:
        return PreparedWeights(weights, None, record, pruned=False)

    calib: CalibrationSet | None = None
    acts = None
    if quant.needs_calibration or pruning or calibration is not None:
        calib = load_calibration(ckpt, calibration)
        record["calibration"] = calib.record()
    if pruning:  # pruning ranks and refits across layers: every layer's statistics at once
        t0 = time.perf_counter()
        progress(f"calibration text '{calib.path.name}': {calib.tokens} tokens")  # the stage's own line says how
        # Whole layers are candidates where asked for, and for a budget (not where layer indices mean more)
        wants_layers = (prune is not None and prune.layers > 0) or (
            prune_budget is not None and supports_layer_pruning(args)
        )
        blocks = BlockStats(RECON_SINK_WEIGHT) if wants_layers else None
        judge, fit = pruning_split(calib)
        acts = capture_linear_inputs(args, weights, fit, progress, blocks=blocks)
        record["calibration"]["seconds"] = round(time.perf_counter() - t0, 2)
        weights, record["pruning"] = _prune(
            args, weights, acts, judge, prune, prune_budget, pruning_unit(quant), progress, blocks
        )
        record["pruning"]["calibration_ppl"]["judged_on_unfitted_text"] = fit is not calib
        record["pruning"]["fitted_tokens"] = fit.tokens  # the statistics' share of `calibration`'s tokens
        blocks = None
        acts = None  # they were the unpruned model's
        if quant.needs_calibration:
            progress("re-calibrating the pruned model, a layer at a time as it is quantized")
            acts = LayerInputStream(args, weights, calib, progress, sample_wide=samples_wide_inputs(quant))
    elif quant.needs_calibration:
        progress(
            f"calibrating on {calib.tokens} tokens of '{calib.path.name}' (float32 forward), "
            "a layer at a time as it is quantized"
        )
        acts = LayerInputStream(args, weights, calib, progress, sample_wide=samples_wide_inputs(quant))

    quantized = None
    if quant.enabled:  # quantize_model's stage says the method, the block and the layers
        quantized = quantize_model(args, weights, ckpt.arch.weights, quant, acts, progress, imported, scratch)
        if isinstance(acts, LayerInputStream) and not pruning:
            record["calibration"]["seconds"] = round(acts.seconds, 2)
        record.update(quantized.record)
        record["weights"] = f"int{quant.method.linear_bits}"
        if trt:  # TensorRT dequantizes and multiplies in fp16/fp32: MatMulNBits' compute type does not apply
            record.pop("accuracy_level")
        weights = quantized.weights

    ids = heldout_ids(ckpt)
    if ids is not None:
        plan = f"{len(ids)} tokens of heldout.txt, float64 reference, before and after"
        with progress.stage("held-out perplexity", 2, "forward", plan=plan) as stage:
            stage.status("the checkpoint's weights")
            before = heldout_perplexity(args, ckpt.weights, ids)
            stage.advance()
            stage.status("the exported weights")
            after = heldout_perplexity(args, weights, ids)
            stage.advance()
        progress(f"held-out perplexity {before:.3f} -> {after:.3f} ({100 * (after / before - 1):+.2f}%)")
        record["heldout_ppl"] = {
            "tokens": len(ids),
            "original": round(before, 4),
            "exported": round(after, 4),
            "change_pct": round(100 * (after / before - 1), 3),
        }
    return PreparedWeights(weights, quantized, record, pruned=pruning)


def _prune(
    args: ModelArgs,
    weights: ModelWeights,
    acts: LinearInputs,
    seqs: list[np.ndarray],
    prune: PruneConfig | None,
    budget: float | None,
    unit: int,
    progress: ProgressArg | None,
    blocks: BlockStats | None = None,
) -> tuple[ModelWeights, dict[str, Any]]:
    """--prune R [--prune-layers N] or --prune-budget PCT, with the calibration perplexity (on `seqs`) before
    and after."""
    progress = as_progress(progress)
    n = sum(len(s) for s in seqs)

    def evaluate(w: ModelWeights) -> float:
        return calibration_perplexity(args, w, seqs)

    if budget is not None:
        progress(f"pruning within +{budget:g}% calibration perplexity on {n} calibration tokens (bisection)")
        # one unit: the bisection's steps say their own lines; the heartbeat fills the float64 forwards between
        with progress.stage("pruning to the budget", 1, "search"):
            pruned, rec = prune_to_budget(args, weights, acts, budget, evaluate, unit, progress=progress, blocks=blocks)
    else:
        layers = f" and {prune.layers} whole layer{'s' if prune.layers > 1 else ''}" if prune.layers else ""
        progress(f"pruning {prune.ratio:.0%} of attention+MLP parameters (widths in multiples of {prune.unit}){layers}")
        with progress.stage("pruning", 3, "step", plan="prune and refit, calibration perplexity before and after") as s:
            s.status("pruning and refitting")
            pruned, rec = prune_model(args, weights, acts, prune, progress, blocks=blocks)
            s.advance()
            s.status("calibration perplexity of the checkpoint's weights")
            before = evaluate(weights)
            s.advance()
            s.status("calibration perplexity of the pruned weights")
            after = evaluate(pruned)
            s.advance()
        rec["calibration_ppl"] = calibration_record(before, after)
        change = rec["calibration_ppl"]["change_pct"]
        progress(f"calibration perplexity {before:.3f} -> {after:.3f} ({change:+.2f}%) on {n} calibration tokens")
        if change > DESTRUCTIVE_PRUNE_PCT:
            flags = ([f"--prune {prune.ratio:g}"] if prune.ratio else []) + (
                [f"--prune-layers {prune.layers}"] if prune.layers else []
            )
            msg = (
                f"{' '.join(flags)} raises calibration perplexity by {change:+.0f}% ({before:.3f} -> "
                f"{after:.3f}): the pruned model is likely destroyed; try --prune-budget 10"
            )
            warnings.warn(msg, PruneQualityWarning, stacklevel=3)  # edge-export prints it as one line
    rec["calibration_ppl"]["tokens"] = n
    return pruned, rec


def pruning_split(calib: CalibrationSet) -> tuple[list[np.ndarray], CalibrationSet]:
    """The sequences pruning is judged on (the first PRUNE_EVAL_TOKENS tokens' worth, at least one) and the
    calibration set its statistics come from: the rest, where the rest is at least as long. A refit judged
    on text it was fitted to looked better than it was: on SmolLM2-135M `--prune-budget 10` chose 7.3%
    at +9.9% calibration perplexity, +19.8% held-out. On a short text both are the whole set."""
    judge, n = [], 0
    for s in calib.sequences:
        if judge and n + len(s) > PRUNE_EVAL_TOKENS:
            break
        judge.append(s)
        n += len(s)
    rest = calib.sequences[len(judge) :]
    if sum(len(s) for s in rest) < n:
        return judge, calib
    return judge, replace(calib, sequences=rest)


def exact_twin(quantized: QuantizedModel) -> QuantizedModel:
    """The same integer weights with MatMulNBits computing in fp32 (accuracy_level 0): the graph the
    reference must match to fp32 tolerance, proving any other difference is int8 activations."""
    config = replace(quantized.config, accuracy_level=0, kernel=MatMulKernel.MLAS)
    return replace(quantized, config=config)
