"""Reading a file a user or a checkpoint names (a JSON schema, a grammar, a target profile, a snapshot, a
config.json): only a regular file, and only up to a size fixed for what the file is.

A path can name /dev/zero, a FIFO nobody writes, or a symlink to a multi-gigabyte file: read whole, the first
never ends, the second blocks forever and the third takes the memory. So the path is opened without waiting
(O_NONBLOCK: a FIFO opens at once), fstat'ed, refused unless it is a regular file, and refused if larger than
its bound before a byte is read. Every refusal is one `error` naming the path, never the file's content.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from .errors import EdgeRuntimeError


def open_regular(path: str | Path, what: str, error: type[EdgeRuntimeError] = EdgeRuntimeError) -> BinaryIO:
    """`path` opened for reading if it is a regular file (following links); `error` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"cannot read {what} '{path}': {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{what} '{path}' is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | Path, limit: int, what: str, error: type[EdgeRuntimeError] = EdgeRuntimeError) -> bytes:
    """The bytes of the regular file `path`, refused (with `error`) when over `limit` bytes."""
    with open_regular(path, what, error) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise error(f"{what} '{path}' is {size} bytes, over the {_human(limit)} it may be")
        try:
            data = f.read(limit + 1)  # a file growing while read is still bounded
        except OSError as e:
            raise error(f"cannot read {what} '{path}': {e.strerror or e}") from None
    if len(data) > limit:
        raise error(f"{what} '{path}' is over the {_human(limit)} it may be")
    return data


def read_text_bounded(path: str | Path, limit: int, what: str, error: type[EdgeRuntimeError] = EdgeRuntimeError) -> str:
    """read_bounded, decoded as UTF-8 (an invalid byte is `error`, naming its offset)."""
    data = read_bounded(path, limit, what, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} '{path}' is not valid UTF-8 (byte {e.start})") from None


def _human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"
