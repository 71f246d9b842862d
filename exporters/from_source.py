"""Export whatever the user has: a Hugging Face checkpoint directory or a .gguf file.

`edge-export` and the first-use exports of `edge-run`/`edge-serve`/`edge-bench --model` go through here, so a
GGUF's quantized codes are kept (or not) by one rule wherever it is exported:

    manifest = export_source(opts, plan_from_profile=True, progress=print)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from edge_runtime.bundle import stored_bytes
from edge_runtime.errors import ExportError
from edge_runtime.manifest import Manifest

from .decoder import Flavor, kv_dtype_problem
from .export import ExportOptions, ProgressArg, export
from .gguf_convert import checkpoint_dir, is_gguf
from .gguf_quant import GGUFCodes, declined, linears_kept, plan_import, read_codes, summary
from .progress import as_progress
from .quant import MixedPlan


def export_source(
    opts: ExportOptions,
    *,
    gguf_codes: GGUFCodes | None = None,
    plan_from_profile: bool = False,
    progress: ProgressArg | None = None,
) -> Manifest:
    """Export `opts.checkpoint`, a Hugging Face directory or a .gguf file, to `opts.out`.

    `gguf_codes` is what the user asked of a GGUF's codes (None: keep them where the bundle's format holds them
    exactly). `plan_from_profile`: the mixed-precision plan in `opts.quant` came from a target profile, not the
    user, so it gives way to a GGUF's codes where the file has codes to keep: llama.cpp's exact weights beat any
    requantization of them. A GGUF is converted to float32 in a temporary directory beside the output, removed
    afterwards."""
    progress = as_progress(progress)
    kv_problem = kv_dtype_problem(None, opts.flavor, opts.quant, opts.kv_dtype)  # before a .gguf is converted
    if kv_problem:
        raise ExportError(kv_problem)
    gguf_source = is_gguf(opts.checkpoint)
    pruning = opts.prune is not None or opts.prune_budget is not None or opts.prune_layers > 0
    profile_plan = gguf_source and plan_from_profile and opts.quant.mixed is not MixedPlan.NONE
    with_plan = opts.quant
    if profile_plan and gguf_codes is not GGUFCodes.REQUANTIZE:
        opts = dataclasses.replace(opts, quant=dataclasses.replace(opts.quant, mixed=MixedPlan.NONE))
    reason = plan_import(  # an impossible explicit --gguf-codes keep fails here, before any work
        gguf_codes, opts.quant, gguf_source=gguf_source, trt=opts.flavor is Flavor.TRT, prune=pruning
    )
    with checkpoint_dir(opts.checkpoint, out=opts.out, progress=progress) as hf_dir:
        if gguf_source:
            if reason:
                codes = declined(reason)
            else:  # the file's metadata parsed again (seconds for a large vocabulary): the heartbeat covers it
                with progress.stage(f"reading {opts.checkpoint.name}'s quantized codes", 1, "file"):
                    codes = read_codes(opts.checkpoint, opts.quant)
            if profile_plan and opts.quant is not with_plan:
                if linears_kept(codes):
                    progress(
                        f"target {opts.target}'s mixed_precision {with_plan.mixed.value} does not apply to kept "
                        "GGUF codes (--gguf-codes requantize applies it)"
                    )
                else:  # no Linear codes to keep (F16, Q4_1, K-quants): requantized, with the plan
                    opts = dataclasses.replace(opts, quant=with_plan)
            progress(summary(codes))
            opts = dataclasses.replace(opts, source_codes=codes)
        return export(dataclasses.replace(opts, checkpoint=hf_dir, source=opts.checkpoint), progress=progress)


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
