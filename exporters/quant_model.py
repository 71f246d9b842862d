"""Quantize a whole model: every Linear (INT8 or INT4 by method), the embedding table / LM head (INT8
unless kept in float), with the per-tensor error record the manifest carries.

    qm = quantize_model(args, weights, names, QuantConfig(QuantMethod.INT4_AWQ, block=32), acts)
    build_decoder(args, qm.weights, flavor, precision, quantized=qm)   # integer initializers
    ReferenceModel(args, qm.weights)                                   # the same dequantized weights

`qm.weights` holds a QuantizedTable (quant.py) in place of each quantized matrix: the float matrix's
shape over no bytes, its integer form in `.qm`, its dequantized rows read on demand. The graph's weight
format finds the integer form from it (`lookup`), so blocks.py hands it the same fields it would hand
FloatWeights, and the reference dequantizes a layer as it runs it (an 8B layer's Linears are
0.9 GB as float32, and the graph builder needs none of those values).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edge_runtime.errors import ExportError
from edge_runtime.models import LayerWeights, ModelArgs, ModelWeights, WeightNames

from .calibrate import InputStats, LayerInputStream, LinearInputs, copy_layer
from .gguf_blocks import GGUFMatrix
from .input_stats import relative
from .lazy_layers import LazyLayers
from .progress import Progress, as_progress
from .quant import (
    MixedPlan,
    QuantConfig,
    QuantizedMatrix,
    QuantizedTable,
    QuantMethod,
    check_block,
    gptq_rows,
    quantize_rtn,
    relative_error,
    table_error,
)
from .quant_awq import awq_layer
from .quant_mixed import GROUPS, choose_by_scores, fixed_int8_groups, group_sizes, layer_scores, mixed_record
from .scratch import Scratch

LINEARS = ("q", "k", "v", "o", "gate", "up", "down")
# GPTQ on SmolLM2-135M (int4 block 32, held-out python_docstrings.txt, ORT graph perplexity; fp32
# 15.07, RTN 19.04): on X^T X alone 19.58, worse than RTN. X^T X weighs each sequence's first token as
# one row of ~500, and GPTQ moves the rounding error into the directions the bulk of the rows leaves
# unused, which is where that token lies: its q/k/v output error in layers 12-20 was 0.6..1.3 (RTN
# 0.2..0.4) while the other rows' fell by half. That token is the attention sink every later query
# reads, so its rows count once per later token (InputStats.sink_gram): 18.38. Act-order with static
# groups on top: 17.30.
GPTQ_SINK_WEIGHT = 1.0
GPTQ_ACT_ORDER = True
# Damping, as a fraction of the mean diagonal, measured on SmolLM2-135M (held-out, llama-perplexity's protocol):
# with every Linear INT4 the paper's 0.01 (+9.0%; 0.1 gives +17.2%); with --mixed sensitivity 0.1 (+4.2%;
# 0.01 gives +5.3-5.5%): there the plan keeps the groups GPTQ fits worst at INT8 (docs/benchmarks/quality.md).
GPTQ_DAMP = 0.01
GPTQ_DAMP_MIXED = 0.1
AWQ_SINK_WEIGHT = 0.0  # AWQ's scale-search loss: the sink rows' weight (InputStats.sink_weighted)


def gptq_damp(config: QuantConfig) -> float:
    return GPTQ_DAMP_MIXED if config.mixed is MixedPlan.SENSITIVITY else GPTQ_DAMP


@dataclass
class QuantizedModel:
    config: QuantConfig
    weights: ModelWeights  # QuantizedTable for each quantized matrix: what the graph computes with
    tensors: dict[str, QuantizedMatrix | GGUFMatrix]  # checkpoint tensor name -> integer form (or GGUF blocks)
    record: dict[str, Any]  # for the manifest's `quantization`

    def lookup(self, array: np.ndarray) -> QuantizedMatrix | None:
        return array.qm if isinstance(array, QuantizedTable) else None

    def require(self, array: np.ndarray, where: str) -> QuantizedMatrix:
        qm = self.lookup(array)
        if qm is None:  # a builder bug: blocks.py passed an array that is not one of `weights`
            raise ValueError(f"{where}: weight is not one of the quantized model's arrays")
        return qm


# The Linears of an AWQ-scaled layer kept only for its norms and biases (its Linears come from their codes)
_NO_WEIGHT = np.empty((0, 0), np.float32)


def check_blocks(weights: ModelWeights, names: WeightNames, config: QuantConfig, linears: tuple = LINEARS) -> None:
    """INT4 (and blocked INT8) needs every Linear's input dimension to be a multiple of the block: fail
    before any work."""
    bits = config.method.linear_bits
    block = config.block if bits == 4 else config.int8_block
    if block is not None:
        for i, lw in enumerate(weights.layers):
            for f in linears:
                check_block(names.layer[f].format(i=i), getattr(lw, f), block, bits)


def quantize_model(
    args: ModelArgs,
    weights: ModelWeights,
    names: WeightNames,
    config: QuantConfig,
    acts: LinearInputs | LayerInputStream | None = None,
    progress: Progress | Callable[[str], None] | None = None,
    imported: Mapping[str, QuantizedMatrix | GGUFMatrix] | None = None,
    scratch: Scratch | None = None,
) -> QuantizedModel:
    """`acts` (calibration inputs of `weights`) is required by AWQ and GPTQ, optional otherwise
    (then the record also gives each Linear's relative output error on them); a LayerInputStream computes
    each layer's as it is quantized, so neither the float model nor every layer's statistics are held at
    once (its time is left out of `quantize_seconds`). `imported`: tensors whose
    integer form is given (a GGUF's codes, gguf_quant.py), used as they are where they dequantize to
    exactly the checkpoint's weights. `scratch`: where each layer's codes go once it is quantized (read
    back as they are used), so the codes of the whole model are never held."""
    progress = as_progress(progress)
    t0 = time.perf_counter()
    method, bits, block = config.method, config.method.linear_bits, config.block
    damp = gptq_damp(config)
    if bits is None:
        raise ValueError("quantize_model needs a quantization method")
    if method.needs_calibration and acts is None:
        raise ValueError(f"{method.value} needs calibration inputs")
    imported = dict(imported or {})
    if imported and method not in (QuantMethod.INT4, QuantMethod.INT8):
        raise ValueError(f"{method.value} re-rounds every weight; it takes no imported codes")
    if imported and config.asymmetric:
        raise ExportError("asymmetric blocks re-round the GGUF's codes; add --gguf-codes requantize")
    if config.mixed is not MixedPlan.NONE and any(".layers." in name for name in imported):
        raise ExportError(f"--mixed {config.mixed.value} re-rounds the GGUF's codes; add --gguf-codes requantize")
    check_blocks(weights, names, config)
    # Fused q/k/v and gate/up share one MatMulNBits, so an INT8 export holding imported blocks of 32
    # stores its requantized Linears in blocks of 32 too (where the block divides K), not per channel.
    linear_names = {names.layer[f].format(i=i) for i in range(len(weights.layers)) for f in LINEARS}
    int8_codes = sorted(n for n in linear_names & set(imported) if not isinstance(imported[n], GGUFMatrix))
    int8_block = imported[int8_codes[0]].block if int8_codes else None
    if int8_block and config.int8_block and int8_block != config.int8_block:
        raise ExportError(
            f"the GGUF's INT8 codes are in blocks of {int8_block}, not --block {config.int8_block}; drop --block "
            "or add --gguf-codes requantize"
        )
    int8_block = int8_block or config.int8_block

    extra: dict[str, Any] = {}
    if method.awq:
        extra["awq"] = {}
    if method.gptq:
        extra["gptq"] = {
            "act_order": GPTQ_ACT_ORDER,
            "static_groups": GPTQ_ACT_ORDER,
            "damp": damp,
            "sink_weight": GPTQ_SINK_WEIGHT,
            "hessian": "X^T X + sink_weight * sum over sequences of (T - 1) x_0 x_0^T",
        }

    tensors: dict[str, QuantizedMatrix | GGUFMatrix] = {}
    per_tensor: dict[str, dict[str, Any]] = {}
    out = QuantizedModel(config, weights, tensors, {})  # `weights` replaced below

    def record(name: str, qm: QuantizedMatrix | GGUFMatrix, rel_err: float, rel_out_err: float | None = None) -> None:
        """`qm` as `name`'s integer form, with its entry in the manifest's per-tensor record."""
        tensors[name] = qm
        entry = {"bits": qm.bits, "block": "channel" if qm.per_channel else qm.block, "rel_err": rel_err}
        if name in imported:
            entry["codes"] = "gguf"
        if isinstance(qm, GGUFMatrix):  # kept in its blocks: `block` is the type's, `bits` its codes'
            entry["gguf_type"] = qm.type.name
        if rel_out_err is not None:  # the error that matters: of the Linear's output on calibration inputs
            entry["rel_out_err"] = rel_out_err
        per_tensor[name] = {k: round(v, 6) if isinstance(v, float) else v for k, v in entry.items()}

    def note(
        name: str, w: np.ndarray, qm: QuantizedMatrix | GGUFMatrix, x: InputStats | None
    ) -> tuple[float, tuple | None]:
        """A Linear's integer form recorded; its weight error, and its output energies on `x` (output_energies)."""
        deq = qm.dequantize()
        if name in imported and not np.array_equal(deq, w):
            raise ExportError(f"'{name}': the GGUF's codes do not dequantize to the checkpoint's weights")
        rel = relative_error(deq, w)
        energies = None if x is None else x.output_energies(deq, w)
        record(name, qm, rel, None if energies is None else relative(*energies))
        return rel, energies

    def table(name: str, w: np.ndarray, qm: QuantizedMatrix) -> QuantizedTable:
        """A table's integer form recorded, a chunk of rows at a time, and held as its codes only."""
        rel, exact = table_error(qm, w)
        if name in imported and not exact:
            raise ExportError(f"'{name}': the GGUF's codes do not dequantize to the checkpoint's weights")
        record(name, qm, rel)
        if scratch is not None:  # read back a block of rows at a time (an 8B model's int8 tables are 1 GB)
            qm.spill(scratch)
        return QuantizedTable(qm)

    # --mixed: a fixed plan is known before quantizing (its INT8 groups skip INT4 work); the sensitivity
    # plan is chosen from every group's INT4 form, so all are quantized to INT4 first and scored as each
    # layer is, while its statistics are at hand (quant_mixed.py); the chosen groups are requantized after.
    sensitivity = config.mixed.needs_calibration
    if sensitivity and acts is None:
        raise ValueError(f"--mixed {config.mixed.value} needs calibration inputs")
    int8_groups = set() if sensitivity else fixed_int8_groups(config.mixed, len(weights.layers))
    scores: dict[tuple[int, str], float] = {}
    sizes: dict[tuple[int, str], int] = {}
    group_of = {f: g for g, parts in GROUPS.items() for f in parts}

    # Each layer's inputs are asked for as the layer is reached: from a LayerInputStream they are computed
    # then, and dropped once the layer is quantized.
    # AWQ's scaled layers: whole where the sensitivity plan re-reads their floats, else only their small
    # vectors (`small`).
    scaled: list[LayerWeights] = []
    # Every layer's small vectors (norms, biases; AWQ's scaled ones), for the quantized layers built below: built
    # from the checkpoint's layers instead, each build would read and widen all of a layer's Linears only to
    # drop them (the 1B int8 export built 240 layers: 31 s of bf16 widening and most of its page faults).
    small: list[LayerWeights] = []
    forms: dict[tuple[int, str], QuantizedMatrix] = {}
    plan = method.value + (f", block {block}" if bits == 4 else "")
    if isinstance(acts, LayerInputStream):
        plan += f", each layer's calibration forward on {acts.tokens} tokens first"
    if sensitivity:
        plan += f", --mixed {config.mixed.value} scoring"
    with progress.stage("quantizing", len(weights.layers), "layer", plan=plan) as stage:
        for i, lw in enumerate(weights.layers):
            x = None
            if isinstance(acts, LayerInputStream):
                x = acts.layer(i, stage)
            elif acts is not None:
                x = acts.layer(i)
            if method.awq:
                stage.status(f"layer {i + 1}: AWQ scale search")
                lw, x, extra["awq"][f"layer {i}"] = awq_layer(
                    args, i, lw, x, block, stage.status, AWQ_SINK_WEIGHT, config.asymmetric
                )
            small.append(copy_layer(lw, **dict.fromkeys(LINEARS, _NO_WEIGHT)))
            if method.awq:
                scaled.append(lw if sensitivity else small[-1])
            sizes.update({(i, g): n for g, n in group_sizes(lw).items()})
            joint: dict[str, QuantizedMatrix] = {}  # GPTQ's forms of the rest of a fused group
            for f in LINEARS:
                w, name = getattr(lw, f), names.layer[f].format(i=i)
                if (i, group_of[f]) in int8_groups:
                    qm = quantize_rtn(w, 8)  # per channel: MatMulNBits bits 8, MatMulQ8, trt's DequantizeLinear
                elif name in imported:
                    qm = imported[name]
                elif bits == 8:
                    qm = quantize_rtn(w, 8, int8_block if int8_block and w.shape[1] % int8_block == 0 else None)
                elif method.gptq:
                    if f not in joint:  # the Linears of f's fused group, which read the same inputs, as one
                        together = GROUPS[group_of[f]]
                        stage.status(f"layer {i + 1}: GPTQ {'/'.join(together)}")
                        # made inline and taken as gptq_rows' scratch: the only K x K copy (0.5 GB at 1B's down)
                        joint.update(zip(together, gptq_rows(
                            [getattr(lw, g) for g in together], x.of(f).sink_weighted(GPTQ_SINK_WEIGHT), 4, block,
                            damp, act_order=GPTQ_ACT_ORDER, asymmetric=config.asymmetric,
                            overwrite_hessian=GPTQ_SINK_WEIGHT != 0,  # sink_weighted made it: a new array
                        ), strict=True))  # fmt: skip
                    qm = joint.pop(f)
                else:
                    qm = quantize_rtn(w, 4, block, asymmetric=config.asymmetric)
                forms[(i, f)] = qm
            # the record as each layer is quantized: a layer widened from the file once, not again for the record
            stage.status(f"layer {i + 1}: errors")
            noted = {
                f: note(names.layer[f].format(i=i), getattr(lw, f), forms[(i, f)], None if x is None else x.of(f))
                for f in LINEARS
            }
            worst = max(rel for rel, _ in noted.values())
            if sensitivity:
                stage.status(f"layer {i + 1}: --mixed sensitivity scores")
                layer_forms = {f: forms[(i, f)] for f in LINEARS}
                # the output energies just recorded, over the Gram matrix (not where it is a row sample)
                energies = {f: e for f, (_, e) in noted.items() if e is not None and x.of(f).sample is None}
                layer = layer_scores(lw, layer_forms, x, GPTQ_SINK_WEIGHT, energies)
                scores.update({(i, g): s for g, s in layer.items()})
            if scratch is not None:
                for f in LINEARS:
                    forms[(i, f)].spill(scratch)
            stage.advance(note=f"worst weight error {worst:.2e}")
    calibrating = acts.seconds if isinstance(acts, LayerInputStream) else 0.0
    if method.awq:
        extra["awq"]["sink_weight"] = AWQ_SINK_WEIGHT
        weights = replace(weights, layers=scaled)
    if sensitivity:
        int8_groups = choose_by_scores(scores, sizes, config.mixed_bits)
        for i in sorted({i for i, _ in int8_groups}):
            lw = weights.layers[i]  # read once more (AWQ's: the scaled layer kept above)
            for f in LINEARS:
                if (i, group_of[f]) in int8_groups:
                    w = getattr(lw, f)
                    forms[(i, f)] = quantize_rtn(w, 8)
                    # no output error: the layer's statistics are gone (the plan's scores stand for it)
                    note(names.layer[f].format(i=i), w, forms[(i, f)], None)
                    if scratch is not None:
                        forms[(i, f)].spill(scratch)
    if config.mixed is not MixedPlan.NONE:
        plan_scores = scores if sensitivity else None
        extra["mixed"] = mixed_record(config.mixed, int8_groups, sizes, plan_scores, config.mixed_bits)
    if "mixed" in extra:
        progress(f"  --mixed {config.mixed.value}: INT8 per channel for {', '.join(extra['mixed']['int8_groups'])}")

    def layer(i: int) -> LayerWeights:
        """Layer i's norms and biases with its Linears' integer forms (a 1B model's Linears are
        4.9 GB as float32): a reader that needs their values dequantizes them (reference.py)."""
        return copy_layer(small[i], **{f: QuantizedTable(forms[(i, f)]) for f in LINEARS})

    layers = LazyLayers(len(small), layer)

    tied = weights.lm_head is weights.embed
    if config.fp_embeddings:
        embed, lm_head = np.array(weights.embed, np.float32), None
    else:
        tb = config.table_bits
        table_block = config.block if tb == 4 else None
        if tb == 4:
            check_block(names.embed, weights.embed, table_block)
        lm_head = None
        # one or two units, for the heartbeat: a 262k-row table is seconds of rounding and error measuring
        with progress.stage("quantizing the tables", 1 if tied else 2, "table", plan=f"INT{tb}") as st:
            embed_q = imported.get(names.embed) or quantize_rtn(weights.embed, tb, table_block)
            embed = table(names.embed, weights.embed, embed_q)
            st.advance()
            if not tied:
                head_q = imported.get(names.lm_head) or quantize_rtn(weights.lm_head, tb, table_block)
                lm_head = table(names.lm_head, weights.lm_head, head_q)
                st.advance()
    if lm_head is None:
        lm_head = embed if tied else np.array(weights.lm_head, np.float32)
    out.weights = ModelWeights(
        embed=embed, final_norm=np.array(weights.final_norm, np.float32), lm_head=lm_head, layers=layers
    )
    unused = sorted(set(imported) - set(tensors))
    if unused:  # a caller bug: codes read for tensors this model does not quantize
        raise ValueError(f"imported codes for tensors not quantized here: {', '.join(unused[:3])}")
    scheme = "symmetric, positive fp16-representable scales, no zero points"
    if config.asymmetric:
        scheme = "INT4 Linears asymmetric (a zero point per block), the rest symmetric; positive fp16 scales"
    if imported:
        scheme = "symmetric, no zero points; fp16 scales, positive except in GGUF-imported tensors (as stored)"
    out.record = {
        "method": method.value,
        "linear_bits": bits,
        "block": block if bits == 4 else int8_block or "channel",
        "embeddings": "fp" if config.fp_embeddings else _table_label(config, imported.get(names.embed)),
        "scheme": scheme,
        "accuracy_level": config.accuracy_level,
        "per_tensor": per_tensor,
        **extra,
        "quantize_seconds": round(time.perf_counter() - t0 - calibrating, 2),
    }
    return out


def _table_label(config: QuantConfig, embed: QuantizedMatrix | None = None) -> str:
    if embed is not None:
        return f"int{embed.bits} block {embed.block} (GGUF codes)"
    return "int8 per row" if config.table_bits == 8 else f"int4 block {config.block}"
