"""`edge-export`: build a validated bundle from a Hugging Face checkpoint, or inspect one.

edge-export CHECKPOINT_DIR -o OUT_DIR [--flavor ort|trt] [--dtype fp32|fp16] [--sinks N] [--window N]
edge-export inspect BUNDLE_DIR
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from .common import debug_option, friendly_errors


class _DefaultToBuild(click.Group):
    """`edge-export CHECKPOINT ...` means `edge-export build CHECKPOINT ...`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["build", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultToBuild)
def main() -> None:
    """Export Hugging Face checkpoints to edge-runtime bundles (`build` is the default command)."""


@main.command("build")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="Bundle directory to write.")
@click.option(
    "--flavor",
    type=click.Choice(["ort", "trt"]),
    default="ort",
    show_default=True,
    help="Graph flavor: ONNX Runtime CPU (ort) or TensorRT-parsable (trt).",
)
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "fp16"]),
    default="fp32",
    show_default=True,
    help="Weight precision (trt also runs fp16 activations).",
)
@click.option("--sinks", type=int, default=4, show_default=True, help="StreamingLLM attention sinks.")
@click.option("--window", type=int, default=None, help="Recent tokens attended [default: the trained context].")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (atomically).")
@debug_option
@friendly_errors
def build(
    checkpoint: Path, out: Path, flavor: str, dtype: str, sinks: int, window: int | None, overwrite: bool
) -> None:
    """Export CHECKPOINT (a Hugging Face directory) to a validated bundle in OUT."""
    from edge_runtime.exporters.decoder import Flavor, Precision
    from edge_runtime.exporters.export import ExportOptions, export

    opts = ExportOptions(
        checkpoint=checkpoint,
        out=out,
        flavor=Flavor(flavor),
        precision=Precision(dtype),
        sinks=sinks,
        window=window,
        overwrite=overwrite,
    )
    t0 = time.perf_counter()
    manifest = export(opts, progress=lambda msg: click.echo(f"[{time.perf_counter() - t0:6.1f}s] {msg}", err=True))
    size = sum(p.stat().st_size for p in out.iterdir())
    click.echo(
        f"{out}: {manifest.graph.flavor}/{manifest.graph.weight_dtype}, {size / 1e6:.1f} MB, "
        f"validation max rel err {manifest.validation.max_rel_err:.2e} (tolerance {manifest.validation.tolerance:g})"
    )


@main.command("inspect")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--no-verify", is_flag=True, help="Skip the sha256 check of every file.")
@debug_option
@friendly_errors
def inspect(bundle: Path, no_verify: bool) -> None:
    """Print a bundle's manifest summary and verify its checksums."""
    from edge_runtime.bundle import open_bundle

    b = open_bundle(bundle, verify=not no_verify)
    m = b.manifest
    heads = sorted(set(zip(m.model.num_heads, m.model.num_kv_heads, strict=True)))
    lines = [
        f"bundle      {b.path}  (format {m.format_version}, {b.size_bytes() / 1e6:.1f} MB)",
        f"model       {m.model.source_model_type} -> {m.model.arch}: {m.model.parameters / 1e6:.2f}M parameters, "
        f"{m.model.num_layers} layers, hidden {m.model.hidden_size}, heads/kv {heads}, vocab {m.model.vocab_size}",
        f"graph       {m.graph.flavor} flavor, opset {m.graph.opset}, weights {m.graph.weight_dtype}, "
        f"activations {m.graph.activation_dtype}, {m.graph.weight_bytes / 1e6:.1f} MB read per token",
        f"cache       sinks {m.cache.sinks}, window {m.cache.window}, slack {m.cache.slack} "
        f"(KV update: {m.graph.kv['update']})",
        f"tokenizer   bos {m.tokenizer.bos_token_id}, eos {m.tokenizer.eos_token_ids}",
        f"quantized   {m.quantization.get('method')}",
        f"validation  max rel err {m.validation.max_rel_err:.2e} <= {m.validation.tolerance:g} "
        f"({len(m.validation.cases)} cases, {m.validation.seconds:.1f}s)",
    ]
    lines += [f"            {c.name}: {c.max_rel_err:.2e}" for c in m.validation.cases]
    lines.append(f"exported    {m.provenance.get('exported_at')} by {m.provenance.get('exporter')}")
    verdict = "not verified (--no-verify)" if no_verify else "all sha256 match"
    lines.append(f"files       {', '.join(m.files)}: {verdict}")
    click.echo("\n".join(lines))
