"""Write a bundle atomically: everything goes into a temporary sibling directory, which is renamed
into place only once complete. A failure at any point leaves no bundle (and any old one intact)."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from edge_runtime.errors import ExportError


@contextlib.contextmanager
def atomic_directory(out: Path, *, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary directory; on success it becomes `out`, on any exception it is removed."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise ExportError(f"output '{out}' already exists; pass --overwrite to replace it or choose another -o")
    if out.exists() and not out.is_dir():
        raise ExportError(f"output '{out}' exists and is not a directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"cannot create '{out.parent}': {e.strerror or e}") from e
    tmp = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        for f in tmp.iterdir():  # data on disk before the rename makes it visible
            f.chmod(0o644)  # some writers create 0600 files; bundles are copied to devices and shared
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
        if out.exists():
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
