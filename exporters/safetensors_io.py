"""A numpy reader for safetensors checkpoints: tensors read on demand, single file or sharded, no torch.

File format: an 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then the raw
little-endian tensor bytes, offsets relative to the end of the header.

Float tensors come back as float32: fp16 widens exactly, and bf16 is the top half of an fp32, so
`(u16 << 16).view(float32)` is exact too.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from edge_runtime.bounded_read import open_regular, read_text_bounded
from edge_runtime.errors import CheckpointError, CorruptCheckpointError

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's own limit
_MAX_INDEX = 64 << 20  # a 400B model's index is ~1 MB


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32, exactly."""
    wide = np.empty(raw.shape, np.uint32)
    wide[...] = raw
    wide <<= 16  # in place: no second table-sized temporary
    return wide.view(np.float32)


class SafetensorsFile:
    """One `.safetensors` file, validated on open; tensors read on demand (`read`), or mapped (`raw`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            # a regular file only, checked before a byte is read: a FIFO would block the export forever
            with open_regular(self.path, "safetensors file", CheckpointError) as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(8)
                if len(head) < 8:
                    raise self._corrupt(f"file is {size} bytes, shorter than the 8-byte header length")
                (n,) = struct.unpack("<Q", head)
                if n > _MAX_HEADER or 8 + n > size:
                    # not the length itself: those are the file's first 8 bytes, and the path may be a
                    # symlink to a file that is not the user's to show (the first bytes of a key, a password)
                    raise self._corrupt(f"its header length (first 8 bytes) does not fit in a {size}-byte file")
                header_bytes = f.read(n)
        except OSError as e:
            raise CheckpointError(f"cannot read '{self.path}': {e.strerror or e}") from e
        try:
            header = json.loads(header_bytes)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            if isinstance(e, json.JSONDecodeError):
                why = str(e)  # a position, never the text
            elif isinstance(e, UnicodeDecodeError):
                why = f"byte {e.start} is not UTF-8"
            else:
                why = "nested too deeply"
            raise self._corrupt(f"header is not valid JSON ({why})") from e
        if not isinstance(header, dict):
            raise self._corrupt("header is not a JSON object")
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._data_start = 8 + n
        self._data_size = size - self._data_start
        self._entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            self._entries[name] = self._check_entry(name, info)
        self._check_disjoint()
        self._mmap: np.memmap | None = None

    def _corrupt(self, why: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"'{self.path}' is not a valid safetensors file: {why}")

    def _check_entry(self, name: str, info: object) -> tuple[str, tuple[int, ...], int, int]:
        try:
            dtype_name, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]  # type: ignore[index]
        except (TypeError, KeyError, ValueError) as e:
            raise self._corrupt(f"tensor '{name}' has a malformed header entry {info!r}") from e
        if dtype_name not in _DTYPES:
            raise self._corrupt(f"tensor '{name}' has unsupported dtype {dtype_name!r}")
        dtype = _DTYPES[dtype_name]
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise self._corrupt(f"tensor '{name}' has an invalid shape {list(shape)}")
        nbytes = math.prod(shape) * dtype.itemsize  # Python ints: a crafted shape cannot wrap to a small size
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end and end - begin == nbytes):
            raise self._corrupt(f"tensor '{name}' offsets {[begin, end]} do not match {dtype_name}{list(shape)}")
        if end > self._data_size:
            raise self._corrupt(
                f"tensor '{name}' ends at byte {end} of a {self._data_size}-byte data section (file truncated?)"
            )
        return dtype_name, shape, begin, end

    def _check_disjoint(self) -> None:
        """No two tensors share bytes (the reference implementation requires them back to back): a tensor
        overlapping another is a corrupted or crafted header, and writing one would alter the other."""
        spans = sorted((begin, end, name) for name, (_, _, begin, end) in self._entries.items() if end > begin)
        for (_, end_a, a), (begin_b, _, b) in itertools.pairwise(spans):
            if begin_b < end_a:
                raise self._corrupt(f"tensors '{a}' and '{b}' overlap (bytes {begin_b}..{end_a} of the data section)")

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def dtype_name(self, name: str) -> str:
        return self._entries[name][0]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes as a read-only memory-mapped array (bf16 as uint16)."""
        dtype_name, shape, begin, end = self._entries[name]
        if self._mmap is None:
            self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
        buf = self._mmap[self._data_start + begin : self._data_start + end]
        return buf.view(_DTYPES[dtype_name]).reshape(shape)

    def read(self, name: str) -> np.ndarray:
        """The stored bytes copied into a new array (bf16 as uint16). Read, not mapped: pages of a mapping
        that were touched stay in the process's RSS while the mapping lives, so an export that widened
        every layer of a mapped 8B checkpoint would show 16 GB resident for a file it had finished with."""
        dtype_name, shape, begin, end = self._entries[name]
        dtype = _DTYPES[dtype_name]
        out = np.empty(shape, dtype)
        try:
            with self.path.open("rb", buffering=0) as f:
                f.seek(self._data_start + begin)
                got = f.readinto(memoryview(out.reshape(-1)).cast("B")) if end > begin else 0
        except OSError as e:
            raise CheckpointError(f"cannot read tensor '{name}' from '{self.path}': {e.strerror or e}") from e
        if got != end - begin:  # the file shrank since its header was checked
            raise self._corrupt(f"tensor '{name}': read {got} of {end - begin} bytes (file truncated?)")
        return out

    def get(self, name: str) -> np.ndarray:
        """The tensor, read from the file; fp16/bf16 widened to float32 (exactly), others as stored."""
        return self._widen(name, self.read(name))

    def get_rows(self, name: str, rows: slice | np.ndarray) -> np.ndarray:
        """Rows of a 2-D tensor (a slice, or integer indices), widened as `get` widens: a table read a part
        at a time. A slice is read from the file; indices are gathered through a mapping made for the call
        (its touched pages leave the process's RSS with it)."""
        dtype_name, shape, begin, end = self._entries[name]
        dtype = _DTYPES[dtype_name]
        row_bytes = math.prod(shape[1:]) * dtype.itemsize
        if isinstance(rows, slice):
            start, stop, step = rows.indices(shape[0])
            if step != 1:
                raise ValueError("get_rows reads a contiguous slice of rows")
            stop = max(start, stop)
            out = np.empty((stop - start, *shape[1:]), dtype)
            try:
                with self.path.open("rb", buffering=0) as f:
                    f.seek(self._data_start + begin + start * row_bytes)
                    got = f.readinto(memoryview(out.reshape(-1)).cast("B")) if stop > start else 0
            except OSError as e:
                raise CheckpointError(f"cannot read tensor '{name}' from '{self.path}': {e.strerror or e}") from e
            if got != (stop - start) * row_bytes:
                raise self._corrupt(f"tensor '{name}': read {got} of {(stop - start) * row_bytes} bytes (truncated?)")
            return self._widen(name, out)
        ids = np.asarray(rows, np.int64)
        if ids.size and (ids.min() < -shape[0] or ids.max() >= shape[0]):
            raise IndexError(f"row index out of range for '{name}' with {shape[0]} rows")
        mapped = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self._data_start + begin, shape=(end - begin,))
        picked = mapped.view(dtype).reshape(shape)[ids]  # fancy indexing copies the rows
        del mapped  # the mapping, and its touched pages, go with its last reference
        return self._widen(name, picked)

    def _widen(self, name: str, arr: np.ndarray) -> np.ndarray:
        dtype_name = self._entries[name][0]
        if dtype_name == "BF16":
            return bf16_to_f32(arr)
        if dtype_name == "F16":
            return arr.astype(np.float32)
        return arr


def _is_plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name


class CheckpointTensors(Mapping[str, np.ndarray]):
    """All tensors of a checkpoint directory, by name, across shards. Loads lazily on `[name]`."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._where: dict[str, SafetensorsFile] = {}
        index = self.directory / "model.safetensors.index.json"
        if index.is_file():
            self._open_index(index)
        else:
            files = sorted(self.directory.glob("*.safetensors"))
            if not files:
                raise CheckpointError(
                    f"no model.safetensors or model.safetensors.index.json in '{self.directory}'; "
                    "export the checkpoint with safe_serialization=True"
                )
            for path in files:
                self._add(SafetensorsFile(path), expect=None)

    def _open_index(self, index: Path) -> None:
        try:
            text = read_text_bounded(index, _MAX_INDEX, "safetensors index", CorruptCheckpointError)
            weight_map = json.loads(text)["weight_map"]
            assert isinstance(weight_map, dict)
        except (ValueError, KeyError, TypeError, AssertionError, RecursionError) as e:
            why = "nested too deeply" if isinstance(e, RecursionError) else e
            raise CorruptCheckpointError(f"'{index}' is not a valid index (needs a 'weight_map' object): {why}") from e
        by_file: dict[str, set[str]] = {}
        for name, file in weight_map.items():
            if not isinstance(file, str):
                raise CorruptCheckpointError(
                    f"'{index}': weight_map['{name}'] is {file!r}, not a shard file name (a string)"
                )
            # Shards sit beside the index (transformers writes plain names). A name with a directory part
            # could open any file on the machine, and a failed header check would echo its first bytes.
            if not _is_plain_name(file):
                raise CorruptCheckpointError(
                    f"'{index}': shard {file!r} (for '{name}') is not a plain file name in the checkpoint directory"
                )
            by_file.setdefault(file, set()).add(name)
        for file, names in sorted(by_file.items()):
            path = self.directory / file
            if not path.exists():  # one that is there but not a file (a FIFO, a device): SafetensorsFile says so
                raise CheckpointError(f"shard '{file}' named in '{index.name}' is missing from '{self.directory}'")
            self._add(SafetensorsFile(path), expect=names)

    def _add(self, f: SafetensorsFile, expect: set[str] | None) -> None:
        present = set(f.names)
        if expect is not None and expect - present:
            missing = sorted(expect - present)
            raise CorruptCheckpointError(
                f"index says '{f.path.name}' holds {missing[:3]} but the shard does not (mismatched shards?)"
            )
        for name in f.names if expect is None else sorted(expect):
            if name in self._where:
                raise CorruptCheckpointError(
                    f"tensor '{name}' appears in both '{self._where[name].path.name}' and '{f.path.name}'"
                )
            self._where[name] = f

    def __getitem__(self, name: str) -> np.ndarray:
        return self._where[name].get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._where[name].shape(name)

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes, memory-mapped, in the stored dtype (bf16 as uint16): shapes without widening."""
        return self._where[name].raw(name)

    def read(self, name: str) -> np.ndarray:
        """The stored bytes read into a new array, in the stored dtype (bf16 as uint16)."""
        return self._where[name].read(name)

    def get_rows(self, name: str, rows: slice | np.ndarray) -> np.ndarray:
        """Rows of a 2-D tensor, widened to float32 as `[name]` widens the whole tensor."""
        return self._where[name].get_rows(name, rows)

    @property
    def files(self) -> list[Path]:
        return sorted({f.path for f in self._where.values()})
