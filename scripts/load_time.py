"""Where a bundle's load time goes, and what two ways of cutting it would save.

    python scripts/load_time.py BUNDLE_DIR [--rounds 5] [--threads 2]

Each figure is the median over `--rounds` fresh processes, taken alternately:
  hash          open_bundle with every file hashed (memo off)
  memo          open_bundle with the verified-file memo warm (edge_runtime/verified.py; the default)
  session       ONNX Runtime session creation from the bundle's graph, all graph optimizations on
                (what the engine does)
  session-opt   session creation from an optimized graph saved beforehand (optimized_model_filepath),
                optimizations off: what caching the optimized model beside the bundle would give
The optimized copy is written to a temporary folder (it duplicates the weights, which is why it is not
cached beside bundles unless it pays).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = ("hash", "memo", "session", "session-opt")


def _session(graph: str, threads: int, optimize: bool, save: str | None = None) -> float:
    import onnxruntime as ort

    from edge_runtime import kernels

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    kernels.register(so)  # as the engine does: `--kernel edge` graphs need the edge ops to load
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if save:
        so.optimized_model_filepath = save
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "opt.onnx.data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    t = time.perf_counter()
    ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])
    return time.perf_counter() - t


def child(case: str, bundle: Path, opt: Path, threads: int) -> float:
    from edge_runtime.bundle import open_bundle

    if case in ("hash", "memo"):
        t = time.perf_counter()
        open_bundle(bundle, memo=case == "memo")
        return time.perf_counter() - t
    if case == "session":
        return _session(str(bundle / open_bundle(bundle, verify=False).manifest.graph.file), threads, True)
    return _session(str(opt), threads, False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", nargs=2, metavar=("CASE", "OPT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], a.bundle, Path(a.child[1]), a.threads)))
        return 0
    if not (a.bundle / "manifest.json").is_file():
        raise SystemExit(f"{a.bundle} is not a bundle (no manifest.json)")
    from edge_runtime.bundle import open_bundle

    graph = a.bundle / open_bundle(a.bundle).manifest.graph.file  # also warms the memo
    with tempfile.TemporaryDirectory() as tmp:
        opt = Path(tmp) / "opt.onnx"
        _session(str(graph), a.threads, True, save=str(opt))
        times: dict[str, list[float]] = {c: [] for c in CASES}
        for r in range(a.rounds):
            for case in CASES if r % 2 == 0 else reversed(CASES):
                cmd = [sys.executable, __file__, str(a.bundle), "--threads", str(a.threads), "--child", case, str(opt)]
                times[case].append(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout))
    from edge_runtime.bench.environment import cpu_line

    print(f"{a.bundle}: {cpu_line()}, medians of {a.rounds} fresh processes\n")
    print("| step | seconds | runs |")
    print("| --- | ---: | --- |")
    for case, v in times.items():
        print(f"| {case} | {statistics.median(v):.3f} | {', '.join(f'{x:.3f}' for x in v)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
