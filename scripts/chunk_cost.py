"""What a speculative verification of n rows costs, in plain decode steps.

    python scripts/chunk_cost.py BUNDLE_DIR [--rows 1 2 3 4 5 8] [--rounds 15] [--context 300] [--threads 2]

After a prefill of --context random tokens, each round times one call per row count, in alternating
order: a decode step (n = 1) or a chunk of n rows with every row's logits (what a verification feeds:
the pending token and n - 1 proposals), each rolled back afterwards so every call sees the same context.
Prints the median milliseconds and the ratio to the decode step's median: a speculative step of n rows
pays off when it emits more tokens than that ratio. Ratios only; absolute times vary with the machine
and its load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if min(a.rows) < 1 or a.rounds < 1 or a.context < 1:
        ap.error("--rows, --rounds and --context must be at least 1")
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.errors import EdgeRuntimeError

    try:
        return _measure(a, load(a.bundle, LoadOptions(threads=a.threads)))
    except EdgeRuntimeError as e:  # a missing bundle, more rows than the ring can roll back: one line
        print(f"chunk_cost: {e}", file=sys.stderr)
        return 2


def _measure(a: argparse.Namespace, engine) -> int:
    vocab = engine.manifest.model.vocab_size
    rng = np.random.default_rng(0)
    engine.prefill(rng.integers(0, vocab, a.context).tolist())
    rows = sorted(set(a.rows) | {1})
    times: dict[int, list[float]] = {n: [] for n in rows}
    for r in range(a.rounds):
        for n in rows if r % 2 == 0 else rows[::-1]:
            ids = rng.integers(0, vocab, n).tolist()
            t0 = time.perf_counter()
            if n == 1:
                engine.decode(ids[0])
            else:
                engine.prefill(ids, all_logits=True)
            times[n].append(time.perf_counter() - t0)
            engine.truncate(n)
    step = statistics.median(times[1])
    from edge_runtime.bench.environment import cpu_line

    print(f"{a.bundle}: {cpu_line()}, {a.threads} threads, medians of {a.rounds}")
    print("| rows | ms | decode steps |\n| ---: | ---: | ---: |")
    for n in rows:
        med = statistics.median(times[n])
        print(f"| {n} | {med * 1e3:.2f} | {med / step:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
