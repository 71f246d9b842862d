"""On a machine with an NVIDIA GPU: check what the TensorRT backend can be checked for, and say what could not be.

    python scripts/gpu_check.py [--tokens 32] [--keep DIR]

1. CUDA through cuda-python: a device buffer round trip, the ring-row copy (new K/V rows into their ring
   slots, device to device) against the same copy done on the host, and a captured CUDA graph replayed.
2. Where tensorrt imports: the demo model exported as `trt` bundles (fp16 weights; INT4 blocks of 128), each
   engine built (and its build time), loaded again from the engine cache, and greedy decoding compared
   token for token with ONNX Runtime CPU on the same bundle, with and without CUDA-graph decode.

Each line says PASS, FAIL or NOT CHECKED (with the reason: no GPU, no tensorrt). Exit status: 0 all passed,
1 something failed, 3 nothing failed but something could not be checked here.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edge_runtime.backends.cuda_buffers import (
    CudaGraph,
    DeviceBuffer,
    PinnedArray,
    RowCopy,
    Stream,
    compute_capability,
    no_device_reason,
)

RESULTS: list[str] = []


def report(status: str, what: str, detail: str = "") -> None:
    line = f"{status:<12} {what}" + (f": {detail}" if detail else "")
    RESULTS.append(status)
    print(line, flush=True)


def attempt(what: str, check: Callable[[], str]) -> bool:
    """Run one check: PASS with what it measured, or FAIL with the error."""
    try:
        report("PASS", what, check())
        return True
    except Exception as e:  # a check that raises has failed; the rest still run
        report("FAIL", what, f"{type(e).__name__}: {e}")
        traceback.print_exc()
        return False


def buffer_round_trip() -> str:
    stream, host = Stream(), np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8)
    buf, back = DeviceBuffer(host.nbytes), np.zeros_like(host)
    buf.upload(host, stream)
    buf.download(back, stream)
    stream.sync()
    assert np.array_equal(host, back), "bytes differ after the round trip"
    return f"{host.nbytes} bytes up and back"


def ring_row_copy() -> str:
    rng, stream = np.random.default_rng(1), Stream()
    checked = 0
    for heads, cap, d, row, n in ((2, 16, 64, 5, 3), (8, 2048, 64, 2047, 1), (4, 300, 128, 0, 300)):
        ring = rng.standard_normal((1, heads, cap, d)).astype(np.float16)
        new = rng.standard_normal((1, heads, n, d)).astype(np.float16)
        dst, src = DeviceBuffer(ring.nbytes), DeviceBuffer(new.nbytes)
        dst.upload(ring, stream)
        src.upload(new, stream)
        plan = RowCopy.plan(kv_heads=heads, capacity=cap, row_bytes=d * 2, row=row, n=n)
        plan.run(dst.ptr, src.ptr, stream)
        out = np.empty_like(ring)
        dst.download(out, stream)
        stream.sync()
        plan.apply_host(ring, new)
        assert np.array_equal(out, ring), f"ring rows {row}..{row + n} of [1, {heads}, {cap}, {d}] differ"
        dst.free()
        src.free()
        checked += 1
    return f"{checked} shapes, device result == host plan"


def cuda_graph_replay() -> str:
    stream = Stream()
    pinned, back = PinnedArray((4096,), np.float32), PinnedArray((4096,), np.float32)
    buf = DeviceBuffer(pinned.array.nbytes)

    def enqueue() -> None:
        buf.upload(pinned.array, stream)
        buf.download(back.array, stream)

    graph = CudaGraph(stream, enqueue)
    for value in (1.0, 2.5):  # the captured copies read the pinned buffer as it is at each launch
        pinned.array[:] = value
        graph.launch()
        stream.sync()
        assert (back.array == value).all(), f"replay {value}: got {back.array[:3]}"
    graph.close()
    return "capture once, two launches read the updated pinned input"


def greedy(engine, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    logits = engine.prefill(prompt).copy()
    first, out = logits, []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = engine.decode(out[-1])
    return out, first


def tensorrt_checks(tokens: int, keep: Path | None) -> None:
    import tensorrt as trt

    from edge_runtime.backends.trt_engine import EngineProfile, ensure_engine
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.exporters.decoder import Flavor, Precision
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import QuantConfig, QuantMethod
    from edge_runtime.models import DEMO_CHECKPOINT
    from edge_runtime.targets import load_target

    options = load_target("orin-nano").backend.tensorrt
    root = keep or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    prompt = [1, 40, 50, 60, 70, 80, 90, 100]
    for name, quant in (("fp16", QuantConfig()), ("int4", QuantConfig(QuantMethod.INT4, 128))):
        bundle = root / f"demo-trt-{name}"
        if not bundle.exists():
            export(
                ExportOptions(
                    checkpoint=DEMO_CHECKPOINT,
                    out=bundle,
                    flavor=Flavor.TRT,
                    precision=Precision.FP16,
                    window=120,
                    quant=quant,
                )
            )
        cpu = load(bundle)
        g = cpu.geometry
        local = None if cpu.local_geometry is None else cpu.local_geometry.capacity
        profile = EngineProfile.for_ring(g.capacity, g.slack, options, local)

        def build(bundle=bundle, cpu=cpu, profile=profile) -> str:
            t0 = time.perf_counter()
            path = ensure_engine(bundle, cpu.manifest, profile, lambda m: print(f"             {m}", flush=True))
            built = time.perf_counter() - t0
            t0 = time.perf_counter()
            assert ensure_engine(bundle, cpu.manifest, profile, print) == path
            hit = time.perf_counter() - t0
            size = path.stat().st_size / 2**20
            return f"TensorRT {trt.__version__}, {size:.1f} MiB in {built:.1f}s; from the cache in {hit:.2f}s"

        if not attempt(f"engine build, {name} demo bundle", build):
            continue
        want, first_cpu = greedy(cpu, prompt, tokens)
        for cuda_graph in (False, True):

            def parity(bundle=bundle, cuda_graph=cuda_graph, want=want, first_cpu=first_cpu) -> str:
                gpu = load(bundle, LoadOptions(tensorrt=options, cuda_graph=cuda_graph))
                got, first_gpu = greedy(gpu, prompt, tokens)
                err = float(np.abs(first_gpu - first_cpu).max() / np.abs(first_cpu).max())
                t0 = time.perf_counter()
                for t in got[:16]:
                    gpu.decode(t)
                step = (time.perf_counter() - t0) / 16
                same = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
                assert same is None, (
                    f"first differing token at step {same}: {got[same]} vs CPU {want[same]}; "
                    f"prompt logits rel err {err:.2e}"
                )
                return (
                    f"{tokens} tokens identical; prompt logits max rel diff {err:.2e}; decode step {step * 1e3:.2f} ms"
                )

            attempt(f"greedy parity with ONNX Runtime CPU, {name}, cuda_graph={cuda_graph}", parity)
    print(f"bundles and engines in {root}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens compared per run")
    ap.add_argument("--keep", type=Path, default=None, help="export bundles (and their engines) here, reused")
    args = ap.parse_args()
    reason = no_device_reason()
    if reason is not None:
        report("NOT CHECKED", "CUDA device buffers, ring-row copy, CUDA graph", f"no GPU ({reason})")
    else:
        major, minor = compute_capability()
        print(f"CUDA device 0: compute capability {major}.{minor}")
        attempt("device buffer round trip", buffer_round_trip)
        attempt("ring-row copy on the device", ring_row_copy)
        attempt("CUDA graph capture and replay", cuda_graph_replay)
    try:
        import tensorrt  # noqa: F401
    except ImportError as e:
        report("NOT CHECKED", "TensorRT engine build and greedy parity", f"tensorrt does not import ({e})")
    else:
        if reason is not None:
            report("NOT CHECKED", "TensorRT engine build and greedy parity", f"no GPU ({reason})")
        else:
            tensorrt_checks(args.tokens, args.keep)
    return 1 if "FAIL" in RESULTS else 3 if "NOT CHECKED" in RESULTS else 0


if __name__ == "__main__":
    raise SystemExit(main())
