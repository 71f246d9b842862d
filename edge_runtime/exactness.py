"""How many rows one graph call computes bit for bit as that many decode steps, measured on the bundle's own
graph (speculative decoding's exact mode verifies no more rows than that).

Whether a k-row chunk rounds like k one-row steps depends on every op of the graph and on the CPU: ONNX
Runtime's float MatMul and MatMulNBits take another GEMM path for more than one row (the demo model's fp32
and int4 bundles already differ at 2 rows), edge-runtime's own matmuls keep decode's sum order up to a
documented row count (kernels.exact_rows), and a GPU's kernels are anyone's guess. So the answer is
measured, never assumed: a short probe feeds the same tokens once as a chunk and once as decode steps and
compares the logits' bits, for every width from 2 up. It runs once per bundle, CPU, kernel implementation,
ONNX Runtime version and thread count; the result is kept in the cache directory.

The probe runs on the engine itself: it saves the rows it will overwrite and the ring's bookkeeping first, and
puts both back after, so a session in progress is untouched.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .atomic_write import write_file
from .cachedir import cache_dir
from .errors import OutputError

if TYPE_CHECKING:
    from .engine import Engine

# Most rows a probe tries: speculation's default k (8) needs 9, and no kernel of ours keeps more than 16 rows
# in decode's order (kernels.exact_rows), so exact mode verifies at most 16 proposals a step.
WIDEST = 17
_PROMPT = 8  # tokens fed before the probe, so attention has columns to sum over
_FILE = "exact-rows.json"
_VERSION = 1


def exact_rows(engine: Engine, widest: int = WIDEST) -> int:
    """Most rows (1..widest) one chunk of `engine`'s graph computes bit for bit as that many decode steps."""
    widest = max(1, min(widest, _room(engine)))
    key = _key(engine)
    cached = _read_cache(key)
    if cached is not None and (cached[0] < cached[1] or cached[1] >= widest):
        return min(cached[0], widest)
    rows = measure(engine, widest)
    _write_cache(key, rows, widest)
    return rows


def _room(engine: Engine) -> int:
    """Widest probe whose rows fit the ring(s) without wrapping (the saved rows are then exactly these)."""
    g = engine.geometry
    room = min(g.slack + 1, g.capacity - _PROMPT)
    if engine.local_geometry is not None:
        room = min(room, engine.local_geometry.capacity - _PROMPT)
    return room


def measure(engine: Engine, widest: int) -> int:
    """Probe widths 2..widest on the engine's graph (its state saved and put back); the widest exact one."""
    if widest < 2:
        return 1
    vocab = engine.manifest.model.vocab_size
    ids = np.random.default_rng(0).integers(0, vocab, _PROMPT + widest).tolist()
    with _preserved(engine, _PROMPT + widest):
        engine.reset()
        engine.prefill(ids[:_PROMPT])
        steps = np.stack([np.array(engine.decode(t), dtype=np.float32) for t in ids[_PROMPT:]])
        engine.truncate(widest)
        rows = 1
        for width in range(2, widest + 1):
            chunk = engine.prefill(ids[_PROMPT : _PROMPT + width], all_logits=True)
            engine.truncate(width)
            if not np.array_equal(chunk.view(np.uint32), steps[:width].view(np.uint32)):
                break
            rows = width
    return rows


class _preserved:
    """Save the K/V rows the first `n` tokens of a fresh stream write, and the ring's bookkeeping; put both
    back on exit, whatever happened in between."""

    def __init__(self, engine: Engine, n: int):
        self.engine, self.n = engine, n

    def __enter__(self) -> None:
        e = self.engine
        self.state = e.ring.state()
        capacity = e.geometry.capacity
        rows = np.arange(min(self.n, capacity))
        if e.local_geometry is not None:
            rows = np.r_[rows, capacity + np.arange(min(self.n, e.local_geometry.capacity))]
        self.rows = rows
        e.backend.kv_to_host()
        self.saved = e.pool.gather_rows(rows)

    def __exit__(self, *exc: object) -> None:
        e = self.engine
        e.pool.scatter_rows(self.rows, *self.saved)
        e.backend.kv_from_host()
        e.restore_state(*self.state)


def _key(engine: Engine) -> str:
    """What the answer depends on: the bundle's files, the CPU, the kernels and ONNX Runtime that run them."""
    import onnxruntime as ort

    from . import kernels
    from .cpuinfo import cpu_features, cpu_model
    from .snapshot import bundle_checksum

    parts = [
        bundle_checksum(engine.manifest),
        cpu_model(default=""),
        ",".join(cpu_features()),
        kernels.isa() or "",
        ort.__version__,
        str(engine.threads),
        type(engine.backend).__name__,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _path() -> Path:
    return cache_dir() / _FILE


def _read_cache(key: str) -> tuple[int, int] | None:
    """(exact rows, widest probed) recorded for `key`, or None (absent, unreadable or malformed: probe again)."""
    try:
        with open(_path(), "rb") as f:
            stored = json.loads(f.read(1 << 20))
        record = stored["entries"][key] if stored.get("v") == _VERSION else None
        rows, widest = int(record["rows"]), int(record["widest"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return (rows, widest) if 1 <= rows <= widest else None


def _write_cache(key: str, rows: int, widest: int) -> None:
    """Record the answer; best effort (a read-only cache directory just probes again next time)."""
    path = _path()
    try:
        with open(path, "rb") as f:
            entries = json.loads(f.read(1 << 20)).get("entries", {})
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError, AttributeError):
        entries = {}
    entries[key] = {"rows": rows, "widest": widest}
    entries = dict(list(entries.items())[-256:])  # bounded: the newest bundles' answers
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # one rename: concurrent loaders see the old record or the new one
        write_file(path, [json.dumps({"v": _VERSION, "entries": entries}).encode()])
    except (OSError, OutputError):
        pass
