"""`edge-bench`: benchmark a bundle on this device, compare two reports, summarize a field log.

edge-bench BUNDLE | --bundle BUNDLE | --model MODEL  [--target auto --prompt-tokens 128 --gen-tokens 128 --trials 3]
           [--idle-seconds 30] [--json-out report.json] [--plot power.html] [--log field.jsonl]
           [--speculative lookup | --draft BUNDLE [--draft-tokens K]]
edge-bench compare A.json B.json
edge-bench summary field.jsonl
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .common import check_writable, debug_option, friendly_errors, model_options, speculative_options, verbose_option

if TYPE_CHECKING:
    from edge_runtime.engine import Engine
    from edge_runtime.speculative import SpeculativeDecoder


class _DefaultToRun(click.Group):
    """`edge-bench BUNDLE ...` means `edge-bench run BUNDLE ...`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultToRun)
def main() -> None:
    """Benchmark bundles: speed, bandwidth and energy per phase (`run` is the default command)."""


@main.command("run")
@click.argument("bundle_arg", metavar="[BUNDLE]", required=False, type=click.Path(path_type=Path))
@click.option(
    "--bundle", type=click.Path(path_type=Path), help="A bundle directory (from edge-export); or give it first."
)
@model_options
@click.option("--prompt-tokens", type=int, default=128, show_default=True, help="Prompt length (a fixed passage).")
@click.option("--gen-tokens", type=int, default=128, show_default=True, help="Tokens generated (EOS ignored).")
@click.option("--trials", type=int, default=3, show_default=True, help="Measured runs; the report gives medians.")
@click.option("--warmup", type=int, default=1, show_default=True, help="Unmeasured runs first.")
@click.option("--idle-seconds", type=float, default=0.0, show_default=True, help="Idle baseline (0 = none).")
@click.option("--sample-hz", type=float, default=None, help="Power sampling rate [default: the target's].")
@click.option("--threads", type=int, default=None, help="Compute threads [default: target, then all cores].")
@click.option("--sinks", type=int, default=None, help="Attention sinks [default: target, then bundle].")
@click.option("--window", type=int, default=None, help="Recent-token window [default: target, then bundle].")
@click.option("--json-out", type=click.Path(path_type=Path), help="Write the versioned JSON report here.")
@click.option("--plot", type=click.Path(path_type=Path), help="Write an HTML page with the power-over-time plot.")
@click.option("--log", "log_file", type=click.Path(path_type=Path), help="Append one record per trial (JSONL).")
@speculative_options
@verbose_option
@debug_option
@friendly_errors
def run(
    bundle_arg: Path | None,
    bundle: Path | None,
    model: str | None,
    target: str,
    prompt_tokens: int,
    gen_tokens: int,
    trials: int,
    warmup: int,
    idle_seconds: float,
    sample_hz: float | None,
    threads: int | None,
    sinks: int | None,
    window: int | None,
    json_out: Path | None,
    plot: Path | None,
    log_file: Path | None,
    speculative: str | None,
    draft: Path | None,
    draft_tokens: int | None,
    verbose: bool,
) -> None:
    """Benchmark BUNDLE (or --bundle, or --model exported on first use): fixed prompt and generation lengths,
    warm-up excluded, medians over trials."""
    from edge_runtime.atomic_write import write_file
    from edge_runtime.bench.environment import bundle_info, environment
    from edge_runtime.bench.fieldlog import append_record, make_record, new_run_id
    from edge_runtime.bench.figures import describe_meter
    from edge_runtime.bench.plot import power_html
    from edge_runtime.bench.report import build_report, format_report, write_json
    from edge_runtime.bench.runner import BenchSettings, run_bench
    from edge_runtime.engine import LoadOptions
    from edge_runtime.errors import EdgeRuntimeError
    from edge_runtime.first_use import resolve_run
    from edge_runtime.manifest import MANIFEST_FILE, Manifest
    from edge_runtime.speculative import from_options
    from edge_runtime.telemetry import EnergyReport

    settings = BenchSettings(prompt_tokens, gen_tokens, trials, warmup, idle_seconds, sample_hz)
    if threads is not None and threads < 0:  # before the target line and the load: one line, nothing run
        raise EdgeRuntimeError(f"threads must be 1 or more (0 or none: one per core), got {threads}")
    if bundle_arg is not None and bundle is not None:
        raise EdgeRuntimeError("give the bundle once: as the first argument or as --bundle")
    bundle = bundle_arg or bundle
    for flag, out in (("--json-out", json_out), ("--plot", plot), ("--log", log_file)):
        if out is not None:
            check_writable(out, flag)
    # The bundle runs under the target it was exported for unless --target names another.
    chosen = resolve_run(bundle, model, target, progress=lambda msg: click.echo(msg, err=True))
    if verbose:
        click.echo(chosen.reason, err=True)
    if chosen.warning:
        click.echo(f"warning: {chosen.warning}", err=True)
    profile, bundle = chosen.profile, chosen.bundle
    manifest = Manifest.read(bundle / MANIFEST_FILE)
    opts = LoadOptions(sinks=sinks, window=window, threads=threads)
    env, info, run_id = environment(), bundle_info(bundle, manifest), new_run_id()
    target_info = {"name": profile.name, "source": profile.source, "detection": chosen.reason}

    def log_trial(i: int, figures: dict, energy: EnergyReport) -> None:
        assert log_file is not None
        record = make_record(
            "edge-bench",
            environment=env,
            target=profile.name,
            bundle=info,
            settings=settings.to_dict(),
            measurement=describe_meter(energy),
            figures=figures,
            run_id=run_id,
            trial=i,
        )
        append_record(log_file, record)

    def decoder(engine: Engine) -> SpeculativeDecoder | None:  # checked once the bundle is loaded
        return from_options(engine, speculative, draft, draft_tokens, threads)

    result = run_bench(
        bundle,
        profile,
        settings,
        opts,
        on_trial=log_trial if log_file is not None else None,
        progress=lambda msg: click.echo(msg, err=True),
        speculative=decoder,
    )
    report = build_report(result, target_info)
    text = format_report(report)
    click.echo(text)
    if json_out is not None:
        write_json(report, json_out)
        click.echo(f"report: {json_out}", err=True)
    if plot is not None:
        m = report["measurement"]
        idle = report["idle"]["watts"] if report["idle"] else None
        page = power_html(
            result.named_reports(), estimate=m["estimate"], boundary=m["label"], summary=text, idle_watts=idle
        )
        write_file(plot, [page.encode("utf-8")], mode=0o644)
        click.echo(f"plot: {plot}", err=True)
    if log_file is not None:
        click.echo(f"field log: {settings.trials} records appended to {log_file}", err=True)


@main.command("compare")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the ratios as JSON.")
@debug_option
@friendly_errors
def compare_cmd(a: Path, b: Path, as_json: bool) -> None:
    """Print B/A for the main figures (medians) of two edge-bench JSON reports."""
    from edge_runtime.bench.report import compare, format_compare, read_report

    rows, warnings = compare(read_report(a), read_report(b))
    if as_json:
        click.echo(json.dumps({"a": str(a), "b": str(b), "rows": rows, "warnings": warnings}, indent=2))
    else:
        click.echo(format_compare(rows, warnings, str(a), str(b)))


@main.command("summary")
@click.argument("log_file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the aggregates as JSON.")
@debug_option
@friendly_errors
def summary_cmd(log_file: Path, as_json: bool) -> None:
    """Aggregate a field log: count and median/min/max per target and bundle."""
    from edge_runtime.bench.fieldlog import format_summary, read_log, summarize

    contents = read_log(log_file)
    groups = summarize(contents)
    if as_json:
        out = {
            "path": str(log_file),
            "records": len(contents.records),
            "truncated_tail_bytes": contents.truncated_tail,
            "bad_lines": [{"line": n, "error": why} for n, why in contents.bad_lines],
            "groups": groups,
        }
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(format_summary(contents, groups))
