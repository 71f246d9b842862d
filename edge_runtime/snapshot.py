"""Session snapshots (session.py's prompt cache): in memory, and in a file bound to the bundle's content
and the cache geometry.

File layout: MAGIC, the header's length (8 bytes, little-endian), a JSON header (identity, bookkeeping,
the arrays' names/dtypes/shapes, the payload's length and sha256), then the arrays' bytes in that
order. A short or altered file fails the length or the checksum before anything is restored.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .atomic_write import write_file
from .errors import CorruptSnapshotError, SnapshotMismatchError
from .manifest import Manifest

MAGIC = b"edge-runtime session snapshot\n"
VERSION = 1
_MAX_HEADER = 1 << 24


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
            "payload_sha256": hashlib.sha256(payload).hexdigest(),
        }
        blob = json.dumps(header).encode()
        write_file(path, [MAGIC + struct.pack("<Q", len(blob)) + blob, payload])

    @classmethod
    def load(cls, path: str | Path) -> Snapshot:
        """Read a snapshot file; CorruptSnapshotError if it is truncated, altered or not a snapshot."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CorruptSnapshotError(f"cannot read snapshot '{path}': {e}") from e
        if not data.startswith(MAGIC):
            raise CorruptSnapshotError(f"'{path}' is not an edge-runtime session snapshot")
        start = len(MAGIC) + 8
        if len(data) < start:
            raise CorruptSnapshotError(f"snapshot '{path}' is truncated ({len(data)} bytes, no header)")
        (size,) = struct.unpack("<Q", data[len(MAGIC) : start])
        if size > _MAX_HEADER or len(data) < start + size:
            raise CorruptSnapshotError(f"snapshot '{path}' is truncated ({len(data)} bytes, its header needs more)")
        try:
            h: dict[str, Any] = json.loads(data[start : start + size])
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CorruptSnapshotError(f"snapshot '{path}' has an unreadable header: {e}") from e
        if h.get("version") != VERSION:
            raise CorruptSnapshotError(f"snapshot '{path}' has format version {h.get('version')!r}; this "
                                       f"runtime reads version {VERSION}")  # fmt: skip
        payload = data[start + size :]
        if len(payload) != h["payload_bytes"]:
            raise CorruptSnapshotError(
                f"snapshot '{path}' is truncated: {len(payload)} of its {h['payload_bytes']} payload bytes"
                if len(payload) < h["payload_bytes"]
                else f"snapshot '{path}' has {len(payload) - h['payload_bytes']} bytes after its payload"
            )
        if hashlib.sha256(payload).hexdigest() != h["payload_sha256"]:
            raise CorruptSnapshotError(f"snapshot '{path}' fails its checksum (corrupted or modified)")
        try:
            return cls._build(h, payload)
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptSnapshotError(f"snapshot '{path}' has a malformed header: {e!r}") from e

    @classmethod
    def _build(cls, h: dict[str, Any], payload: bytes) -> Snapshot:
        arrays, offset = {}, 0
        for name, dtype, shape in h["arrays"]:
            dt = np.dtype(dtype)
            n = dt.itemsize * int(np.prod(shape, dtype=np.int64))
            arrays[name] = np.frombuffer(payload, dt, count=n // dt.itemsize, offset=offset).reshape(shape).copy()
            offset += n
        layers = sum(name.startswith("key.") for name in arrays)
        ev = h["evicted"]
        return cls(
            bundle=h["bundle"],
            geometry=tuple(h["geometry"]),  # type: ignore[arg-type]
            position_offset=h["position_offset"],
            tokens=h["tokens"],
            written=h["written"],
            pending=h["pending"],
            row_pos=arrays["row_pos"],
            row_ids=arrays["row_ids"],
            evicted=(ev["count"], bytes.fromhex(ev["chain"]), tuple(ev["partial"])),
            rows=arrays["rows"],
            keys=[arrays[f"key.{i}"] for i in range(layers)],
            values=[arrays[f"value.{i}"] for i in range(layers)],
        )
