"""Bad inputs and faults at run time: Ctrl-C, threads, telemetry, unwritable outputs.

Signals go to real processes: what counts is the exit status and what is on disk afterwards.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import time
from pathlib import Path
from typing import IO

import pytest

from .bad_inputs_util import cli
from .tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def endless_ckpt(tmp_path_factory) -> Path:
    """A tiny checkpoint whose model has no EOS token: generation runs until it is stopped."""
    ck = tmp_path_factory.mktemp("ck")
    save_tiny_checkpoint("llama-tied", ck, eos_token_id=None)
    return ck


@pytest.fixture(scope="module")
def endless(endless_ckpt, tmp_path_factory) -> Path:
    from edge_runtime.exporters.export import ExportOptions, export

    out = tmp_path_factory.mktemp("b") / "endless"
    export(ExportOptions(checkpoint=endless_ckpt, out=out, window=64))
    return out


def _read_until(stream: IO[bytes], done, timeout: float = 120.0) -> bytes:
    """Read a pipe until `done(data)` or the timeout (a hung child fails the test rather than the run)."""
    data, deadline = b"", time.monotonic() + timeout
    fd = stream.fileno()
    while not done(data):
        left = deadline - time.monotonic()
        assert left > 0, f"timed out; read so far: {data[-2000:]!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"pipe closed early; read so far: {data[-2000:]!r}"
            data += chunk
    return data


# -- item 4: Ctrl-C --------------------------------------------------------------------------------


def test_edge_run_ctrl_c_prints_the_partial_output_and_exits_130(endless):
    p = cli("run", "--bundle", str(endless), "--target", "x86", "--prompt", "To be", "--max-tokens", "1000000")
    head = _read_until(p.stdout, lambda d: len(d) > 40)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    data = head + out
    assert data.startswith(b"To be") and len(data) > 40  # bytes: the head was read up to 40 bytes, not characters
    assert b"Traceback" not in err and err.decode().strip().splitlines()[-1] == "interrupted"


def test_edge_run_json_ctrl_c_still_prints_the_partial_object_and_exits_130(endless, tmp_path):
    """--json prints nothing until the end: Ctrl-C still gets the partial result, finish_reason cancelled."""
    p = cli(
        "run", "--bundle", str(endless), "--target", "x86", "--prompt", "To be", "--max-tokens", "1000000",
        "--json",
    )  # fmt: skip
    time.sleep(8)  # past load and into decoding (this is generous on a busy 2-core machine)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    result = json.loads(out)
    assert result["stats"]["finish_reason"] == "cancelled"
    assert result["stats"]["generated_tokens"] == len(result["token_ids"])
    assert b"Traceback" not in err and err.decode().strip().splitlines()[-1] == "interrupted"


def test_edge_bench_ctrl_c_stops_and_writes_no_report(endless, tmp_path):
    report, log = tmp_path / "report.json", tmp_path / "field.jsonl"
    p = cli(
        "bench", str(endless), "--target", "x86", "--prompt-tokens", "8", "--gen-tokens", "600",
        "--trials", "1000", "--warmup", "0", "--json-out", str(report), "--log", str(log),
    )  # fmt: skip
    err = _read_until(p.stderr, lambda d: b"trial 2/1000" in d)
    p.send_signal(signal.SIGINT)
    _, rest = p.communicate(timeout=60)
    err += rest
    assert p.returncode == 130, err.decode()
    assert b"Traceback" not in err and err.decode().strip().splitlines()[-1] == "interrupted"
    assert not report.exists()  # no report of a run that did not finish
    assert [p.name for p in tmp_path.iterdir()] == ["field.jsonl"]  # no temp file either
    done = err.count(b"decode tok/s")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # Finished trials are logged (the last may be interrupted between its report and its record); the
    # cancelled one never is.
    assert done >= 2 and done - 1 <= len(records) <= done
    assert [r["trial"] for r in records] == list(range(len(records)))


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_edge_run_signal_during_first_use_export_leaves_no_partial(tmp_path, sig):
    """The first-use export of --model: a signal mid-export removes its partial directory."""
    cache = tmp_path / "cache"
    p = cli(
        "run", "--target", "x86", "--max-tokens", "2", "--json", env={"EDGE_RUNTIME_CACHE": str(cache)}
    )  # the demo model, exported into the cache on first use
    _read_until(p.stderr, lambda d: b"writing graph and tokenizer" in d or b"validating" in d)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig if sig != signal.SIGINT else p.returncode == 130, err.decode()
    assert b"Traceback" not in err
    bundles = cache / "bundles"
    assert not bundles.exists() or [n for n in _tree(bundles) if ".partial-" in n] == []


# -- item 9: --threads bounded by the CPUs ---------------------------------------------------------


def test_api_threads_past_the_cpu_count_are_clamped_with_a_warning(endless):
    from edge_runtime.backends.onnxruntime import ThreadsClampedWarning, usable_cpus
    from edge_runtime.engine import LoadOptions, load

    with pytest.warns(ThreadsClampedWarning, match=f"using {usable_cpus()}"):
        engine = load(endless, LoadOptions(threads=100_000))
    assert engine.backend.session.get_session_options().intra_op_num_threads == usable_cpus()


def test_edge_run_threads_100000_warns_in_one_line_and_runs(endless):
    t0 = time.perf_counter()
    p = cli("run", "--bundle", str(endless), "--target", "x86", "--max-tokens", "3", "--json", "--threads", "100000")
    out, err = p.communicate(timeout=120)  # it used to spin in session creation for minutes
    assert p.returncode == 0, err.decode()
    assert time.perf_counter() - t0 < 60
    (line,) = err.decode().strip().splitlines()
    assert line.startswith("warning: 100000 threads asked for") and json.loads(out)["token_ids"]


@pytest.mark.parametrize("cli_name", ["run", "bench"])
def test_negative_threads_are_one_line(endless, cli_name):
    from click.testing import CliRunner

    from edge_runtime.cli.bench import main as bench_cli
    from edge_runtime.cli.run import main as run_cli

    from .bad_inputs_util import one_line_error

    if cli_name == "run":
        r = CliRunner().invoke(run_cli, ["--bundle", str(endless), "--target", "x86", "--json", "--threads", "-2"])
    else:
        r = CliRunner().invoke(bench_cli, [str(endless), "--target", "x86", "--trials", "1", "--threads", "-2"])
    one_line_error(r, "threads must be 1 or more")


# -- item 13: no telemetry traces ------------------------------------------------------------------


def test_a_run_and_an_export_leave_nothing_under_home(endless, endless_ckpt, tmp_path):
    """onnxruntime's telemetry client writes ~/.cache/Microsoft/DeveloperTools/... when it loads;
    ours must not let it start."""
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "ORT_DISABLE_TELEMETRY")}
    env["HOME"] = str(home)
    control = subprocess.run([sys.executable, "-c", "import onnxruntime"], env=env, capture_output=True)
    assert control.returncode == 0
    if not (home / ".cache" / "Microsoft").exists():
        pytest.skip("this onnxruntime build has no telemetry client to disable")
    shutil.rmtree(home / ".cache")
    for name, args in (
        ("run", ["--bundle", str(endless), "--target", "x86", "--max-tokens", "2", "--json"]),
        ("export", [str(endless_ckpt), "-o", str(tmp_path / "b"), "--window", "64"]),
    ):
        code = f"import sys; from edge_runtime.cli.{name} import main; sys.exit(main())"
        r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, timeout=300)
        assert r.returncode == 0, r.stderr.decode()
    assert not (home / ".cache").exists(), sorted(str(p) for p in home.rglob("*"))


# -- item 10: stdout that cannot be written ---------------------------------------------------------


def test_edge_run_into_a_full_device_is_one_line(endless):
    with open("/dev/full", "wb") as full:
        p = cli("run", "--bundle", str(endless), "--target", "x86", "--max-tokens", "3", "--json", stdout=full)
        _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and b"Traceback" not in err
    assert err.decode().strip().splitlines() == ["Error: No space left on device"]


def test_edge_run_into_a_closed_pipe_ends_quietly(endless):
    """`edge-run | head -c 3`: the reader leaves; the writer ends as a shell's pipeline expects (141), quietly."""
    import subprocess

    p = cli("run", "--bundle", str(endless), "--target", "x86", "--max-tokens", "100000", stdout=subprocess.PIPE)
    p.stdout.read(3)
    p.stdout.close()
    err = p.stderr.read()
    p.wait(timeout=120)
    assert p.returncode == 141 and b"Traceback" not in err and b"Exception ignored" not in err
