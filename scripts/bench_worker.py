"""Child processes of scripts/bench_vs_ortgenai.py: one measurement per process, JSON on stdout.

    python scripts/bench_worker.py worker ours|theirs BUNDLE_DIR [options]   # one generation benchmark
    python scripts/bench_worker.py bandwidth THREADS                          # memory read bandwidth
    python scripts/bench_worker.py bandwidth THREADS --sums                   # its numpy-sum probe only

Each runs in a fresh process so its peak RSS is its own and the driver never holds its arrays.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

# --------------------------------------------------------------------------------------------------
# Workers: one generation benchmark per process, JSON on stdout.


def _run_ours(a: argparse.Namespace, prompt: list[int]) -> dict[str, Any]:
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.generate import GenerationConfig, stream_generate
    from edge_runtime.manifest import Manifest
    from edge_runtime.tokenizer import Tokenizer

    t0 = time.perf_counter()
    window = None
    if a.window == "match":
        sinks = Manifest.read(Path(a.model) / "manifest.json").cache.sinks
        window = len(prompt) + a.gen_tokens - sinks
    elif a.window != "bundle":
        window = int(a.window)
    engine = load(a.model, LoadOptions(threads=a.threads, window=window))
    tokenizer = Tokenizer.for_engine(engine)
    load_s = time.perf_counter() - t0

    # Time spent inside session.run during decode steps, to give the share spent outside it. The
    # wrappers cost well under a microsecond per step; a backend without `session` is not measured.
    session, decoding, inside = getattr(engine.backend, "session", None), [False], [0.0]
    measured = session is not None and hasattr(session, "run_with_iobinding")
    real_run, real_decode = getattr(session, "run_with_iobinding", None), engine.decode

    def timed_run(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return real_run(*args, **kwargs)
        finally:
            if decoding[0]:
                inside[0] += time.perf_counter() - t

    def flagged_decode(token: int) -> np.ndarray:
        decoding[0] = True
        try:
            return real_decode(token)
        finally:
            decoding[0] = False

    if measured:
        session.run_with_iobinding = timed_run
        engine.decode = flagged_decode
    config = GenerationConfig(max_tokens=a.gen_tokens, stop_on_eos=False)
    trials = []
    for i in range(a.warmup + a.trials):
        inside[0] = 0.0
        stats = None
        for event in stream_generate(engine, tokenizer, prompt, config):
            stats = event.stats or stats
        assert stats is not None
        if i >= a.warmup:
            trials.append(
                {
                    "ttft_s": stats.ttft_s,
                    "decode_s": stats.decode_s,
                    "generated": stats.generated_tokens,
                    "decode_tps": stats.decode_tps,
                    "outside_run_share": (
                        (stats.decode_s - inside[0]) / stats.decode_s if measured and stats.decode_s else None
                    ),
                }
            )
    # The static pool's K/V arrays: the whole cache, allocated once at load for the ring's capacity.
    pool = engine.pool
    kv_bytes = sum(a.nbytes for a in (*pool.keys, *pool.values, *pool.new_keys, *pool.new_values))
    return {"load_s": load_s, "trials": trials, "capacity": engine.geometry.capacity, "kv_bytes": kv_bytes}


def _run_theirs(a: argparse.Namespace, prompt: list[int]) -> dict[str, Any]:
    import onnxruntime_genai as og

    t0 = time.perf_counter()
    config = og.Config(a.model)
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": a.threads}}}}))
    model = og.Model(config)
    tokenizer = og.Tokenizer(model)
    load_s = time.perf_counter() - t0
    ids = np.asarray(prompt, dtype=np.int32)
    total = len(prompt) + a.gen_tokens
    trials = []
    for i in range(a.warmup + a.trials):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=total, min_length=total)  # EOS ignored
        stamps = []
        t0 = time.perf_counter()
        gen = og.Generator(model, params)
        gen.append_tokens(ids)
        stream = tokenizer.create_stream()
        while not gen.is_done():
            gen.generate_next_token()
            stream.decode(int(gen.get_next_tokens()[0]))
            stamps.append(time.perf_counter())
        del gen
        if i >= a.warmup:
            decode_s = stamps[-1] - stamps[0]
            trials.append(
                {
                    "ttft_s": stamps[0] - t0,
                    "decode_s": decode_s,
                    "generated": len(stamps),
                    "decode_tps": (len(stamps) - 1) / decode_s if decode_s > 0 else 0.0,
                    "outside_run_share": None,
                }
            )
    return {"load_s": load_s, "trials": trials, "capacity": total, "kv_bytes": _genai_kv_bytes(Path(a.model), total)}


def _genai_kv_bytes(model_dir: Path, max_length: int) -> int | None:
    """onnxruntime-genai's KV cache bytes, computed (it has no API for them): with
    past_present_share_buffer (its CPU default for GroupQueryAttention) each layer holds one K and one V
    buffer of [1, kv_heads, max_length, head_size] in the graph's past_key_values dtype; without it the
    cache grows to that size by the last token."""
    import onnx

    decoder = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
    graph = onnx.load(str(model_dir / decoder["filename"]), load_external_data=False).graph
    past = [i for i in graph.input if "past_key_values" in i.name]
    if not past:
        return None
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(past[0].type.tensor_type.elem_type).itemsize
    return len(past) * decoder["num_key_value_heads"] * decoder["head_size"] * max_length * itemsize


def worker(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench_worker.py worker")
    ap.add_argument("side", choices=("ours", "theirs"))
    ap.add_argument("model")
    ap.add_argument("--prompt-file", required=True)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--window", default="match")
    ap.add_argument("--profile", help="write cProfile stats of the whole run to this file")
    a = ap.parse_args(argv)
    prompt = json.loads(Path(a.prompt_file).read_text())
    run = _run_ours if a.side == "ours" else _run_theirs
    if a.profile:
        import cProfile

        prof = cProfile.Profile()
        result = prof.runcall(run, a, prompt)
        prof.dump_stats(a.profile)
    else:
        result = run(a, prompt)
    print(json.dumps(result))
    return 0


def measure_read_bandwidth(
    threads: int, mb_per_thread: int = 512, reps: int = 5, gemv: bool = True
) -> dict[str, float]:
    """Best-of-`reps` read bandwidth (bytes/s) with `threads` threads: numpy sums and (with `gemv`) an ORT
    fp32 GEMV. The sums alone (a few seconds with start-up) read as fast as a C loop of AVX2 loads here
    (35.8 against 33-35 GB/s) and serve as the per-round probe."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    n = mb_per_thread * (1 << 20) // 4
    arrays = [np.full(n, 1.0, np.float32) for _ in range(threads)]

    def one_sum(i: int) -> None:
        arrays[i].sum()

    best_sum = 0.0
    for _ in range(reps):
        workers = [threading.Thread(target=one_sum, args=(i,)) for i in range(threads)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best_sum = max(best_sum, threads * n * 4 / (time.perf_counter() - t0))
    arrays.clear()
    if not gemv:
        return {"numpy_sum": best_sum}

    k, cols = 4096, threads * n // 4096  # one [K, N] fp32 weight of threads * mb_per_thread MB
    w = np.full((k, cols), 1e-3, np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "gemv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cols])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    del w
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gemv.onnx"
        onnx.save_model(model, path, save_as_external_data=True, location="gemv.data")
        del model, graph
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    x = np.ones((1, k), np.float32)
    session.run(None, {"x": x})
    best_gemv = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        session.run(None, {"x": x})
        best_gemv = max(best_gemv, k * cols * 4 / (time.perf_counter() - t0))
    return {"numpy_sum": best_sum, "ort_gemv_fp32": best_gemv}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:  # its own parser: `worker --help` lists its options
        return worker(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("worker", help="one generation benchmark, JSON on stdout (`worker --help` for its options)")
    bw = sub.add_parser("bandwidth", help="memory read bandwidth in bytes/s, JSON on stdout")
    bw.add_argument("threads", type=int)
    bw.add_argument("--sums", action="store_true", help="the numpy-sum probe only (no ONNX Runtime GEMV)")
    a = ap.parse_args(argv)
    print(json.dumps(measure_read_bandwidth(a.threads, gemv=not a.sums)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
