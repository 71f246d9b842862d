"""What a ring of a given window costs: K/V bytes, resident memory, and the speed of a full ring.

    python scripts/ring_memory.py BUNDLE_DIR [--window 8188] [--steps 64] [--label NAME]

Loads the bundle with that window (its sinks and slack), reports the pool's K/V bytes and the process's
resident memory after the load, then fills the ring past its capacity with one prefill of random token
ids (capacity + 64 tokens, the engine's own chunking), decodes 8 warm-up steps and times --steps more.
One JSON line per run, with the CPU; run two bundles alternately (in separate processes) and compare
ratios from the same run, never absolute figures across machines or sessions. The Gemma 3
local-ring figures (docs/benchmarks/capabilities.md, docs/architecture.md §5.2) came from it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from edge_runtime.bench.environment import cpu_model
from edge_runtime.engine import LoadOptions, load
from edge_runtime.errors import EdgeRuntimeError


def resident_bytes() -> int:
    with open("/proc/self/status", encoding="utf-8") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--window", type=int, default=None, help="the ring's window (default: the bundle's)")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--label", default=None)
    args = ap.parse_args(argv)

    before = resident_bytes()
    try:
        engine = load(args.bundle, LoadOptions(window=args.window, spin=False))
    except EdgeRuntimeError as e:  # a missing or bad bundle, a window past the context: one line, no traceback
        print(f"ring_memory.py: {e}", file=sys.stderr)
        return 2
    loaded = resident_bytes()
    vocab = engine.manifest.model.vocab_size
    ids = np.random.default_rng(0).integers(3, vocab, engine.geometry.capacity + 64).tolist()
    t0 = time.perf_counter()
    token = int(np.argmax(engine.prefill(ids)))
    prefill_s = time.perf_counter() - t0
    for _ in range(8):
        token = int(np.argmax(engine.decode(token)))
    t0 = time.perf_counter()
    for _ in range(args.steps):
        token = int(np.argmax(engine.decode(token)))
    decode_s = time.perf_counter() - t0
    record = {
        "label": args.label or str(args.bundle),
        "cpu": cpu_model(),
        "capacity": engine.geometry.capacity,
        # getattr: the script also measures runtimes from before the local ring (a git worktree of an older commit)
        "local_capacity": getattr(getattr(engine, "local_geometry", None), "capacity", None),
        "kv_mib": round(engine.pool.kv_nbytes() / 2**20, 1),
        "rss_after_load_mib": round((loaded - before) / 2**20, 1),
        "rss_after_full_ring_mib": round(resident_bytes() / 2**20, 1),
        "prefill_tokens": len(ids),
        "prefill_tok_s": round(len(ids) / prefill_s, 1),
        "decode_tok_s": round(args.steps / decode_s, 2),
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
