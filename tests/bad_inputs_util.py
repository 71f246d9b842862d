"""What the bad-input tests share: a tiny checkpoint and bundle, the one-line-error check, snapshots."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from click.testing import Result

REPO = Path(__file__).resolve().parent.parent


_PROGRESS = re.compile(r"^\[\s*\d+\.\ds\] ")  # edge-export's `[   1.2s] writing ...` lines


def one_line_error(r: Result, *needles: str, code: int = 1) -> str:
    """Assert exit `code`, exactly one stderr line (`Error: ...`, after any export progress lines)
    holding every needle, and no traceback."""
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output, r.output
    lines = [line for line in r.stderr.strip().splitlines() if not _PROGRESS.match(line)]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: "), lines
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` (directories as None, files as their bytes): the state to compare."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = Path(p).read_bytes()
    return out


def copy_bundle(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


_CHILDREN: list[subprocess.Popen] = []


def cli(module: str, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    """Start `python -m edge_runtime.cli.<module> ARGS` as a real process (for signals and exit codes).

    The child gets Python's Ctrl-C handler whatever it inherits, as a terminal starts it: a runner in the
    background (`cmd &` without job control) hands its children SIGINT ignored, and Python then installs no
    handler, so a Ctrl-C test would wait on a process that never hears it."""
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"from edge_runtime.cli.{module} import main; sys.exit(main())"
    )
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    p = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        **kw,
    )
    _CHILDREN.append(p)
    return p


def reap_children() -> None:
    """Kill what `cli` started and is still running (conftest.py, after each test): a failed test must not
    leave a million-token generation taking the CPU from the rest of the suite."""
    while _CHILDREN:
        p = _CHILDREN.pop()
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
        for pipe in (p.stdin, p.stdout, p.stderr):
            if pipe is not None:
                pipe.close()


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tiny RAM file system at `path` (root only): real ENOSPC and, remounted, real EROFS."""
    import pytest

    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount_read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
