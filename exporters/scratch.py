"""Arrays an export has finished making but will read again, kept in an unlinked scratch file instead of
the process's memory."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_runtime.errors import ExportError


class Scratch:
    """An unlinked file beside the export's output for arrays it has finished making but will read again
    (an 8B model's INT4 codes and scales are 5 GB). Each is written once and read back whole
    when used (or a block of rows: `load_rows`); the page cache, not the process, holds them in between,
    and the file goes with its last reader (or the process) without a name left on disk."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._file = tempfile.TemporaryFile(dir=directory, prefix=".edge-export-codes-")
        self._end = 0

    def put(self, a: np.ndarray) -> OnDisk:
        a = np.ascontiguousarray(a)
        view, at = memoryview(a).cast("B"), self._end
        try:
            while view:
                n = _write_at(self._file, view, at)
                view, at = view[n:], at + n
        except OSError as e:  # a full disk, mostly: say what the space was for
            raise ExportError(
                f"cannot write the export's scratch file in '{self.directory}' ({e.strerror or e}; it holds the "
                f"quantized weights, about the bundle's size, beside the output): free space there"
            ) from e
        rec = OnDisk(self, self._end, a.shape, a.dtype)
        self._end = at
        return rec

    def read(self, rec: OnDisk, rows: slice | None = None) -> np.ndarray:
        """The array, or a contiguous slice of its rows (first axis)."""
        start, stop = 0, rec.shape[0] if rec.shape else 0
        if rows is not None:
            start, stop, step = rows.indices(rec.shape[0])
            if step != 1:
                raise ValueError("Scratch.read takes a contiguous slice of rows")
            stop = max(start, stop)
        shape = (stop - start, *rec.shape[1:]) if rec.shape else ()
        out = np.empty(shape, rec.dtype)
        row_bytes = int(np.prod(rec.shape[1:], dtype=np.int64)) * rec.dtype.itemsize
        view, at = memoryview(out.reshape(-1)).cast("B"), rec.offset + start * row_bytes
        while view:
            n = _read_at(self._file, view, at)
            if n == 0:
                raise OSError(f"the export's scratch file ended at {at} bytes")  # truncated underneath us
            view, at = view[n:], at + n
        return out


def _write_at(f, view: memoryview, at: int) -> int:
    if hasattr(os, "pwrite"):  # POSIX
        return os.pwrite(f.fileno(), view, at)
    f.seek(at)  # elsewhere (Windows): one writer at a time, as for reads
    return f.write(view)


def _read_at(f, view: memoryview, at: int) -> int:
    if hasattr(os, "preadv"):  # Linux and the BSDs: no shared file position
        return os.preadv(f.fileno(), [view], at)
    f.seek(at)  # elsewhere (one reader at a time: the export is single-threaded here)
    return f.readinto(view)


@dataclass(frozen=True)
class OnDisk:
    """Where Scratch put an array."""

    scratch: Scratch
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype


def load(a: np.ndarray | OnDisk | None) -> np.ndarray | None:
    return a.scratch.read(a) if isinstance(a, OnDisk) else a


def load_rows(a: np.ndarray | OnDisk, rows: slice | np.ndarray) -> np.ndarray:
    """`a[rows]` (a slice, or integer indices) reading only those rows where `a` is on disk: a spilled
    table is read a block of rows at a time (the reference's logits) or a few rows (its embedding)."""
    if not isinstance(a, OnDisk):
        return a[rows]
    if isinstance(rows, slice) and rows.step in (None, 1):
        return a.scratch.read(a, rows)
    ids = np.arange(a.shape[0])[rows]  # any other selection numpy takes, checked against the rows there are
    wanted, back = np.unique(ids, return_inverse=True)
    picked = np.stack([a.scratch.read(a, slice(r, r + 1))[0] for r in wanted]) if wanted.size else None
    if picked is None:
        return np.empty((0, *a.shape[1:]), a.dtype)
    return picked[back.reshape(ids.shape)]
