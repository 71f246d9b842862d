"""Soak: a long greedy generation must run in constant memory (static pool + StreamingLLM ring).

    python scripts/soak_rss.py [--bundle DIR] [--tokens 20000] [--window 64]

Exports the demo model into a temporary bundle when --bundle is not given. Reports the resident set
size (RSS, from /proc/self/statm) after warm-up (token 1,000) and at the end, the K/V buffers' data
pointers, and decode tokens/s. Exit code 1 if RSS grew by 5 MB or more, or a buffer moved.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from edge_runtime.engine import LoadOptions, load
from edge_runtime.models import DEMO_CHECKPOINT

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--tokens", type=int, default=20_000)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--limit-mb", type=float, default=5.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle
        if bundle is None:
            from edge_runtime.exporters.export import ExportOptions, export

            bundle = Path(tmp) / "demo"
            export(ExportOptions(checkpoint=DEMO_CHECKPOINT, out=bundle))
        engine = load(bundle, LoadOptions(sinks=args.sinks, window=args.window))
        ptrs = [a.ctypes.data for a in (*engine.pool.keys, *engine.pool.values)]
        logits = engine.prefill([engine.manifest.tokenizer.bos_token_id or 0])
        token, warm, t_warm = int(np.argmax(logits)), None, 0.0
        for step in range(args.tokens):
            if step == 1000:
                warm, t_warm = rss_bytes(), time.perf_counter()
            token = int(np.argmax(engine.decode(token)))
        t_end, end = time.perf_counter(), rss_bytes()
        moved = ptrs != [a.ctypes.data for a in (*engine.pool.keys, *engine.pool.values)]
    growth = (end - warm) / 1e6
    from edge_runtime.bench.environment import cpu_line

    print(f"cpu: {cpu_line()}")
    print(
        f"tokens {args.tokens} (cache {args.sinks}+{args.window}, {engine.tokens // (args.sinks + args.window)} "
        f"capacities), RSS at token 1000: {warm / 1e6:.1f} MB, at end: {end / 1e6:.1f} MB, growth {growth:+.2f} MB"
    )
    print(f"K/V buffer pointers unchanged: {not moved}; decode {(args.tokens - 1000) / (t_end - t_warm):.0f} tok/s")
    return 1 if growth >= args.limit_mb or moved else 0


if __name__ == "__main__":
    raise SystemExit(main())
