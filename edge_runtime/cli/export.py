"""`edge-export`: build a validated bundle from a Hugging Face checkpoint, or inspect one.

edge-export CHECKPOINT_DIR|MODEL.gguf|demo -o OUT_DIR [--target T] [--flavor ort|trt] [--dtype fp32|fp16]
            [--sinks N] [--window N] [--quant none|int8|int4|int4-awq|int4-gptq] [--block N]
            [--prune RATIO] [--prune-layers N] | [--prune-budget PCT] [--calib FILE]
            [--fp-embeddings | --table-bits 4|8]
            [--kernel mlas|edge] [--mixed none|llama-down|sensitivity] [--gguf-codes keep|requantize]
            [--kv-dtype fp32|fp16|q8] [--max-memory SIZE] [--quiet]
edge-export inspect BUNDLE_DIR

Without --target the defaults are portable (ort flavor, float weights, ONNX Runtime's own kernels: runs on
any machine with ONNX Runtime); --target T takes the device profile's settings, and explicit flags win.
"""

from __future__ import annotations

import enum
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import click

from .common import debug_option, friendly_errors


class _Parsed(click.ParamType):
    """An option checked when parsed by its enum's `parse` (QuantMethod, KvDtype: the one list of values, and
    the aliases it takes), imported then, not when the CLI loads: the exporters pull numpy and the reference
    model in. The value is the enum member the export plan holds."""

    def __init__(self, module: str, enum_name: str, name: str) -> None:
        self.module, self.enum_name, self.name = module, enum_name, name

    def _enum(self) -> type[enum.Enum]:
        return getattr(importlib.import_module(self.module), self.enum_name)

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(m.value for m in self._enum()) + "]"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> enum.Enum:
        from edge_runtime.errors import ExportError

        kind = self._enum()
        if isinstance(value, kind):
            return value
        try:
            return kind.parse(str(value))  # type: ignore[attr-defined]
        except ExportError as e:
            self.fail(str(e), param, ctx)


class _ByteSize(click.ParamType):
    """A byte count: digits with an optional K, M or G suffix (1024-based; a trailing B or iB is allowed)."""

    name = "size"
    _UNITS: ClassVar[dict[str, int]] = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().upper().removesuffix("IB").removesuffix("B")
        unit = text[-1:] if text[-1:] in self._UNITS and text[-1:] else ""
        number = text[: len(text) - len(unit)]
        try:
            size = float(number) * self._UNITS[unit]
        except ValueError:
            size = -1
        if not size > 0:
            self.fail(f"{value!r} is not a size in bytes (e.g. 6000000000, 6G, 512M)", param, ctx)
        return int(size)


if TYPE_CHECKING:
    from edge_runtime.exporters.plan import KvDtype
    from edge_runtime.exporters.quant import QuantMethod
    from edge_runtime.manifest import Manifest
    from edge_runtime.targets import TargetProfile


class _DefaultToBuild(click.Group):
    """`edge-export CHECKPOINT ...` means `edge-export build CHECKPOINT ...`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["build", *args]
        return super().parse_args(ctx, args)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """`edge-export --help` shows the build options too: building is what the command is mostly for."""
        super().format_help(ctx, formatter)
        build = self.commands["build"]
        sub = click.Context(build, info_name="build", parent=ctx)
        records = [r for p in build.get_params(sub) if isinstance(p, click.Option) and (r := p.get_help_record(sub))]
        with formatter.section("Build options (edge-export CHECKPOINT -o OUT [OPTIONS])"):
            formatter.write_dl(records)


@click.group(cls=_DefaultToBuild)
def main() -> None:
    """Export Hugging Face checkpoints (a directory, a .gguf file, or a bundled model's name: demo) to
    edge-runtime bundles; `build` is the default command.

    Without --target every default is portable: ort flavor, float weights, ONNX Runtime's own kernels (a bundle
    that runs on any machine with ONNX Runtime). --target T applies the device profile's flavor, quantization,
    block, kernel, table bits and cache geometry; explicit flags win."""


@main.command("build")
@click.argument("checkpoint")
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="Bundle directory to write.")
@click.option(
    "--target",
    default=None,
    help="Export for this device profile (a name such as nuc or rpi5, a YAML path, or auto): its flavor, "
    "quantization, block, kernel, table bits, mixed-precision plan and cache geometry; explicit flags win. Without it "
    "every default is portable.",
)
@click.option(
    "--flavor",
    type=click.Choice(["ort", "trt"]),
    default=None,
    help="Graph flavor: ONNX Runtime CPU (ort) or TensorRT-parsable (trt) [default: ort, or the target's].",
)
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "fp16"]),
    default="fp32",
    show_default=True,
    help="Weight precision (trt also runs fp16 activations).",
)
@click.option("--sinks", type=int, default=None, help="StreamingLLM attention sinks [default: 4, or the target's].")
@click.option(
    "--window",
    type=int,
    default=None,
    help="Recent tokens attended [default: the trained context up to 2044, or the target's cut to it].",
)
@click.option(
    "--quant",
    type=_Parsed("edge_runtime.exporters.quant", "QuantMethod", "method"),
    default=None,
    help="Weight quantization: none, int8 (per channel), int4 (round to nearest), int4-awq (activation-aware), "
    "int4-gptq [default: none, or the target's].",
)
@click.option(
    "--block",
    type=int,
    default=None,
    help="INT4 block size: 32, 64 or 128 [default: 32 ort, 128 trt, or the target's]. With --quant int8: INT8 "
    "Linears in blocks of this size (32 is llama.cpp's Q8_0 form; ort flavor; closer to the checkpoint, 0.5 bit "
    "a weight more, and MatMulNBits under --kernel edge) instead of per output channel.",
)
@click.option("--prune", type=float, default=None, help="Remove this fraction (0..1) of attention+MLP parameters.")
@click.option(
    "--prune-layers",
    type=click.IntRange(min=0),
    default=0,
    metavar="N",
    help="Also remove N whole decoder layers, those the previous layer's refitted down_proj takes over best "
    "(never the first, never two adjacent). --prune-budget considers whole layers itself.",
)
@click.option(
    "--prune-budget",
    type=float,
    default=None,
    metavar="PCT",
    help="Instead of --prune: remove the most attention+MLP parameters that keep the calibration perplexity within "
    "+PCT percent of the unpruned model's (bisection over the global ranking; a few float64 forwards).",
)
@click.option(
    "--calib",
    type=click.Path(path_type=Path),
    default=None,
    help="Calibration text for int4-awq/int4-gptq/--prune [default: calibration.txt beside the checkpoint, "
    "else edge-runtime's general English + code text].",
)
@click.option("--fp-embeddings", is_flag=True, help="Keep the embedding table and LM head unquantized.")
@click.option(
    "--table-bits",
    type=click.Choice(["8", "4"]),
    default=None,
    help="Embedding table / LM head: INT8 per row, or INT4 in --block blocks (ort flavor; half the LM head's bytes) "
    "[default: 8, or the target's].",
)
@click.option(
    "--kernel",
    type=click.Choice(["mlas", "edge"]),
    default=None,
    help="Kernels of quantized bundles: ONNX Runtime's own (every platform) or edge-runtime's ops where they "
    "apply (MatMulQ4 for INT4 block-32 products, MatMulQ8 for INT8 ones, SiluMul, LinearAttention, RingAttention; "
    "x86-64 AVX2, the matmuls on AVX-512 VNNI where the CPU has it; faster decode; the bundle then runs only where "
    "edge-runtime's kernel library is built) [default: mlas, or the target's where the library runs here].",
)
@click.option(
    "--mixed",
    type=click.Choice(["none", "llama-down", "sensitivity"]),
    default=None,
    help="INT4 exports: Linear groups (per layer qkv, o, gate_up, down) kept INT8 per channel. llama-down: down_proj "
    "in llama.cpp Q4_K_M's Q6_K layers (first and last eighth, every third between); sensitivity: the groups whose "
    "INT4 error on calibration text is largest per weight, up to 4.5 code bits a Linear weight (calibrates). "
    "[default: none, or the target's mixed_precision for an INT4 export]",
)
@click.option(
    "--gguf-codes",
    type=click.Choice(["keep", "requantize"]),
    default=None,
    help="A .gguf source's Q4_0/Q8_0 tensors: keep their codes and fp16 block scales as they are (bit-exact "
    "llama.cpp weights; Q4_0 into --quant int4 block 32, Q4_0/Q8_0 into --quant int8 as INT8 blocks of 32; ort "
    "flavor) or requantize the dequantized floats as for a Hugging Face checkpoint. Other GGUF types (Q4_1, "
    "K-quants, floats) are always requantized: our format holds their grid only approximately. [default: keep "
    "where --quant int4/int8 allows it (requantizing adds a second rounding to llama.cpp's), else requantize "
    "with a note].",
)
@click.option(
    "--kv-dtype",
    type=_Parsed("edge_runtime.exporters.plan", "KvDtype", "type"),
    default=None,
    help="KV cache element type. fp16 halves the cache's memory and the bytes attention reads per token at a full "
    "ring; q8 (int8 codes and an fp32 scale per row) nearly quarters them. Both need --kernel edge "
    "(LinearAttention/RingAttention) on a quantized ort bundle. The manifest's graph.kv.dtype spellings "
    "(float32, float16) are taken too. [default: fp16 where those ops run (a quantized ort bundle on the edge "
    "kernels, as llama.cpp caches); else fp32]",
)
@click.option(
    "--max-memory",
    type=_ByteSize(),
    default=None,
    metavar="SIZE",
    help="Refuse the export up front, with the estimate, when its estimated peak memory is above SIZE (bytes, or "
    "with a K, M or G suffix: 1024-based, e.g. 6G). The estimate is printed either way.",
)
@click.option(
    "--chat-template",
    type=click.Path(path_type=Path),
    default=None,
    metavar="FILE",
    help="The bundle's chat template: a Jinja file (UTF-8, at most 1 MiB) in place of the checkpoint's or GGUF's, "
    "or for one that has none. Checked before any work by rendering a two-turn conversation; the manifest records "
    "where the template came from (edge-export inspect).",
)
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (atomically).")
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="Print nothing but a one-line error (and warnings): no progress, no summary line. Without it, progress "
    "goes to stderr: a bar on a terminal, plain lines with an ETA otherwise.",
)
@click.option(
    "--build-engine",
    is_flag=True,
    help="With a TensorRT --target (orin-*), on the device: also build the bundle's TensorRT engine into "
    "OUT/trt-engines (what edge-run would build on first use). Needs tensorrt, cuda-python and the GPU. Not verified "
    "on a GPU.",
)
@debug_option
@friendly_errors
def build(
    checkpoint: str,
    out: Path,
    target: str | None,
    flavor: str | None,
    dtype: str,
    sinks: int | None,
    window: int | None,
    quant: QuantMethod | None,
    block: int | None,
    prune: float | None,
    prune_budget: float | None,
    prune_layers: int,
    calib: Path | None,
    fp_embeddings: bool,
    table_bits: str | None,
    kernel: str | None,
    mixed: str | None,
    gguf_codes: str | None,
    kv_dtype: KvDtype | None,
    max_memory: int | None,
    chat_template: Path | None,
    overwrite: bool,
    quiet: bool,
    build_engine: bool,
) -> None:
    """Export CHECKPOINT (a Hugging Face directory, a .gguf file, or a bundled model's name: demo) to a validated
    bundle in OUT. Without --target the defaults are portable; --target T applies the device profile's."""
    from edge_runtime.exporters import plan as p
    from edge_runtime.exporters.gguf_quant import GGUFCodes
    from edge_runtime.exporters.quant import MatMulKernel, MixedPlan
    from edge_runtime.models import resolve_checkpoint
    from edge_runtime.targets import resolve_target

    conflict = p.prune_conflict(prune, prune_budget, prune_layers)
    if conflict:
        raise click.UsageError(conflict)
    source = resolve_checkpoint(checkpoint)
    profile = resolve_target(target).profile if target is not None else None
    flags = p.ExportFlags(
        flavor=p.Flavor(flavor) if flavor else None,
        precision=p.Precision(dtype),
        quant=quant,
        block=block,
        kernel=MatMulKernel(kernel) if kernel else None,
        table_bits=int(table_bits) if table_bits else None,  # type: ignore[arg-type]  # click.Choice: "8" or "4"
        mixed=MixedPlan(mixed) if mixed else None,
        fp_embeddings=fp_embeddings,
        gguf_codes=GGUFCodes(gguf_codes) if gguf_codes else None,
        kv_dtype=kv_dtype,
        sinks=sinks,
        window=window,
        prune=prune,
        prune_budget=prune_budget,
        prune_layers=prune_layers,
        calibration=calib,
        max_memory=max_memory,
        chat_template=chat_template,
        overwrite=overwrite,
    )
    plan = p.plan_export(source, out, flags, profile)
    for note in () if quiet else plan.notes:
        click.echo(f"note: {note}", err=True)
    engine_target = _engine_target(profile) if build_engine else None  # refused before the export, not after
    from edge_runtime.exporters.from_source import export_source, summary_line
    from edge_runtime.exporters.progress import for_stream

    # sys.stderr as it is now (a test's CliRunner swaps it in), not as it was when the module loaded
    progress = for_stream(sys.stderr, quiet=quiet)
    manifest = export_source(plan, progress=progress)
    if not quiet:
        click.echo(summary_line(out, manifest))
    if engine_target is not None:
        from edge_runtime.backends.trt_engine import engine_for_target

        click.echo(f"{out}: TensorRT engine {engine_for_target(out, engine_target, progress)}")


def _engine_target(profile: TargetProfile | None) -> TargetProfile:
    """--build-engine's target: a TensorRT one where TensorRT runs here, else a one-line error."""
    from edge_runtime.backends.tensorrt import unavailable_reason
    from edge_runtime.errors import ExportError

    if profile is None or profile.backend.tensorrt is None:
        raise ExportError(
            "--build-engine builds a TensorRT engine: give a TensorRT --target (orin-nano, orin-nx, orin-agx)"
        )
    reason = unavailable_reason()
    if reason is not None:
        raise ExportError(
            f"--build-engine needs TensorRT on this machine: {reason}; or drop it: edge-run builds the "
            "engine on the device on first use"
        )
    return profile


@main.command("inspect")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--no-verify", is_flag=True, help="Skip the sha256 check of every file.")
@debug_option
@friendly_errors
def inspect(bundle: Path, no_verify: bool) -> None:
    """Print a bundle's manifest summary and verify its checksums."""
    from edge_runtime.bundle import open_bundle
    from edge_runtime.sampling_defaults import model_defaults

    b = open_bundle(bundle, verify=not no_verify, memo=False)  # the explicit check hashes every byte
    m = b.manifest
    heads = sorted(set(zip(m.model.num_heads, m.model.num_kv_heads, strict=True)))
    lines = [
        f"bundle      {b.path}  (format {m.format_version}, {b.size_bytes() / 1e6:.1f} MB)",
        f"model       {m.model.source_model_type} -> {m.model.arch}: {m.model.parameters / 1e6:.2f}M parameters, "
        f"{m.model.num_layers} layers, hidden {m.model.hidden_size}, heads/kv {heads}, vocab {m.model.vocab_size}",
        f"graph       {m.graph.flavor} flavor, opset {m.graph.opset}, weights {m.graph.weight_dtype}, "
        f"activations {m.graph.activation_dtype}, KV cache {m.graph.kv_dtype}, "
        f"{m.graph.weight_bytes / 1e6:.1f} MB read per token; "
        + ("decodes a batch of caches a call (edge-serve --parallel)" if m.graph.batched else "one sequence a call"),
        f"cache       sinks {m.cache.sinks}, window {m.cache.window}, slack {m.cache.slack} "
        f"(KV update: {m.graph.kv['update']})",
        f"tokenizer   bos {m.tokenizer.bos_token_id}, eos {m.tokenizer.eos_token_ids}",
        f"chat        {_template_line(m)}",
        f"sampling    {model_defaults(m.generation).describe()}; flags and request fields win",
        *_quantization_lines(m.quantization),
        f"validation  max rel err {m.validation.max_rel_err:.2e} <= {m.validation.tolerance:g} "
        f"({len(m.validation.cases)} cases, {m.validation.seconds:.1f}s)",
    ]
    basis = m.validation.tolerance_basis
    if "float32_rel_err" in basis:
        lines.append(
            f"            tolerance {basis['rule']}, float32_rel_err {basis['float32_rel_err']:.2e} "
            f"(a numpy float32 forward of these weights), factor {basis['factor']:g}"
        )
    lines += [f"            {c.name}: {c.max_rel_err:.2e}" for c in m.validation.cases]
    lines.append(f"exported    {m.provenance.get('exported_at')} by {m.provenance.get('exporter')}")
    verdict = "not verified (--no-verify)" if no_verify else "all sha256 match"
    lines.append(f"files       {', '.join(m.files)}: {verdict}")
    click.echo("\n".join(lines))


@main.command("targets", short_help="List the device profiles and what each implies on this machine.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout, for machines.")
@click.option(
    "--measurements",
    type=click.Path(path_type=Path),
    default=None,
    metavar="FILE",
    help="Export times measured by scripts/bench_export_time.py [default: the one it wrote into the cache "
    "directory, if any].",
)
@debug_option
@friendly_errors
def targets(as_json: bool, measurements: Path | None) -> None:
    """List the device profiles (--target NAME): flavor, quantization, block, kernels used here, cache, meters,
    memory budget, export time per 100M parameters where measured; * marks what --target auto picks here."""
    import json

    from edge_runtime.targets.listing import listing, to_json, to_text

    result = listing(measurements)
    click.echo(json.dumps(to_json(result), indent=2) if as_json else to_text(result))


def _template_line(m: Manifest) -> str:
    """Where the bundle's chat template came from, or why it has none."""
    if m.tokenizer.chat_template is None:
        return "no chat template (raw prompts only; re-export with --chat-template FILE)"
    origin = m.chat_template_origin
    if origin is None:  # exported before the origin was recorded
        return f"template {m.tokenizer.chat_template}, origin not recorded"
    return f"template {m.tokenizer.chat_template} from {origin.describe()} (sha256 {origin.sha256[:12]})"


def _quantization_lines(q: dict) -> list[str]:
    """The manifest's `quantization` record: method, per-tensor error summary, pruning, perplexity."""
    if q.get("method", "none") == "none":
        lines = [f"quantized   none ({q.get('weights')} weights)"]
    else:
        block = q.get("block")
        level = f", accuracy_level {q['accuracy_level']}" if "accuracy_level" in q else ""
        lines = [
            f"quantized   {q['method']}: Linear int{q.get('linear_bits')} "
            f"{'per channel' if block == 'channel' else f'block {block}'}, embeddings {q.get('embeddings')}{level}"
        ]
    per = q.get("per_tensor") or {}
    if per:
        errs = sorted((v["rel_err"], k) for k, v in per.items())
        lines.append(
            f"            {len(per)} tensors, weight error (rel. Frobenius) median {errs[len(errs) // 2][0]:.2e}, "
            f"max {errs[-1][0]:.2e} ({errs[-1][1]})"
        )
        out = [v["rel_out_err"] for v in per.values() if "rel_out_err" in v]
        if out:
            median = sorted(out)[len(out) // 2]
            lines.append(f"            Linear output error on calibration text: median {median:.2e}")
    if q.get("mixed", {}).get("int8_groups"):
        m = q["mixed"]
        lines.append(
            f"            --mixed {m['plan']}: {len(m['int8_groups'])} groups INT8 per channel "
            f"({100 * m['int8_weight_share']:.1f}% of Linear weights, {m['linear_code_bits']:.2f} code bits a weight)"
        )
    if "gguf_codes" in q:
        g = q["gguf_codes"]
        kinds = "/".join(sorted(set(g["imported"].values())))
        requantized = f"; {len(g['requantized'])} requantized" if g.get("requantized") else ""
        text = g.get("note") or f"GGUF codes kept as stored: {len(g['imported'])} {kinds} tensors{requantized}"
        lines.append(f"            {text}")
    if "exact_parity" in q:
        e = q["exact_parity"]
        lines.append(
            f"            same weights at accuracy_level 0: max rel err {e['max_rel_err']:.2e} <= {e['tolerance']:g}"
        )
    if "pruning" in q:
        p = q["pruning"]
        kept = p["prunable_parameters_after"] / p["prunable_parameters_before"]
        budget = f"budget +{p['budget']['budget_pct']:g}% -> " if "budget" in p else f"ratio {p['ratio']:g} -> "
        gone = f"layers {p['layers_removed']} removed; " if p.get("layers_removed") else ""
        lines.append(
            f"pruned      {budget}kept {kept:.1%} of attention+MLP parameters; {gone}"
            f"MLP widths {p['intermediate_size']}, KV heads {p['num_kv_heads']}"
        )
        if "calibration_ppl" in p:
            c = p["calibration_ppl"]
            lines.append(
                f"            calibration perplexity {c['unpruned']:.3f} -> {c['pruned']:.3f} ({c['change_pct']:+.2f}%)"
            )
    if "calibration" in q:
        c = q["calibration"]
        lines.append(f"calibration {c['file']} ({c['tokens']} tokens)")
    if "heldout_ppl" in q:
        h = q["heldout_ppl"]
        lines.append(
            f"held-out    perplexity {h['original']:.3f} -> {h['exported']:.3f} ({h['change_pct']:+.2f}%), "
            f"{h['tokens']} tokens of heldout.txt"
        )
    return lines
