"""Session snapshots (session.py's prompt cache): in memory, and in a file bound to the bundle's content
and the cache geometry.

File layout (version 2): MAGIC, the header's length (8 bytes, little-endian), a JSON header (identity,
bookkeeping, the arrays' names/dtypes/shapes, the payload's length), the arrays' bytes in that order, then the
sha256 of everything before it (32 bytes): the header is under the checksum, so an edited field fails it.
Version 1 files (the payload's sha256 in the header, no trailer) are still read, their fields checked as
strictly. The file's size is checked against the header (and the caller's bound) before the payload is read,
and only a regular file is read: a device or FIFO would never end.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .atomic_write import write_file
from .bounded_read import open_regular
from .errors import CorruptSnapshotError, SnapshotMismatchError
from .manifest import Manifest

MAGIC = b"edge-runtime session snapshot\n"
VERSION = 2
_READS = (1, 2)  # version 1: the header outside the checksum; still read, every field checked
_MAX_HEADER = 1 << 24
_DIGEST = 32  # version 2's trailer: sha256 of the file before it
# K/V and bookkeeping dtypes a session writes (float16/32 and q8 caches, int64 rows and ids); anything else
# (an object dtype, a structured one) is refused before numpy sees it.
_DTYPES = frozenset({"<f2", "<f4", "<f8", "|u1", "|i1", "<i4", "<i8"})


def bundle_checksum(manifest: Manifest) -> str:
    """A bundle's identity: the sha256 of its files' sha256s (graph, weights, tokenizer), so a
    re-export with other weights or another graph is another bundle, wherever it lives."""
    files = manifest.files or {"manifest.json": hashlib.sha256(manifest.to_json().encode()).hexdigest()}
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Snapshot:
    bundle: str  # bundle_checksum
    geometry: tuple[int, int, int]  # sinks, window, slack
    position_offset: int
    tokens: int  # fed to the ring
    written: int  # the ring's high-water mark (what rollbacks can reach)
    pending: int | None  # sampled, not fed
    row_pos: np.ndarray  # [RingState.rows] int64: position held by each row (global ring, then local), -1 empty
    row_ids: np.ndarray  # [capacity] int64: token id held by each row
    evicted: tuple[int, bytes, tuple[int, ...]]  # EvictedDigest: count, chain, partial block
    rows: np.ndarray  # rows whose K/V are kept (those holding a token)
    keys: list[np.ndarray]  # per layer [1, H_kv, len(rows), D]
    values: list[np.ndarray]

    def check(self, bundle: str, geometry: tuple[int, int, int], position_offset: int) -> None:
        """Refuse to restore into a session of another bundle, geometry or position offset."""
        if bundle != self.bundle:
            raise SnapshotMismatchError(
                f"snapshot of another bundle (checksum {self.bundle[:12]}..., this one {bundle[:12]}...): "
                "its keys and values mean nothing to this model"
            )
        if geometry != self.geometry or position_offset != self.position_offset:
            s, w, k = self.geometry
            raise SnapshotMismatchError(
                f"snapshot of cache geometry sinks={s}, window={w}, slack={k} (position offset "
                f"{self.position_offset}), this session has sinks={geometry[0]}, window={geometry[1]}, "
                f"slack={geometry[2]} (offset {position_offset}); load the bundle with the snapshot's --window"
            )

    def _arrays(self) -> list[tuple[str, np.ndarray]]:
        named = [("row_pos", self.row_pos), ("row_ids", self.row_ids), ("rows", self.rows)]
        named += [(f"key.{i}", k) for i, k in enumerate(self.keys)]
        return named + [(f"value.{i}", v) for i, v in enumerate(self.values)]

    def save(self, path: str | Path) -> None:
        """Write the snapshot to `path` (atomically: a reader never sees half a file; a device or FIFO is
        written through, never replaced: atomic_write.py)."""
        arrays = [(name, np.ascontiguousarray(a)) for name, a in self._arrays()]
        payload = b"".join(a.tobytes() for _, a in arrays)
        count, chain, partial = self.evicted
        header = {
            "version": VERSION,
            "bundle": self.bundle,
            "geometry": list(self.geometry),
            "position_offset": self.position_offset,
            "tokens": self.tokens,
            "written": self.written,
            "pending": self.pending,
            "evicted": {"count": count, "chain": chain.hex(), "partial": list(partial)},
            "arrays": [[name, a.dtype.str, list(a.shape)] for name, a in arrays],
            "payload_bytes": len(payload),
        }
        blob = json.dumps(header).encode()
        head = MAGIC + struct.pack("<Q", len(blob)) + blob
        digest = hashlib.sha256(head)
        digest.update(payload)
        write_file(path, [head, payload, digest.digest()])

    @classmethod
    def load(cls, path: str | Path, max_payload: int | None = None) -> Snapshot:
        """Read a snapshot file; CorruptSnapshotError if it is truncated, altered, not a snapshot, not a regular
        file, or (with `max_payload`: what the loading session's cache can hold) larger than that."""
        path = Path(path)
        with open_regular(path, "snapshot", CorruptSnapshotError) as f:
            try:
                return cls._read(f, path, os.fstat(f.fileno()).st_size, max_payload)
            except OSError as e:
                raise CorruptSnapshotError(f"cannot read snapshot '{path}': {e.strerror or e}") from e

    @classmethod
    def _read(cls, f: Any, path: Path, size: int, max_payload: int | None) -> Snapshot:
        start = len(MAGIC) + 8
        lead = f.read(start)
        if not lead.startswith(MAGIC):
            raise CorruptSnapshotError(f"'{path}' is not an edge-runtime session snapshot")
        if len(lead) < start:
            raise CorruptSnapshotError(f"snapshot '{path}' is truncated ({size} bytes, no header)")
        (hsize,) = struct.unpack("<Q", lead[len(MAGIC) :])
        if hsize > _MAX_HEADER or start + hsize > size:
            raise CorruptSnapshotError(f"snapshot '{path}' is truncated ({size} bytes, its header needs more)")
        blob = f.read(hsize)
        try:
            h = json.loads(blob)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise CorruptSnapshotError(f"snapshot '{path}' has an unreadable header: {e}") from e
        version = h.get("version") if isinstance(h, dict) else None
        if version not in _READS or isinstance(version, bool):
            raise CorruptSnapshotError(f"snapshot '{path}' has format version {version!r:.40}; this runtime "
                                       f"reads versions {', '.join(map(str, _READS))}")  # fmt: skip
        n = h.get("payload_bytes")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise CorruptSnapshotError(f"snapshot '{path}' has a malformed header: payload_bytes {n!r:.40}")
        if max_payload is not None and n > max_payload:
            raise CorruptSnapshotError(f"snapshot '{path}' holds {n} bytes of cache, more than this session's "
                                       f"{max_payload}: not a snapshot of this bundle")  # fmt: skip
        # The size is checked before the payload is read: a short file fails here, not after gigabytes.
        want = start + hsize + n + (_DIGEST if version >= 2 else 0)
        if size != want:
            raise CorruptSnapshotError(
                f"snapshot '{path}' is truncated: {max(0, n - (want - size))} of its {n} payload bytes"
                if size < want
                else f"snapshot '{path}' has {size - want} bytes after its payload"
            )
        payload = bytearray(n)  # read in place: the arrays are views of it, the file is in memory once
        view, got = memoryview(payload), 0
        while got < n:
            r = f.readinto(view[got:])
            if not r:
                raise CorruptSnapshotError(f"snapshot '{path}' is truncated: it shrank while read")
            got += r
        if version >= 2:
            digest = hashlib.sha256(lead + blob)
            digest.update(payload)
            ok = f.read(_DIGEST + 1) == digest.digest()
        else:
            ok = isinstance(h.get("payload_sha256"), str) and hashlib.sha256(payload).hexdigest() == h["payload_sha256"]
        if not ok:
            raise CorruptSnapshotError(f"snapshot '{path}' fails its checksum (corrupted or modified)")
        try:
            return cls._build(h, payload)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptSnapshotError(f"snapshot '{path}' has a malformed header: {e}") from e

    @classmethod
    def _build(cls, h: dict[str, Any], payload: bytearray) -> Snapshot:
        arrays, offset = {}, 0
        entries = h["arrays"]
        if not isinstance(entries, list):
            raise TypeError("arrays is not a list")
        for entry in entries:
            if not (isinstance(entry, list) and len(entry) == 3):
                raise TypeError(f"array entry {entry!r:.60} is not [name, dtype, shape]")
            name, dtype, shape = entry
            if not isinstance(name, str) or name in arrays:
                raise ValueError(f"array name {name!r:.40} is not a string or repeats")
            if dtype not in _DTYPES:
                raise ValueError(f"array '{name:.40}' has dtype {dtype!r:.20}; expected one of {sorted(_DTYPES)}")
            if not (isinstance(shape, list) and len(shape) <= 5 and all(_count(d) for d in shape)):
                raise ValueError(f"array '{name:.40}' has shape {shape!r:.60}")
            dt = np.dtype(dtype)
            count = 1
            for d in shape:
                count *= d  # Python ints: a crafted shape cannot wrap, and is checked against the payload
            if offset + count * dt.itemsize > len(payload):
                raise ValueError(f"array '{name:.40}' runs past the payload")
            arrays[name] = np.frombuffer(payload, dt, count=count, offset=offset).reshape(shape)
            offset += count * dt.itemsize
        if offset != len(payload):
            raise ValueError(f"the arrays take {offset} of the payload's {len(payload)} bytes")
        layers = sum(name.startswith("key.") for name in arrays)
        names = {"row_pos", "row_ids", "rows"} | {f"{kv}.{i}" for kv in ("key", "value") for i in range(layers)}
        if set(arrays) != names:
            raise ValueError(f"arrays {sorted(arrays)!r:.120} are not a snapshot's")
        ev = h["evicted"]
        if not isinstance(ev, dict):
            raise TypeError("evicted is not an object")
        geometry, partial, chain = h["geometry"], ev["partial"], ev["chain"]
        if not (isinstance(geometry, list) and len(geometry) == 3 and all(_count(g) for g in geometry)):
            raise ValueError(f"geometry {geometry!r:.60}")
        if not (isinstance(partial, list) and all(_count(t) for t in partial)):
            raise ValueError("evicted.partial is not a list of token ids")
        if not isinstance(chain, str):
            raise TypeError("evicted.chain is not a string")
        if not isinstance(h["bundle"], str):
            raise TypeError("bundle is not a string")
        pending = h["pending"]
        for key in ("position_offset", "tokens", "written"):
            if not _count(h[key]):
                raise ValueError(f"{key} {h[key]!r:.40} is not a count")
        if not (pending is None or _count(pending)) or not _count(ev["count"]):
            raise ValueError(f"pending {pending!r:.40} or evicted.count {ev['count']!r:.40} is not a count")
        return cls(
            bundle=h["bundle"],
            geometry=tuple(geometry),  # type: ignore[arg-type]
            position_offset=h["position_offset"],
            tokens=h["tokens"],
            written=h["written"],
            pending=pending,
            row_pos=arrays["row_pos"],
            row_ids=arrays["row_ids"],
            evicted=(ev["count"], bytes.fromhex(chain), tuple(partial)),
            rows=arrays["rows"],
            keys=[arrays[f"key.{i}"] for i in range(layers)],
            values=[arrays[f"value.{i}"] for i in range(layers)],
        )


def _count(x: Any) -> bool:
    """A non-negative int (JSON's true/false are not counts)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0
