"""Arrays an export has finished making but will read again, kept in an unlinked scratch file instead of
the process's memory (issue 23)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_runtime.errors import ExportError


class Scratch:
    """An unlinked file beside the export's output for arrays it has finished making but will read again
    (issue 23: an 8B model's INT4 codes and scales are 5 GB). Each is written once and read back whole
    when used; the page cache, not the process, holds them in between, and the file goes with its last
    reader (or the process) without a name left on disk."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._file = tempfile.TemporaryFile(dir=directory, prefix=".edge-export-codes-")
        self._end = 0

    def put(self, a: np.ndarray) -> OnDisk:
        a = np.ascontiguousarray(a)
        view, at = memoryview(a).cast("B"), self._end
        try:
            while view:
                n = os.pwrite(self._file.fileno(), view, at)
                view, at = view[n:], at + n
        except OSError as e:  # a full disk, mostly: say what the space was for
            raise ExportError(
                f"cannot write the export's scratch file in '{self.directory}' ({e.strerror or e}; it holds the "
                f"quantized weights, about the bundle's size, beside the output): free space there"
            ) from e
        rec = OnDisk(self, self._end, a.shape, a.dtype)
        self._end = at
        return rec

    def read(self, rec: OnDisk) -> np.ndarray:
        out = np.empty(rec.shape, rec.dtype)
        view, at = memoryview(out).cast("B"), rec.offset
        while view:
            n = _read_at(self._file, view, at)
            if n == 0:
                raise OSError(f"the export's scratch file ended at {at} bytes")  # truncated underneath us
            view, at = view[n:], at + n
        return out


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
