"""Export whatever the user has: a Hugging Face checkpoint directory or a .gguf file, as its plan says.

`edge-export` and the first-use exports of `edge-run`/`edge-serve`/`edge-bench --model` go through here, so a
GGUF's quantized codes are kept (or not) by one rule wherever it is exported:

    manifest = export_source(plan_export(source, out, ExportFlags(), profile), progress=print)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from edge_runtime.bundle import stored_bytes
from edge_runtime.manifest import Manifest

from .export import ProgressArg, export
from .gguf_blocks import BLOCK_TYPES
from .gguf_convert import build_config, checkpoint_dir, is_gguf
from .gguf_quant import declined, linears_kept, read_codes, summary
from .gguf_reader import GGUFFile
from .memory_plan import estimate_conversion_memory
from .plan import ExportPlan
from .progress import Progress, as_progress
from .quant import MixedPlan, QuantMethod


def export_source(plan: ExportPlan, progress: ProgressArg | None = None) -> Manifest:
    """Export `plan.checkpoint`, a Hugging Face directory or a .gguf file, to `plan.out`.

    A .gguf's codes are kept where the bundle's format holds them exactly, unless the plan says otherwise
    (ExportPlan.gguf_declined); a profile's mixed-precision plan the plan held back from them
    (`deferred_mixed`) applies where the file has no Linear codes to keep: llama.cpp's exact weights beat any
    requantization of them. A GGUF is converted to float32 in a temporary directory beside the output, removed
    afterwards."""
    progress = as_progress(progress)
    gguf_source = is_gguf(plan.checkpoint)
    gg = _open_gguf(plan, progress) if gguf_source else None
    if gg is not None and plan.gguf_blocks:
        plan = _keeping_blocks(plan, gg, progress)
    reason = plan.gguf_declined()
    with checkpoint_dir(plan.checkpoint, out=plan.out, progress=progress, gg=gg) as hf_dir:
        if gguf_source:
            codes = declined(reason) if reason else read_codes(plan.checkpoint, plan.quant, gg, blocks=plan.gguf_blocks)
            gg = None  # the reader's metadata objects (hundreds of MB for a large vocabulary) go before the export
            held = plan.deferred_mixed
            if held is not None:
                if linears_kept(codes):
                    progress(
                        f"target {plan.target}'s mixed_precision {held.value} does not apply to kept "
                        "GGUF codes (--gguf-codes requantize applies it)"
                    )
                else:  # no Linear codes to keep (F16, Q4_1, K-quants): requantized, with the plan
                    plan = dataclasses.replace(plan, quant=dataclasses.replace(plan.quant, mixed=held))
            progress(summary(codes))
            plan = dataclasses.replace(plan, source_codes=codes)
        return export(dataclasses.replace(plan, checkpoint=hf_dir, source=plan.checkpoint), progress=progress)


def _keeping_blocks(plan: ExportPlan, gg: GGUFFile, progress: Progress) -> ExportPlan:
    """The plan for a .gguf whose Linears MatMulGGUF runs as stored (ExportPlan.gguf_blocks): they are kept, so the
    profile's method (AWQ/GPTQ calibration, a mixed plan) has nothing to re-round; whatever else is quantized
    (a float Linear, a table the table format cannot hold) is rounded to nearest. A file with no such Linear keeps
    the plan as it was."""
    linears = [n for n in gg.tensor_names if ".weight" in n and n.startswith("blk.") and len(gg.shape(n)) == 2]
    kept = sorted({gg.type_name(n) for n in linears} & set(BLOCK_TYPES))
    if not kept:
        return dataclasses.replace(plan, gguf_blocks=False)
    q = plan.quant
    method = QuantMethod.INT8 if q.method is QuantMethod.INT8 else QuantMethod.INT4
    was = q.method.value + (f" with --mixed {q.mixed.value}" if q.mixed is not MixedPlan.NONE else "")
    held = plan.deferred_mixed
    if held is not None:
        was += f" with --mixed {held.value}"
    progress(
        f"keeping the file's {'/'.join(kept)} Linears as stored (edge MatMulGGUF); other tensors {method.value} "
        f"round to nearest, not {plan.target or 'the default'}'s {was} (--quant requantizes everything)"
        if (q.method is not method or q.mixed is not MixedPlan.NONE or held is not None)
        else f"keeping the file's {'/'.join(kept)} Linears as stored (edge MatMulGGUF); other tensors {method.value}"
    )
    quant = dataclasses.replace(q, method=method, mixed=MixedPlan.NONE)
    return dataclasses.replace(plan, quant=quant, deferred_mixed=None)


def _open_gguf(plan: ExportPlan, progress: Progress) -> GGUFFile:
    """The .gguf opened once for the whole export (its metadata is parsed in Python: seconds for a large
    vocabulary), and --max-memory checked against the conversion's estimate before anything is dequantized."""
    with progress.stage(f"opening {plan.checkpoint.name}", 1, "file"):
        gg = GGUFFile(plan.checkpoint)
        build_config(gg)  # a file refused for what it holds says only why, before any estimate
        gg.check_types()
    estimate = estimate_conversion_memory(plan.checkpoint.stat().st_size, gg.entries("tokenizer.ggml.tokens"))
    progress(f"the conversion to float32 needs about {estimate.total / 1e6:,.0f} MB ({estimate.describe()} MB)")
    plan.check_memory(estimate, conversion=True)
    return gg


def summary_line(out: Path, manifest: Manifest) -> str:
    """One line saying what was written: flavor, weights, size, validation, held-out perplexity, target."""
    size = sum(stored_bytes(p) for p in out.iterdir())
    ppl = manifest.quantization.get("heldout_ppl")
    target = manifest.provenance.get("target")
    pr = manifest.quantization.get("pruning", {})
    cal = pr.get("calibration_ppl")
    return (
        f"{out}: {manifest.graph.flavor}/{manifest.graph.weight_dtype}, {size / 1e6:.1f} MB, "
        f"validation max rel err {manifest.validation.max_rel_err:.2e} (tolerance {manifest.validation.tolerance:g})"
        + (f", pruned {pr['removed']:.1%} (calib. ppl {cal['unpruned']:.3f} -> {cal['pruned']:.3f})" if cal else "")
        + (f", held-out ppl {ppl['original']:.3f} -> {ppl['exported']:.3f}" if ppl else "")
        + (f", for target {target}" if target else "")
    )
