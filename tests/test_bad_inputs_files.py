"""Files and text a user names on the command line: only regular files of a bounded size are read (a FIFO is
not waited on, /dev/zero not read for ever), YAML aliases are limited, text that is not UTF-8 and names that
are no bundle's are refused. One line each, before any work."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_runtime.cli.bench import main as bench_cli
from edge_runtime.cli.cache import main as cache_cli
from edge_runtime.cli.run import main as run_cli

from .bad_inputs_util import one_line_error

BILLION_LAUGHS = "\n".join(
    [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
)
BILLION_LAUGHS = "name: lol\na: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + BILLION_LAUGHS + "\n"


def _fifo(path: Path) -> Path:
    os.mkfifo(path)  # nobody writes it: a plain open() for reading would block for ever
    return path


def _sparse(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        f.truncate(size)  # the size without the bytes: a bound must refuse it before reading
    return path


def _run(bundle: Path, *args: str):
    return CliRunner().invoke(run_cli, ["--bundle", str(bundle), "--prompt", "Hi", "--max-tokens", "2", *args])


@pytest.mark.parametrize("option", ["--json-schema", "--grammar"])
@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "huge"])
def test_constraint_files_are_bounded_regular_files(tied_bundle, tmp_path, option, kind):
    path = tmp_path / "c.json"
    if kind == "fifo":
        _fifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        _sparse(path, 5 << 20)
    needle = "not a regular file" if kind != "huge" else "over the 4 MiB"
    one_line_error(_run(tied_bundle, "--target", "x86", option, str(path)), option, needle)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--regex", "a\udcff"], "invalid regular expression: not valid UTF-8"),
        (["--choice", "\udcff"], "invalid choice: not valid UTF-8"),
        (["--stop", "x\udcff"], "stop string 'x\\udcff' is not valid UTF-8"),
    ],
)
def test_command_line_text_that_is_not_utf8_is_one_line(tied_bundle, args, needle):
    """Arguments with undecodable bytes reach Python as lone surrogates (PEP 383): the regex one was a
    UnicodeEncodeError traceback from llguidance, the stop string one silently never matched."""
    one_line_error(_run(tied_bundle, "--target", "x86", *args), needle)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (BILLION_LAUGHS, "more than 16 YAML aliases"),
        ("[" * 100_000, "nested too deeply"),
        (None, "over the 1 MiB"),
    ],
    ids=["billion-laughs", "deep", "huge"],
)
def test_target_profile_files_are_bounded(tied_bundle, tmp_path, content, needle):
    path = tmp_path / "board.yaml"
    if content is None:
        _sparse(path, 2 << 20)
    else:
        path.write_text(content)
    one_line_error(_run(tied_bundle, "--target", str(path)), needle)


def test_a_target_profile_that_is_a_fifo_is_not_waited_on(tied_bundle, tmp_path):
    one_line_error(_run(tied_bundle, "--target", str(_fifo(tmp_path / "board.yaml"))), "not a regular file")


def _report(tmp_path: Path, name: str, **changes) -> Path:
    report = {
        "report_version": 1,
        "settings": {"prompt_tokens": 8, "gen_tokens": 8},
        "measurement": {"boundary": "estimate", "estimate": True},
        "median": {"decode_tokens_per_s": 10.0},
    }
    path = tmp_path / name
    path.write_text(json.dumps({**report, **changes}))
    return path


@pytest.mark.parametrize("kind", ["fifo", "huge", "deep", "no-median", "median-a-string", "figure-a-string"])
def test_bench_reports_are_bounded_and_checked(tmp_path, kind):
    a = _report(tmp_path, "a.json")
    b = tmp_path / "b.json"
    if kind == "fifo":
        _fifo(b)
    elif kind == "huge":
        _sparse(b, 17 << 20)
    elif kind == "deep":
        b.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "no-median":
        b = _report(tmp_path, "b.json", median=None)
    elif kind == "median-a-string":
        b = _report(tmp_path, "b.json", median="fast")
    else:  # a figure of the wrong type: compared as n/a, not a format traceback
        b = _report(tmp_path, "b.json", median={"decode_tokens_per_s": "fast"})
        r = CliRunner().invoke(bench_cli, ["compare", str(a), str(b)])
        assert r.exit_code == 0 and "n/a" in r.output, r.output
        return
    r = CliRunner().invoke(bench_cli, ["compare", str(a), str(b)])
    one_line_error(r, "b.json")


def test_a_field_log_that_is_a_fifo_is_not_waited_on(tmp_path):
    one_line_error(CliRunner().invoke(bench_cli, ["summary", str(_fifo(tmp_path / "log.jsonl"))]), "not a regular")


@pytest.mark.parametrize("name", ["", " ", ".", "..", "/", "../bundles", " demo"])
def test_edge_cache_rm_refuses_names_that_are_no_bundles(tmp_path, monkeypatch, name):
    """`edge-cache rm ''` matched every name as a prefix and removed the only cached bundle."""
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(tmp_path))
    only = tmp_path / "bundles" / "demo-ort-fp32-0123456789ab-v0.3.0"
    only.mkdir(parents=True)
    (only / "manifest.json").write_text("{}")
    r = CliRunner().invoke(cache_cli, ["rm", name])
    one_line_error(r, "is not a cached bundle's name")
    assert (only / "manifest.json").is_file()
