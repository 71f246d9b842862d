"""edge-bench: the report's fields and their arithmetic, warm-up exclusion, estimate labels, energy
through an injected meter, the HTML plot, compare, the field log, and the CLIs' one-line errors."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import threading
import time

import onnxruntime
import pytest
from click.testing import CliRunner

from edge_runtime import kernels
from edge_runtime.bench import fieldlog
from edge_runtime.bench.environment import bundle_sha256, cpu_features, cpu_line, environment
from edge_runtime.bench.figures import MAIN_FIGURES, get
from edge_runtime.bench.plot import power_html
from edge_runtime.bench.report import REPORT_VERSION, build_report, compare, format_report, read_report, write_json
from edge_runtime.bench.runner import BenchSettings, deterministic_prompt, run_bench
from edge_runtime.cli.bench import main as bench_cli
from edge_runtime.cli.run import main as run_cli
from edge_runtime.engine import load
from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.targets import load_target
from edge_runtime.telemetry import Boundary, MeterOptions, PowerMeter, meter_for_profile
from edge_runtime.tokenizer import Tokenizer

TARGET = {"name": "x86", "source": "test", "detection": "given"}


@pytest.fixture(scope="module")
def bundle(tied_bundle):
    return tied_bundle


@pytest.fixture(scope="module")
def profile():
    return load_target("x86")


@pytest.fixture(scope="module")
def no_sensor_root(tmp_path_factory):
    """A machine with no sensors: only a frozen /proc/stat, so the estimate is the fallback (and constant)."""
    root = tmp_path_factory.mktemp("nosensor")
    (root / "proc").mkdir()
    (root / "proc/stat").write_text("cpu  100 0 50 1000 10 0 0 0 0 0\ncpu0 100 0 50 1000 10 0 0 0 0 0\n")
    return root


@pytest.fixture(scope="module")
def estimate_run(bundle, profile, no_sensor_root):
    settings = BenchSettings(prompt_tokens=20, gen_tokens=8, trials=3, warmup=2, idle_seconds=0.15)
    seen: list[int] = []
    run = run_bench(
        bundle,
        profile,
        settings,
        meter_options=MeterOptions(root=no_sensor_root),
        on_trial=lambda i, figures, energy: seen.append(i),
    )
    return run, build_report(run, TARGET), seen


class ConstantMeter(PowerMeter):
    """A sensor with a known power: `level["watts"]`, read on the real monotonic clock."""

    kind_name = "fake"
    boundary = Boundary.MODULE_INPUT
    max_rate_hz = 200.0

    def __init__(self, level: dict[str, float]) -> None:
        super().__init__(time.monotonic)
        self.level = level

    @property
    def description(self) -> str:
        return "fake module input"

    def _read(self):
        return self.level["watts"], {}


# -- the report -----------------------------------------------------------------------------------


def test_report_has_every_field_and_consistent_values(estimate_run, bundle):
    run, report, _ = estimate_run
    assert report["report_version"] == REPORT_VERSION
    assert set(report) >= {"environment", "target", "bundle", "settings", "measurement", "load", "idle", "trials"}
    env = report["environment"]
    assert env["onnxruntime"] == onnxruntime.__version__ and env["device"]
    manifest = run.engine.manifest
    # The bundle digest is built from the manifest's checksums, which match the files on disk.
    for name, sha in manifest.files.items():
        assert hashlib.sha256((bundle / name).read_bytes()).hexdigest() == sha
    assert report["bundle"]["sha256"] == bundle_sha256(manifest)
    assert report["bundle"]["weight_bytes_per_token"] == manifest.graph.weight_bytes
    s = report["settings"]
    assert (s["prompt_tokens"], s["gen_tokens"], s["trials"], s["warmup"]) == (20, 8, 3, 2)
    assert s["cache"] == {"sinks": run.engine.geometry.sinks, "window": run.engine.geometry.window}
    for t in report["trials"]:
        assert (t["prompt_tokens"], t["generated_tokens"], t["finish_reason"]) == (20, 8, "length")
        assert t["weight_bandwidth_gb_s"] == pytest.approx(
            manifest.graph.weight_bytes * t["decode_tokens_per_s"] / 1e9, rel=1e-3
        )
        e = t["energy"]
        assert e["total_j"] == pytest.approx(e["prefill_j"] + e["decode_j"])
        assert e["tokens_per_joule"] == pytest.approx(t["generated_tokens"] / e["total_j"])
        assert e["joules_per_token"] * e["tokens_per_joule"] == pytest.approx(1.0)
        assert e["covered_fraction"] == pytest.approx(1.0)
        assert e["prefill_s"] * 1e3 == pytest.approx(t["ttft_ms"], rel=1e-3, abs=1e-3)  # phases = the stream's timings
        above = e["above_idle"]
        assert above["idle_watts"] == pytest.approx(report["idle"]["watts"])
        assert above["total_j"] == pytest.approx(e["total_j"] - above["idle_watts"] * (e["prefill_s"] + e["decode_s"]))
    med = report["median"]
    for path, *_ in MAIN_FIGURES:
        values = [get(t, path) for t in report["trials"]]
        if all(v is not None for v in values):
            assert get(med, path) == pytest.approx(statistics.median(values))
    assert json.loads(json.dumps(report)) == report  # plain JSON all the way down


def test_reports_name_the_cpu_its_kernel_features_and_the_kernels_that_ran(tmp_path, estimate_run):
    """Figures move with the CPU (AMX, VNNI, NEON dot product...): every report names them."""
    x86, arm = tmp_path / "x86", tmp_path / "arm"
    (x86 / "proc").mkdir(parents=True)
    (x86 / "proc/cpuinfo").write_text(
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
        "flags\t\t: fpu sse2 avx2 fma f16c avx512f avx512bw avx512_vnni amx_tile amx_int8\n"
    )
    (arm / "proc").mkdir(parents=True)
    (arm / "proc/cpuinfo").write_text("processor\t: 0\nFeatures\t: fp asimd aes crc32 asimddp\nCPU part\t: 0xd0b\n")
    assert cpu_features(x86) == ["AVX2", "FMA", "F16C", "AVX-512F", "AVX-512 VNNI", "AMX-INT8"]
    assert cpu_features(arm) == ["NEON", "NEON dot product"] and cpu_features(tmp_path) == []
    isa = kernels.isa() or "not available"
    assert (
        cpu_line(x86)
        == f"Intel(R) Xeon(R) Processor (AVX2, FMA, F16C, AVX-512F, AVX-512 VNNI, AMX-INT8; edge kernels {isa})"
    )
    assert cpu_line(tmp_path) == f"unknown CPU (flags unknown; edge kernels {isa})"  # the scripts' table headers
    env = environment(x86)
    assert env["cpu"] == "Intel(R) Xeon(R) Processor" and "AMX-INT8" in env["cpu_features"]
    _, report, _ = estimate_run
    cpu = [ln for ln in format_report(report).splitlines() if ln.startswith("cpu ")]
    assert cpu and "edge kernels:" in cpu[0] and report["environment"]["cpu_features"] == cpu_features()


def test_warmup_runs_are_excluded_from_the_figures(estimate_run):
    run, report, seen = estimate_run
    assert len(run.warmups) == 2 and all(r.phases[0].name == "warmup" for r in run.warmups)
    assert len(report["trials"]) == 3 and seen == [0, 1, 2]
    # Each measured trial's energy comes from its own sampler run, which holds no warm-up phase.
    assert all([p.name for p in r.phases] == ["prefill", "decode"] for r in run.trials)
    assert all(r.total.start > w.total.end for r in run.trials for w in run.warmups)


def test_without_a_sensor_every_energy_figure_says_estimate(estimate_run, profile, no_sensor_root):
    _, report, _ = estimate_run
    choice = meter_for_profile(profile, MeterOptions(root=no_sensor_root))
    assert choice.meter.estimate and any("estimate" in n for n in choice.notes)
    m = report["measurement"]
    assert m["estimate"] and m["source"] == "estimate" and m["boundary"] == "estimate" and "estimate" in m["label"]
    assert report["load"]["source"] == report["idle"]["source"] == "estimate"
    assert all(t["energy"]["source"] == "estimate" for t in report["trials"])
    # The frozen /proc/stat means zero utilisation: the estimate sits at the profile's idle watts.
    assert report["trials"][0]["energy"]["avg_watts"] == pytest.approx(profile.power.idle_watts)
    text = format_report(report)
    energy_lines = [ln for ln in text.splitlines() if " J" in ln or "tok/J" in ln or " W " in ln]
    assert len(energy_lines) >= 3 and all("estimate" in ln for ln in energy_lines)


def test_energy_from_an_injected_meter_is_power_times_time(bundle, profile):
    level = {"watts": 2.0}

    def progress(msg: str) -> None:
        if msg.startswith("warm-up"):  # the idle baseline is done: the "device" gets busy
            level["watts"] = 7.5

    settings = BenchSettings(prompt_tokens=16, gen_tokens=10, trials=2, warmup=1, idle_seconds=0.1, sample_hz=200)
    run = run_bench(bundle, profile, settings, meter=ConstantMeter(level), progress=progress)
    report = build_report(run, TARGET)
    assert not report["measurement"]["estimate"] and report["measurement"]["boundary"] == "module_input"
    assert report["load"]["energy_j"] == pytest.approx(2.0 * report["load"]["seconds"], rel=0.02)
    assert report["idle"]["watts"] == pytest.approx(2.0, rel=0.02)
    for t in report["trials"]:
        e = t["energy"]
        assert e["source"] == "sensor"
        decode_s = (t["generated_tokens"] - 1) / t["decode_tokens_per_s"]
        assert e["prefill_j"] == pytest.approx(7.5 * t["ttft_ms"] / 1e3, rel=0.02)
        assert e["decode_j"] == pytest.approx(7.5 * decode_s, rel=0.02)
        assert e["avg_watts"] == pytest.approx(7.5, rel=0.02)
        above = e["above_idle"]
        assert above["total_j"] == pytest.approx(5.5 / 7.5 * e["total_j"], rel=0.02)
        assert above["tokens_per_joule"] == pytest.approx(t["generated_tokens"] / above["total_j"])


def test_plot_is_self_contained_and_names_the_phases(estimate_run, tmp_path):
    run, report, _ = estimate_run
    m = report["measurement"]
    page = power_html(
        run.named_reports(), estimate=True, boundary=m["label"], summary=format_report(report), idle_watts=1.0
    )
    for external in ("http:", "https:", "//", "<script", "<link", "src=", "href=", "url("):
        assert external not in page.replace("</", "<"), external
    assert "<svg" in page and "<polyline" in page and "estimate" in page
    for phase in ("load", "idle", "warmup", "prefill", "decode"):
        assert f'data-phase="{phase}"' in page
    assert page.count('data-phase="prefill"') == 3  # one band per measured trial


def test_deterministic_prompt_has_the_exact_length_and_no_eos(bundle):
    engine = load(bundle)
    tok = Tokenizer.for_engine(engine)
    eos = engine.manifest.tokenizer.eos_token_ids
    for n in (1, 7, 300):
        ids = deterministic_prompt(tok, n, eos)
        assert len(ids) == n and ids == deterministic_prompt(tok, n, eos)
        assert not set(ids) & set(eos) and ids[0] == engine.manifest.tokenizer.bos_token_id


@pytest.mark.parametrize(
    "kwargs,flag", [({"gen_tokens": 1}, "--gen-tokens"), ({"trials": 0}, "--trials"), ({"idle_seconds": -1}, "--idle")]
)
def test_settings_out_of_range_name_the_flag(kwargs, flag):
    with pytest.raises(EdgeRuntimeError, match=flag):
        BenchSettings(**kwargs)


# -- compare --------------------------------------------------------------------------------------


def _synthetic(decode_tps: float, tpj: float, boundary: str = "module_input") -> dict:
    return {
        "report_version": REPORT_VERSION,
        "settings": {"prompt_tokens": 128, "gen_tokens": 128},
        "measurement": {"boundary": boundary, "estimate": boundary == "estimate"},
        "median": {
            "ttft_ms": 40.0,
            "decode_tokens_per_s": decode_tps,
            "itl_ms": {"p50": 1000 / decode_tps, "p90": 2.0, "p99": 3.0},
            "energy": {"total_j": 10.0, "tokens_per_joule": tpj, "above_idle": None},
        },
    }


def test_compare_gives_b_over_a(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_json(_synthetic(50.0, 4.0), a)
    write_json(_synthetic(75.0, 5.0), b)
    rows, warnings = compare(read_report(a), read_report(b))
    by = {r["figure"]: r for r in rows}
    assert by["decode_tokens_per_s"]["ratio"] == pytest.approx(1.5)
    assert by["energy.tokens_per_joule"]["ratio"] == pytest.approx(1.25)
    assert by["itl_ms.p50"]["ratio"] == pytest.approx(50.0 / 75.0)
    assert by["ttft_ms"]["ratio"] == pytest.approx(1.0)
    assert by["energy.above_idle.tokens_per_joule"]["ratio"] is None  # missing in both: no ratio invented
    assert not warnings
    r = CliRunner().invoke(bench_cli, ["compare", str(a), str(b)])
    assert r.exit_code == 0, r.output
    decode_line = next(ln for ln in r.stdout.splitlines() if ln.startswith("decode (tok/s"))
    assert decode_line.split()[-1] == "1.500"
    write_json(_synthetic(75.0, 5.0, boundary="estimate"), b)
    rows, warnings = compare(read_report(a), read_report(b))
    assert any("boundaries differ" in w for w in warnings)
    assert all(r["estimate"] for r in rows if r["figure"].startswith("energy."))


def test_a_report_of_another_version_is_refused(tmp_path):
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"report_version": 99}))
    with pytest.raises(EdgeRuntimeError, match="report_version 99"):
        read_report(p)


# -- the field log --------------------------------------------------------------------------------


def _record(target: str, sha: str, decode_tps: float) -> dict:
    return fieldlog.make_record(
        "edge-bench",
        environment={"device": "test board"},
        target=target,
        bundle={"sha256": sha, "path": "/b"},
        settings={"gen_tokens": 8},
        measurement={"boundary": "estimate", "source": "estimate"},
        figures={"decode_tokens_per_s": decode_tps, "energy": {"tokens_per_joule": decode_tps / 10}},
        run_id="r1",
    )


def test_field_log_appends_fsynced_records_and_summarizes(tmp_path, monkeypatch):
    log = tmp_path / "field.jsonl"
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if log.exists():
            synced.append(log.read_text())  # what was on disk when fsync ran

    monkeypatch.setattr(fieldlog.os, "fsync", fsync)
    for tps in (10.0, 30.0, 20.0):
        fieldlog.append_record(log, _record("rpi5", "aa" * 32, tps))
    fieldlog.append_record(log, _record("orin-nano", "bb" * 32, 99.0))
    lines = log.read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(ln)["record_version"] == fieldlog.RECORD_VERSION for ln in lines)
    # Each record was flushed before an fsync ran: some fsync saw the file end exactly with it.
    for i in range(len(lines)):
        assert "\n".join(lines[: i + 1]) + "\n" in synced

    with log.open("ab") as f:  # a crash mid-write: half a record, no newline
        f.write(json.dumps(_record("rpi5", "aa" * 32, 1.0)).encode()[:57])
    contents = fieldlog.read_log(log)
    assert len(contents.records) == 4 and contents.truncated_tail == 57 and not contents.bad_lines
    groups = {g["target"]: g for g in fieldlog.summarize(contents)}
    rpi = groups["rpi5"]
    assert rpi["count"] == 3 and rpi["estimate"]
    assert rpi["figures"]["decode_tokens_per_s"] == {"median": 20.0, "min": 10.0, "max": 30.0, "n": 3}
    assert rpi["figures"]["energy.tokens_per_joule"]["median"] == pytest.approx(2.0)
    assert groups["orin-nano"]["count"] == 1
    r = CliRunner().invoke(bench_cli, ["summary", str(log)])
    assert r.exit_code == 0, r.output
    assert "truncated" in r.stdout and "57 bytes" in r.stdout and "(estimate)" in r.stdout

    # The next append starts a fresh line: the cut record becomes a skipped line, the new one is whole.
    fieldlog.append_record(log, _record("rpi5", "aa" * 32, 40.0))
    contents = fieldlog.read_log(log)
    assert len(contents.records) == 5 and contents.truncated_tail is None
    assert [n for n, _ in contents.bad_lines] == [5]


# -- the CLIs -------------------------------------------------------------------------------------


def test_edge_bench_cli_writes_report_plot_and_log(bundle, profile, tmp_path):
    out, plot, log = tmp_path / "r.json", tmp_path / "p.html", tmp_path / "f.jsonl"
    args = [str(bundle), "--target", "x86", "--prompt-tokens", "12", "--gen-tokens", "4", "--trials", "2"]
    r = CliRunner().invoke(bench_cli, [*args, "--json-out", str(out), "--plot", str(plot), "--log", str(log)])
    assert r.exit_code == 0, r.output
    report = read_report(out)
    assert len(report["trials"]) == 2 and report["target"]["name"] == "x86"
    records = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert [rec["trial"] for rec in records] == [0, 1] and len({rec["run_id"] for rec in records}) == 1
    assert records[0]["bundle_sha256"] == report["bundle"]["sha256"]
    assert records[1]["figures"] == report["trials"][1]
    # Whatever this machine has, the report and the plot say "estimate" exactly when no sensor was read.
    estimate = meter_for_profile(profile).meter.estimate
    assert report["measurement"]["estimate"] is estimate
    assert ("(estimate)" in r.stdout) is estimate and ("estimate" in plot.read_text()) is estimate
    assert "prefill" in plot.read_text() and "decode" in plot.read_text()


def test_edge_bench_speculative_reports_acceptance_and_tokens_per_call(bundle, tmp_path):
    """The bench prompt is a passage cycled to length, so prompt lookup finds it: every trial reports its own
    acceptance and tokens per target call, and the median line says what proposed them."""
    out = tmp_path / "r.json"
    args = [str(bundle), "--target", "x86", "--prompt-tokens", "60", "--gen-tokens", "40", "--trials", "2"]
    r = CliRunner().invoke(bench_cli, [*args, "--speculative", "lookup", "--json-out", str(out)])
    assert r.exit_code == 0, r.output
    report = read_report(out)
    assert report["settings"]["speculative"] == "prompt lookup, k <= 8"
    for trial in report["trials"]:
        spec = trial["speculative"]
        assert spec["emitted"] == 39  # every token after the prefill's, counted once
        assert spec["proposed"] >= spec["accepted"] >= 0 and spec["steps"] <= 39
        assert spec["tokens_per_step"] == pytest.approx(39 / spec["steps"], abs=1e-4)
    assert "speculative (prompt lookup, k <= 8)" in r.stdout and "tokens per target call" in r.stdout
    plain = CliRunner().invoke(bench_cli, [*args, "--json-out", str(out)])
    assert plain.exit_code == 0 and "speculative" not in read_report(out)["trials"][0]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--draft-tokens", "3"], "--draft-tokens needs --speculative lookup or --draft BUNDLE"),
        (["--speculative", "lookup", "--draft-tokens", "0"], "k) must be an integer >= 1"),
        (["--speculative", "lookup", "--draft-tokens", "999"], "slack rows"),
    ],
)
def test_edge_bench_bad_speculation_is_one_line(bundle, extra, message):
    r = CliRunner().invoke(bench_cli, [str(bundle), "--target", "x86", "--gen-tokens", "4", *extra])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert message in r.output.strip().splitlines()[-1]


def test_edge_run_stats_show_bandwidth_and_energy_and_log_a_record(bundle, tmp_path):
    log = tmp_path / "f.jsonl"
    args = ["--bundle", str(bundle), "--target", "x86", "--prompt", "To be", "--max-tokens", "6"]
    r = CliRunner().invoke(run_cli, [*args, "--stats", "--log", str(log)])
    assert r.exit_code == 0, r.output
    assert "weight bandwidth" in r.stderr and "tok/J total" in r.stderr and "power:" in r.stderr
    (record,) = [json.loads(ln) for ln in log.read_text().splitlines()]
    f = record["figures"]
    assert record["tool"] == "edge-run" and f["generated_tokens"] == 6
    assert f["energy"]["load_j"] > 0 and f["energy"]["tokens_per_joule"] == pytest.approx(6 / f["energy"]["total_j"])
    assert record["settings"]["max_tokens"] == 6


@pytest.mark.parametrize(
    "args,message",
    [
        (["/nonexistent/bundle", "--target", "x86"], "/nonexistent/bundle"),
        (["{bundle}", "--target", "no-such-board"], "no-such-board"),
        (["{bundle}", "--target", "x86", "--gen-tokens", "1"], "--gen-tokens"),
        (["compare", "/nonexistent/a.json", "/nonexistent/b.json"], "/nonexistent/a.json"),
        (["summary", "/nonexistent/log.jsonl"], "/nonexistent/log.jsonl"),
    ],
)
def test_edge_bench_errors_are_one_line(bundle, args, message):
    r = CliRunner().invoke(bench_cli, [a.format(bundle=bundle) for a in args])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert message in r.output.strip().splitlines()[-1]


def test_edge_run_stats_error_stops_the_sampler(tmp_path):
    r = CliRunner().invoke(run_cli, ["--bundle", str(tmp_path / "missing"), "--target", "x86", "--stats"])
    assert r.exit_code == 1 and "missing" in r.output.strip().splitlines()[-1]
    assert not [t for t in threading.enumerate() if t.name == "power-sampler"]


def test_plot_ticks_are_round_and_trials_and_estimates_are_labelled(estimate_run):
    import re

    from edge_runtime.bench.plot import nice_ticks

    assert nice_ticks(0, 30.8) == [0, 10, 20, 30, 40]
    assert nice_ticks(0, 6.16 * 5) == nice_ticks(0, 30.8)
    assert nice_ticks(0, 0.9) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0, 12.5) == [0, 2.5, 5, 7.5, 10, 12.5]
    run, _report, _ = estimate_run
    page = power_html(run.named_reports(), estimate=True, boundary="b", summary="x" * 500, idle_watts=1.0)
    labels = [float(v) for v in re.findall(r'text-anchor="end">([0-9.e+-]+)</text>', page)]
    assert labels and all(v == round(v, 2) for v in labels)  # no 6.16, 12.32 ...
    names = [n for n, _r in run.named_reports()]
    assert all(f">{name}</text>" in page for name in names)  # every trial named on the plot
    assert 'class="estimate-note"' in page and 'stroke-dasharray="5 4"' in page
    assert "white-space:pre-wrap" in page  # the summary wraps instead of being cut off
    measured = power_html(run.named_reports(), estimate=False, boundary="b", summary="s")
    assert 'class="estimate-note"' not in measured and 'stroke-dasharray="5 4"' not in measured
