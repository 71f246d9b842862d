"""`edge-export targets`: every profile with what it implies here, the one `--target auto` picks, and export times
only from a measurements file (scripts/bench_export_time.py's, in the cache directory, or one the user names)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import DetectionError
from edge_runtime.targets import Detection, known_targets, load_target
from edge_runtime.targets import listing as listing_mod
from edge_runtime.targets.listing import (
    MEASUREMENTS_FORMAT,
    NOT_MEASURED,
    here_settings,
    measurements_path,
    read_measurements,
    settings_key,
)

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test sees an empty cache directory: a measurement another test (or the user) wrote is not read."""
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(tmp_path / "cache"))


def _targets(*args: str):
    r = CliRunner().invoke(export_cli, ["targets", *args])
    assert r.exit_code == 0, r.output
    return r.stdout


def _rows(text: str) -> dict[str, str]:
    """Table rows by profile name (the marker column first, then the name)."""
    rows = {}
    for line in text.splitlines()[1:]:
        words = line.split()
        name = words[1] if words and words[0] == "*" else words[0] if words else ""
        if name in known_targets():
            rows[name] = line
    return rows


def _pick(monkeypatch, name: str | None) -> None:
    def detect(root=Path("/")):
        if name is None:
            raise DetectionError("cannot detect the target (test)")
        return Detection(load_target(name), f"detected target '{name}': test")

    monkeypatch.setattr(listing_mod, "detect_target", detect)


def test_every_profile_is_listed_and_targets_is_no_checkpoint_name():
    text = _targets()
    assert set(_rows(text)) == set(known_targets())
    assert text.splitlines()[0].split()[:3] == ["TARGET", "FLAVOR", "QUANTIZATION"]
    assert NOT_MEASURED in text  # the package carries no export times


def test_the_group_help_lists_targets():
    r = CliRunner().invoke(export_cli, ["--help"])
    assert r.exit_code == 0 and "  targets  " in r.stdout


def test_json_has_every_profile_and_what_it_implies():
    data = json.loads(_targets("--json"))
    names = [t["name"] for t in data["targets"]]
    assert names == list(known_targets())
    nuc = next(t for t in data["targets"] if t["name"] == "nuc")
    assert (nuc["flavor"], nuc["quantization"], nuc["block"], nuc["backend"]) == ("ort", "int4-gptq", 32, "onnxruntime")
    assert nuc["kernel"]["profile"] == "edge"
    assert nuc["kernel"]["here"] == ("edge" if data["edge_kernels"]["available"] else "mlas")
    assert nuc["cache"] == {"sinks": 4, "window": 2044} and nuc["meters"] == ["rapl", "estimate"]
    assert nuc["memory_budget_bytes"] == load_target("nuc").memory_budget_bytes
    assert nuc["export_seconds_per_100m_params"] is None and data["export_times"] is None
    orin = next(t for t in data["targets"] if t["name"] == "orin-nano")
    assert (orin["flavor"], orin["kernel"]["here"], orin["block"]) == ("trt", "tensorrt", 128)
    assert data["export_times_note"] == NOT_MEASURED


def test_the_auto_pick_is_marked(monkeypatch):
    _pick(monkeypatch, "rpi5")
    rows = _rows(_targets())
    assert rows["rpi5"].startswith("*") and not any(r.startswith("*") for n, r in rows.items() if n != "rpi5")
    assert "* --target auto picks rpi5 here: detected target 'rpi5': test" in _targets()
    data = json.loads(_targets("--json"))
    assert [t["name"] for t in data["targets"] if t["auto"]] == ["rpi5"] and data["auto"]["target"] == "rpi5"


def test_no_mark_where_detection_fails(monkeypatch):
    _pick(monkeypatch, None)
    text = _targets()
    assert not any(r.startswith("*") for r in _rows(text).values())
    assert "--target auto: cannot detect the target (test)" in text
    assert json.loads(_targets("--json"))["auto"] == {"target": None, "reason": "cannot detect the target (test)"}


def test_the_edge_kernel_column_says_what_runs_here(monkeypatch):
    monkeypatch.setattr(listing_mod.kernels, "available", lambda: False)
    monkeypatch.setattr(listing_mod.kernels, "unavailable_reason", lambda: "not built (test)")
    text = _targets()
    assert "mlas (edge n/a here)" in _rows(text)["nuc"]
    assert "edge-runtime's ops do not run here (not built (test))" in text
    nuc = next(t for t in json.loads(_targets("--json"))["targets"] if t["name"] == "nuc")
    assert nuc["kernel"] == {"profile": "edge", "here": "mlas"}


def _measurements(path: Path, **exports: dict) -> Path:
    data = {
        "format": MEASUREMENTS_FORMAT,
        "cpu": "Test CPU 9000",
        "machine": "x86_64",
        "measured_at": "2031-02-03T04:05:06+00:00",
        "model": "/models/m",
        "exports": exports,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_the_cache_directorys_measurements_are_read():
    key = settings_key(here_settings(load_target("x86")))
    _measurements(measurements_path(), **{key: {"seconds": 30.0, "parameters": 50_000_000}})
    text = _targets()
    rows = _rows(text)
    assert "60.0 s" in rows["x86"]  # 30 s for 50M parameters: 60 s per 100M
    assert "not measured" in rows["nuc"]  # its settings were not in the run
    assert "measured on Test CPU 9000 (x86_64), 2031-02-03, exporting /models/m" in text
    data = json.loads(_targets("--json"))
    x86 = next(t for t in data["targets"] if t["name"] == "x86")
    assert x86["export_seconds_per_100m_params"] == 60.0
    assert data["export_times"]["cpu"] == "Test CPU 9000" and data["export_times"]["file"] == str(measurements_path())


def test_a_named_measurements_file_wins_and_a_bad_one_is_one_line(tmp_path):
    key = settings_key(here_settings(load_target("rpi5")))
    named = _measurements(tmp_path / "m.json", **{key: {"seconds": 200.0, "parameters": 100_000_000}})
    assert "3.3 min" in _rows(_targets("--measurements", str(named)))["rpi5"]
    (tmp_path / "bad.json").write_text('{"format": 99}')
    for bad, needle in ((tmp_path / "bad.json", "not in format"), (tmp_path / "none.json", "No such file")):
        r = CliRunner().invoke(export_cli, ["targets", "--measurements", str(bad)])
        assert r.exit_code == 1 and r.stderr.strip().count("\n") == 0 and needle in r.stderr, r.output


def test_a_damaged_cache_file_does_not_stop_the_listing():
    measurements_path().parent.mkdir(parents=True)
    measurements_path().write_text("{not json")
    text = _targets()
    assert set(_rows(text)) == set(known_targets())
    assert f"{NOT_MEASURED}: export-time measurements '{measurements_path()}' are not JSON" in text


def test_the_bench_script_measures_the_demo(tmp_path):
    """The script on the demo model, one profile's settings: a file the listing reads."""
    out = tmp_path / "times.json"
    page = tmp_path / "export-time.md"
    page.write_text("an older page\n")
    cmd = [sys.executable, str(SCRIPTS / "bench_export_time.py"), "--target", "x86", "--out", str(out)]
    proc = subprocess.run([*cmd, "--write", str(page)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()  # replaced, naming the CPU and the regenerating command, one row for x86
    assert "older" not in text and "scripts/bench_export_time.py" in text and "\n| x86 | `" in text
    m = read_measurements(out)
    key = settings_key(here_settings(load_target("x86")))
    assert list(m.times) == [key] and m.model == "demo" and m.times[key].parameters > 5_000_000
    assert json.loads(out.read_text())["exports"][key]["targets"] == ["x86"]
    x86 = next(t for t in json.loads(_targets("--json", "--measurements", str(out)))["targets"] if t["name"] == "x86")
    assert x86["export_seconds_per_100m_params"] == pytest.approx(m.times[key].per_100m, abs=0.01)
