"""Writing a file the user named (edge-bench --json-out and --plot, a session snapshot): replaced in one
rename where it is a regular file, written through where it is a device or a FIFO.

A temporary file renamed over the path means a reader never sees half a report or half a snapshot. But a
rename replaces whatever the path names: run as root, `--json-out /dev/full` made /dev/full a regular
file, and `/dev/stdout` (a link to /proc/self/fd/1) would lose its link. So the path is looked at first,
following links (/proc's magic ones included, which only the kernel resolves):

- nothing there: a temporary file beside it, renamed into place. A link to nothing: the file it names.
- a regular file: replaced the same way. Behind a symlink the file the link names is replaced and the
  link is kept (as an editor saving through a link does), so the temporary file goes beside that file.
- a character device or a FIFO (/dev/null, /dev/stdout on a terminal or a pipe, `mkfifo`): opened and
  written as it is, never replaced; /dev/full then fails with ENOSPC. A FIFO's open waits for a reader,
  as a shell's `>` does.
- a directory, a block device, a socket: refused with OutputError before anything is written (a report
  written onto a disk device destroys what is on it).
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from .errors import OutputError

Chunk = bytes | bytearray | memoryview


def output_target(path: str | Path) -> tuple[Path, bool]:
    """(the path `write_file` writes, whether it writes through rather than replaces). Written through: the
    path as given (an existing character device or FIFO). Replaced: the regular file it resolves to, or
    the one to create. OutputError for a directory, a block device, a socket, or a link to a regular
    file this process cannot name."""
    path = Path(path)
    try:
        st = os.stat(path)  # follows every link; /proc/self/fd/N resolves to the open file itself
    except FileNotFoundError:
        return Path(os.path.realpath(path)), False
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return path, True
    if stat.S_ISREG(st.st_mode):
        target = Path(os.path.realpath(path))
        # realpath reads link text; a magic link to a deleted file reads "... (deleted)", a name that is not
        # this file. Renaming onto such a name would write somewhere else, so it is refused.
        try:
            same = os.path.samestat(os.stat(target), st)
        except OSError:
            same = False
        if not same:
            raise OutputError(
                f"cannot write '{path}': it links to a regular file this process cannot name (deleted or "
                "replaced); give the file's own path"
            )
        return target, False
    kind = (
        "a directory"
        if stat.S_ISDIR(st.st_mode)
        else "a block device"
        if stat.S_ISBLK(st.st_mode)
        else "a socket"
        if stat.S_ISSOCK(st.st_mode)
        else "not a regular file"
    )
    raise OutputError(
        f"cannot write '{path}': it is {kind}; give a file name (or a character device or FIFO such as /dev/null)"
    )


def write_file(path: str | Path, chunks: Iterable[Chunk], *, mode: int | None = None) -> None:
    """Write `chunks` to `path` as the module docstring says. `mode`: the permission bits of a file this
    creates or replaces (None: what open() would give, the umask applied); a device keeps its own.
    An OSError (ENOSPC, EACCES, ...) names `path`, not the temporary file."""
    target, through = output_target(path)
    try:
        if through:
            _write_through(Path(path), chunks)
        else:
            _replace(target, chunks, mode)
    except OSError as e:
        if e.errno is None:
            raise
        raise type(e)(e.errno, e.strerror, str(path)) from None


def _write_through(path: Path, chunks: Iterable[Chunk]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)  # no O_CREAT, no O_TRUNC: the device or FIFO as it is
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):  # it became a regular file since it was looked at
            raise OutputError(f"cannot write '{path}': it was replaced by a regular file while being opened; retry")
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            while view:  # a pipe may take part of a write
                view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _replace(target: Path, chunks: Iterable[Chunk], mode: int | None) -> None:
    # Beside the target: a rename within one file system is atomic. O_EXCL with a random name never
    # opens someone else's file; 0o666 lets the umask decide, as open() does, unless `mode` says otherwise.
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
