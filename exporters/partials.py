"""The temporary `.NAME.partial-PID-RAND` directories a bundle is written into, and their cleanup.

An exporter killed outright (SIGKILL, power loss) cannot remove its partial directory, and each one
holds a whole bundle's bytes. The name records the exporter's pid and the exporter holds an flock on
the directory while it lives, so the next export to the same output can tell a dead exporter's
leftovers from a live one's work: stale means no process holds the lock AND the pid is gone. Either
signal alone could mislead (pids are reused; flock may be unsupported, e.g. some NFS setups), so a
directory is removed only when both say it is abandoned.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import time
import uuid
from pathlib import Path

# Names written before the pid was recorded (`.NAME.partial-1a2b3c4d`): removed once this old.
LEGACY_STALE_S = 24 * 3600


def partial_name(out: Path) -> Path:
    return out.parent / f".{out.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def lock_directory(path: Path) -> int | None:
    """Hold an exclusive flock on `path` (a directory) for this process; the fd, or None if unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _locked_by_another(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return True  # cannot even look: leave it alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    finally:
        os.close(fd)  # closing drops the probe's own lock
    return False


def _age_s(entry: os.DirEntry) -> float:
    try:
        return time.time() - entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def remove_stale_partials(out: Path) -> list[Path]:
    """Remove the partial (and parked `.old-`) directories of dead exporters of `out`; returns them."""
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(?:partial|old)-(?:(\d+)-)?[0-9a-f]{{8}}$")
    removed: list[Path] = []
    try:
        entries = list(os.scandir(out.parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if m is None or not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        if m.group(1) is not None:
            stale = not _pid_alive(int(m.group(1))) and not _locked_by_another(path)
        else:
            stale = _age_s(entry) > LEGACY_STALE_S
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
