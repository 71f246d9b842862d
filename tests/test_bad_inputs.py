"""Bad inputs and faults at export: each is refused with one line, nothing is lost or left half-written.

--overwrite replaces only a bundle; exports publish with one rename that cannot clobber; signals and
dead exporters leave no partial directories; OS errors are one line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_runtime.bundle import open_bundle
from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import ExportError
from edge_runtime.exporters.bundle_writer import atomic_directory
from edge_runtime.exporters.export import ExportOptions, export

from .bad_inputs_util import cli, copy_bundle, one_line_error, snapshot
from .tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("src") / "ck"
    d.mkdir()
    save_tiny_checkpoint("llama-tied", d)
    return d


@pytest.fixture(scope="module")
def bundle(ckpt, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("b") / "b"
    export(ExportOptions(checkpoint=ckpt, out=out, window=64))
    return out


def _export(*args: str) -> object:
    return CliRunner().invoke(export_cli, [*args, "--window", "64"])


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


# -- item 1: --overwrite replaces only what is recognisably a bundle ----------------------------------


def test_overwrite_onto_the_checkpoint_itself_is_refused(ckpt):
    before = snapshot(ckpt)
    one_line_error(_export(str(ckpt), "-o", str(ckpt), "--overwrite"), "is the checkpoint")
    assert snapshot(ckpt) == before


def test_overwrite_onto_a_parent_of_the_checkpoint_is_refused(ckpt):
    before = snapshot(ckpt.parent)
    one_line_error(_export(str(ckpt), "-o", str(ckpt.parent), "--overwrite"), "holds the checkpoint")
    assert snapshot(ckpt.parent) == before


def test_api_overwrite_onto_the_checkpoint_is_refused(ckpt):
    """The Python API has no CLI pre-check: the writer's own rule (only a bundle) refuses it."""
    before = snapshot(ckpt)
    with pytest.raises(ExportError, match="not a bundle"):
        export(ExportOptions(checkpoint=ckpt, out=ckpt, window=64, overwrite=True))
    assert snapshot(ckpt) == before and _leftovers(ckpt.parent) == []


def test_overwrite_of_the_current_directory_is_refused(ckpt, bundle, tmp_path, monkeypatch):
    """`-o . --overwrite` from inside a bundle: replacing the cwd would pull it from under the shell (EBUSY)."""
    here = copy_bundle(bundle, tmp_path / "here")
    before = snapshot(tmp_path)
    monkeypatch.chdir(here)
    one_line_error(_export(str(ckpt), "-o", ".", "--overwrite"), "current directory")
    one_line_error(_export(str(ckpt), "-o", "..", "--overwrite"), "current directory")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "setup,needle",
    [
        ({"notes.txt": "mine"}, "no manifest.json"),
        ({"manifest.json": '{"name": "someone else\'s"}'}, "not an edge-runtime manifest"),
        ({"manifest.json": "not json"}, "not an edge-runtime manifest"),
    ],
)
def test_overwrite_of_a_folder_that_is_not_a_bundle_is_refused(ckpt, tmp_path, setup, needle):
    out = tmp_path / "out"
    out.mkdir()
    for name, text in setup.items():
        (out / name).write_text(text)
    before = snapshot(tmp_path)
    one_line_error(_export(str(ckpt), "-o", str(out), "--overwrite"), needle)
    assert snapshot(tmp_path) == before


def test_overwrite_of_a_bundle_holding_a_users_file_is_refused(ckpt, bundle, tmp_path):
    out = copy_bundle(bundle, tmp_path / "out")
    (out / "my-notes.txt").write_text("do not lose me")
    (out / "sub").mkdir()
    before = snapshot(tmp_path)
    one_line_error(_export(str(ckpt), "-o", str(out), "--overwrite"), "which its manifest does not list")
    assert snapshot(tmp_path) == before


def test_overwrite_of_a_symlink_is_refused(ckpt, bundle, tmp_path):
    out = copy_bundle(bundle, tmp_path / "real")
    (tmp_path / "link").symlink_to(out)
    before = snapshot(tmp_path)
    one_line_error(_export(str(ckpt), "-o", str(tmp_path / "link"), "--overwrite"), "symbolic link")
    assert snapshot(tmp_path) == before


def test_overwrite_replaces_a_bundle_and_an_empty_folder(ckpt, bundle, tmp_path):
    out = copy_bundle(bundle, tmp_path / "out")
    data = json.loads((out / "manifest.json").read_text())
    stamp = data["provenance"]["exported_at"]
    r = _export(str(ckpt), "-o", str(out), "--overwrite", "--flavor", "trt")
    assert r.exit_code == 0, r.output
    assert json.loads((out / "manifest.json").read_text())["graph"]["flavor"] == "trt" != data["graph"]["flavor"]
    assert stamp  # the old one was a real bundle
    (tmp_path / "empty").mkdir()
    assert _export(str(ckpt), "-o", str(tmp_path / "empty"), "--overwrite").exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "out"]


def test_existing_output_without_overwrite_is_one_line(ckpt, bundle, tmp_path):
    out = copy_bundle(bundle, tmp_path / "out")
    before = snapshot(tmp_path)
    one_line_error(_export(str(ckpt), "-o", str(out)), "--overwrite")
    assert snapshot(tmp_path) == before


# -- item 6: signals during export and dead exporters' partials --------------------------------------

# The child starts with SIGHUP at its default action, as an exporter in a terminal or under systemd has it: a
# runner started with nohup passes SIGHUP on ignored, and the exporter rightly leaves an ignored signal alone.
_HOLD_PARTIAL = """
import signal, sys, time
signal.signal(signal.SIGHUP, signal.SIG_DFL)
from pathlib import Path
from edge_runtime.exporters.bundle_writer import atomic_directory
with atomic_directory(Path(sys.argv[1]), overwrite=False) as tmp:
    (tmp / "model.onnx.data").write_bytes(b"x" * 100000)
    print("ready", flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_terminating_signal_mid_export_removes_the_partial(tmp_path, sig):
    p = subprocess.Popen([sys.executable, "-c", _HOLD_PARTIAL, str(tmp_path / "out")], stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"ready\n"
    assert _leftovers(tmp_path)  # the partial exists while the export runs
    p.send_signal(sig)
    p.wait(timeout=60)
    assert p.returncode == 128 + sig  # the shell's convention for "ended by this signal"
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_a_real_edge_export_leaves_nothing(tmp_path):
    from edge_runtime.models import DEMO_CHECKPOINT

    out = tmp_path / "demo"
    p = cli("export", str(DEMO_CHECKPOINT), "-o", str(out))
    err = b""
    while b"writing graph and tokenizer" not in err:
        line = p.stderr.readline()
        assert line, err
        err += line
    p.send_signal(signal.SIGTERM)
    _, rest = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, (err + rest).decode()
    assert b"Traceback" not in rest and list(tmp_path.iterdir()) == []


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_next_export_removes_dead_exporters_partials_only(ckpt, tmp_path):
    out = tmp_path / "out"
    dead = tmp_path / f".out.partial-{_dead_pid()}-0badc0de"
    legacy_old, legacy_new = tmp_path / ".out.partial-1a2b3c4d", tmp_path / ".out.old-5e6f7a8b"
    live = tmp_path / f".out.partial-{os.getpid()}-12345678"  # a live exporter (this process)
    locked = tmp_path / f".out.partial-{_dead_pid()}-feedface"  # pid gone here, but a process holds its lock
    other = tmp_path / f".other.partial-{_dead_pid()}-0badc0de"  # another output's: not ours to judge
    for d in (dead, legacy_old, legacy_new, live, locked, other):
        d.mkdir()
        (d / "model.onnx.data").write_bytes(b"x" * 1000)
    two_days_ago = time.time() - 2 * 86400
    os.utime(legacy_old, (two_days_ago, two_days_ago))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(locked)], stdout=subprocess.PIPE, stdin=subprocess.PIPE
    )
    try:
        assert holder.stdout.readline() == b"locked\n"
        assert _export(str(ckpt), "-o", str(out)).exit_code == 0
    finally:
        holder.kill()
        holder.wait()
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted(["out", legacy_new.name, live.name, locked.name, other.name])


_HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


# -- item 12: publishing cannot clobber, and a reader always finds a bundle ---------------------------


def test_an_output_that_appears_mid_export_is_not_clobbered(ckpt, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ExportError, match="appeared while exporting"):
        with atomic_directory(out, overwrite=False) as tmp:
            (tmp / "model.onnx").write_bytes(b"first")
            export(ExportOptions(checkpoint=ckpt, out=out, window=64))  # the second export wins the race
    winner = snapshot(out)
    assert open_bundle(out) and b"first" not in winner.values()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_two_concurrent_exports_to_one_output_one_wins(ckpt, tmp_path):
    out = tmp_path / "out"
    procs = [cli("export", str(ckpt), "-o", str(out), "--window", "64") for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read().decode()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 1], results
    loser = next(err for rc, err in results if rc == 1)
    assert "Traceback" not in loser and ("already exists" in loser or "appeared while exporting" in loser)
    assert open_bundle(out) and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("native", [True, False])
def test_rename_primitives(tmp_path, monkeypatch, native):
    from edge_runtime.exporters import fs_atomic

    if not native:  # the non-Linux / unsupported-file-system fallback keeps the semantics
        monkeypatch.setattr(fs_atomic, "_renameat2", lambda: None)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (a / "f").write_text("new")
    b.mkdir()  # POSIX rename() would silently replace this empty directory
    with pytest.raises(FileExistsError):
        fs_atomic.rename_noreplace(a, b)
    (b / "f").write_text("old")
    fs_atomic.rename_exchange(a, b)
    assert (b / "f").read_text() == "new" and (a / "f").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
    fs_atomic.rename_noreplace(a, tmp_path / "c")
    assert (tmp_path / "c" / "f").read_text() == "old"


# -- items 10, 11: crafted inputs and options that were silently ignored ------------------------------


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--window", "0"], "--window 0 is out of range"),
        (["--window", "-3"], "--window -3 is out of range"),
        (["--block", "64"], "--block 64 sizes quantized blocks"),
        (["--quant", "int8", "--block", "48"], "INT8 block size 48 is not supported"),
        (["--quant", "int8", "--block", "32", "--flavor", "trt"], "INT8 blocks need --flavor ort"),
    ],
)
def test_options_that_were_silently_ignored_are_refused(ckpt, tmp_path, args, needle):
    r = CliRunner().invoke(export_cli, [str(ckpt), "-o", str(tmp_path / "out"), *args])
    one_line_error(r, needle)
    assert list(tmp_path.iterdir()) == []


def test_negative_rms_norm_eps_is_one_line(ckpt, tmp_path):
    bad = tmp_path / "ck"
    shutil.copytree(ckpt, bad)
    cfg = json.loads((bad / "config.json").read_text()) | {"rms_norm_eps": -1e-5}
    (bad / "config.json").write_text(json.dumps(cfg))
    one_line_error(_export(str(bad), "-o", str(tmp_path / "out")), "'rms_norm_eps' = -1e-05 must be 0 or more")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
