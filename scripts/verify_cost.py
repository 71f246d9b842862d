"""What a bundle load's verification costs, per scheme (edge_runtime/verified.py).

    python scripts/verify_cost.py BUNDLE_DIR [--rounds 7]

Medians over --rounds, in this process, page cache warm (the bundle read once first; a cold SD card
adds its read time to every scheme that reads, which ONNX Runtime's load then pays less):
  off        open_bundle(verify="off"): manifest, digest and confinement only
  sampled    the default with the memo warm: small files hashed, SAMPLE_CHUNKS chunks CRC'd per big file
  full       verify="full": sha256 and the chunk CRCs of every byte (a first load, a weekly load)
  sha256     sha256 alone over every file (what every memo-less load cost before)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    from edge_runtime import verified
    from edge_runtime.bundle import open_bundle, sha256_file

    b = open_bundle(a.bundle, verify="full")  # warms the page cache and writes the memos
    files = [a.bundle / n for n in b.manifest.files]
    cases = {
        "off": lambda: open_bundle(a.bundle, verify="off"),
        "sampled": lambda: open_bundle(a.bundle),
        "full": lambda: open_bundle(a.bundle, verify="full"),
        "sha256": lambda: [sha256_file(f) for f in files],
    }
    times: dict[str, list[float]] = {c: [] for c in cases}
    for r in range(a.rounds):
        for name, fn in cases.items() if r % 2 == 0 else reversed(cases.items()):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    size = sum(f.stat().st_size for f in files)
    big = sum(f.stat().st_size for f in files if f.stat().st_size > verified.FULL_HASH_BYTES)
    from edge_runtime.bench.environment import cpu_line

    print(f"cpu: {cpu_line()}")
    print(
        f"{a.bundle}: {size / 1e6:.1f} MB in {len(files)} files ({big / 1e6:.1f} MB sampled: "
        f"{verified.SAMPLE_CHUNKS} x {verified.CHUNK_BYTES >> 10} KiB per big file); medians of {a.rounds}\n"
    )
    print("| scheme | ms | runs (ms) |\n| --- | ---: | --- |")
    for name, v in times.items():
        print(f"| {name} | {statistics.median(v) * 1e3:.1f} | {', '.join(f'{x * 1e3:.0f}' for x in v)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
