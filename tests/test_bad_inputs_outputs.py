"""Output paths that are not regular files (atomic_write.py): edge-bench --json-out and a session snapshot's
save write through to a device or a FIFO and replace a symlinked file's content, never the device, FIFO or
link itself. /dev/full is a one-line "No space left on device" and stays a character device (these tests
run as root, where the old temp-file-and-rename turned it into a regular file)."""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime.atomic_write import output_target, write_file
from edge_runtime.bench.report import write_json
from edge_runtime.cli.bench import main as bench_cli
from edge_runtime.errors import OutputError
from edge_runtime.snapshot import Snapshot

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")


def _is_char_device(path: str) -> bool:
    return stat.S_ISCHR(os.stat(path).st_mode)


def _tiny_snapshot() -> Snapshot:
    kv = [np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)]
    return Snapshot(
        bundle="ab" * 32,
        geometry=(4, 60, 7),
        position_offset=0,
        tokens=2,
        written=2,
        pending=5,
        row_pos=np.array([0, 1, -1], dtype=np.int64),
        row_ids=np.array([9, 8, 0], dtype=np.int64),
        evicted=(0, b"", ()),
        rows=np.array([0, 1], dtype=np.int64),
        keys=kv,
        values=[k + 1 for k in kv],
    )


class _FifoReader:
    """Reads a FIFO to its end on a thread. `close()` unblocks a reader still waiting for a writer, so a
    failing test never leaves a thread stuck in open()."""

    def __init__(self, fifo: Path):
        self.fifo, self.data = fifo, b""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with open(self.fifo, "rb") as f:
            self.data = f.read()

    def close(self) -> bytes:
        self.thread.join(10)
        if self.thread.is_alive():
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))  # the reader's open returns, then EOF
            except OSError:
                pass
            self.thread.join(10)
        return self.data


# -- the helper ------------------------------------------------------------------------------------


def test_a_new_or_regular_file_is_replaced_whole_with_no_temp_file_left(tmp_path):
    out = tmp_path / "r.json"
    write_file(out, [b"first"])
    write_file(out, [b"sec", b"ond"], mode=0o644)
    assert out.read_bytes() == b"second" and stat.S_IMODE(out.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_symlink_to_a_file_keeps_the_link_and_replaces_the_files_content(tmp_path):
    (tmp_path / "data").mkdir()
    real = tmp_path / "data" / "report.json"
    real.write_bytes(b"old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_file(link, [b"new"])
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "link.json"]  # the temp file went beside
    assert [p.name for p in real.parent.iterdir()] == ["report.json"]  # the file, and was renamed away


def test_a_symlink_to_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "out"
    link.symlink_to(fifo)
    assert output_target(link) == (link, True)
    reader = _FifoReader(fifo)
    try:
        write_file(link, [b"through ", b"the pipe"])
    finally:
        got = reader.close()
    assert got == b"through the pipe"
    assert link.is_symlink() and stat.S_ISFIFO(os.stat(link).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "out"]


def test_dev_null_is_written_through_and_stays_a_device():
    write_file("/dev/null", [b"x" * 100_000])
    assert _is_char_device("/dev/null")


@needs_dev_full
def test_dev_full_is_enospc_naming_it_and_stays_a_device():
    with pytest.raises(OSError) as info:
        write_file("/dev/full", [b"{}\n"])
    assert info.value.errno == errno.ENOSPC and info.value.filename == "/dev/full"
    assert _is_char_device("/dev/full")


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(OutputError, match="is a directory"):
        write_file(tmp_path, [b"x"])
    assert list(tmp_path.iterdir()) == []


# -- its users -------------------------------------------------------------------------------------


@needs_dev_full
def test_bench_report_and_snapshot_on_dev_full_fail_and_leave_it_a_device():
    for write in (lambda p: write_json({"a": 1}, p), lambda p: _tiny_snapshot().save(p)):
        with pytest.raises(OSError, match="No space left on device"):
            write("/dev/full")
        assert _is_char_device("/dev/full")


def test_bench_report_and_snapshot_through_a_symlink_and_to_dev_null(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    real.write_text("old")
    link.symlink_to(real)
    write_json({"a": 1}, link)
    assert json.loads(real.read_text()) == {"a": 1} and link.is_symlink()
    _tiny_snapshot().save(link)
    back = Snapshot.load(link)
    assert link.is_symlink() and back.pending == 5 and np.array_equal(back.values[0], _tiny_snapshot().values[0])
    write_json({"a": 1}, "/dev/null")
    _tiny_snapshot().save("/dev/null")
    assert _is_char_device("/dev/null")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


@needs_dev_full
def test_edge_bench_json_out_dev_full_is_one_line_and_dev_full_stays(tied_bundle):
    args = [str(tied_bundle), "--target", "x86", "--prompt-tokens", "8", "--gen-tokens", "2", "--trials", "1"]
    r = CliRunner().invoke(bench_cli, [*args, "--warmup", "0", "--json-out", "/dev/full"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error")]  # after the trial's progress
    assert errors == [r.stderr.strip().splitlines()[-1]] == ["Error: No space left on device: '/dev/full'"]
    assert _is_char_device("/dev/full")


def test_edge_bench_json_out_on_a_socket_is_refused_before_the_run(tied_bundle, tmp_path):
    import socket

    where = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(where))
        r = CliRunner().invoke(bench_cli, [str(tied_bundle), "--target", "x86", "--json-out", str(where)])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.stderr.strip().splitlines() == [
        f"Error: --json-out: cannot write '{where}': it is a socket; give a file name (or a character device "
        "or FIFO such as /dev/null); nothing was run"
    ]
    assert stat.S_ISSOCK(os.lstat(where).st_mode)
