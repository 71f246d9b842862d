"""The TensorRT backend's GPU-free parts: engine profiles from a `trt` bundle's manifest, builder flags from its
Q/DQ weights, the engine cache (keys, lookup, invalidation), the ring-row copy plan, the availability check and
the refusals. The parts that need a GPU run where CUDA (and TensorRT) answer, and are skipped with the reason
elsewhere; on a GPU machine scripts/gpu_check.py runs them end to end."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime.backends import tensorrt, trt_engine
from edge_runtime.backends.cuda_buffers import RowCopy, no_device_reason
from edge_runtime.backends.trt_engine import (
    DECODE,
    PREFILL,
    EngineBuildError,
    EngineCache,
    EngineProfile,
    builder_flags,
    cache_fields,
    cache_key,
    engine_cache_dir,
    graph_weight_types,
    optimization_profiles,
    parser_errors,
    resolve_dims,
)
from edge_runtime.bundle import open_bundle
from edge_runtime.cli.export import main as export_cli
from edge_runtime.engine import LoadOptions, apply_target, load
from edge_runtime.errors import BundleError, EdgeRuntimeError
from edge_runtime.exporters.decoder import Flavor, Precision
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.quant import QuantConfig, QuantMethod
from edge_runtime.targets import load_target

from .tiny_models import save_tiny_checkpoint

REPO = Path(__file__).resolve().parents[1]
NO_DEVICE = no_device_reason()
needs_cuda = pytest.mark.skipif(NO_DEVICE is not None, reason=f"needs a CUDA device: {NO_DEVICE}")
NO_TRT = tensorrt.unavailable_reason()
needs_trt = pytest.mark.skipif(NO_TRT is not None, reason=f"needs TensorRT on a GPU: {NO_TRT}")


@pytest.fixture(scope="module")
def trt_bundles(tmp_path_factory):
    """Tiny `trt` bundles (fp16 activations): float weights, and INT4 blocks of 64 (its embedding table INT8)."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    save_tiny_checkpoint("llama-tied", ckpt, intermediate_size=128)
    out = {}
    for name, quant in (("fp16", QuantConfig()), ("int4", QuantConfig(QuantMethod.INT4, 64))):
        path = tmp_path_factory.mktemp(name) / "b"
        export(
            ExportOptions(
                checkpoint=ckpt, out=path, window=40, flavor=Flavor.TRT, precision=Precision.FP16, quant=quant
            )
        )
        out[name] = path
    return out


ORIN = load_target("orin-nano").backend.tensorrt


def _profile(**changes) -> EngineProfile:
    return dataclasses.replace(EngineProfile.for_ring(capacity=107, slack=63, options=ORIN), **changes)


def test_optimization_profiles_are_the_decode_step_and_a_prefill_chunk_over_the_fixed_ring(trt_bundles):
    m = open_bundle(trt_bundles["fp16"]).manifest
    cap = m.cache.sinks + m.cache.window + m.cache.slack
    p = EngineProfile.for_ring(cap, m.cache.slack, ORIN)
    assert (p.chunk_min, p.chunk_opt, p.chunk_max) == (1, m.cache.slack + 1, cap)
    shapes = optimization_profiles(m.graph.inputs, p)
    assert set(shapes[DECODE]) == set(m.graph.inputs)
    d, f = shapes[DECODE], shapes[PREFILL]
    assert d["input_ids"] == ((1, 1),) * 3
    assert d["attn_mask"] == ((1, cap + 1),) * 3 and d["sink_mask"] == ((cap + 1,),) * 3
    assert d["num_logits_to_keep"] == ((1,),) * 3  # a shape input: values, not shapes
    assert f["input_ids"] == ((1, 1), (1, m.cache.slack + 1), (1, cap))
    assert f["attn_mask"][2] == (cap, 2 * cap) and f["cos"][1] == (m.cache.slack + 1, m.model.rotary_dim // 2)
    assert f["num_logits_to_keep"] == ((1,), (1,), (cap,))
    kv = (1, m.model.num_kv_heads[0], cap, m.model.head_dim)
    assert d["past_key.0"] == f["past_value.1"] == (kv,) * 3  # the ring never changes shape


def test_an_unknown_symbolic_dimension_is_refused_by_name():
    assert resolve_dims([1, "tokens", "capacity_plus_tokens"], 3, 10) == (1, 3, 13)
    with pytest.raises(EngineBuildError, match="'batch' is not one"):
        resolve_dims(["batch", 4], 1, 10)


def test_builder_flags_follow_the_profile_and_the_graphs_weight_types(trt_bundles):
    types = {name: graph_weight_types(path / "model.onnx") for name, path in trt_bundles.items()}
    assert types == {"fp16": set(), "int4": {"int4", "int8"}}  # INT4 Linear blocks, the INT8 embedding table
    assert builder_flags(("fp16",), set()) == ["FP16"]
    assert builder_flags(("fp16",), {"int4"}) == ["FP16"]  # weight-only INT4: the DQ constant says it
    assert builder_flags(("fp16",), types["int4"]) == ["FP16", "INT8"]  # INT8 Q/DQ runs in INT8 only with the flag
    assert builder_flags(("fp16", "int8"), types["int4"]) == ["FP16", "INT8"]
    with pytest.raises(EngineBuildError, match="'fp64'"):
        builder_flags(("fp64",), set())


def test_the_cache_key_changes_with_everything_an_engine_depends_on():
    base = cache_fields("10.3.0", (8, 7), "a" * 64, _profile())
    assert cache_key(base) == cache_key(json.loads(json.dumps(base)))  # stable through the JSON record
    variants = [
        cache_fields("10.3.1", (8, 7), "a" * 64, _profile()),
        cache_fields("10.3.0", (8, 6), "a" * 64, _profile()),
        cache_fields("10.3.0", (8, 7), "b" * 64, _profile()),
        *(
            cache_fields("10.3.0", (8, 7), "a" * 64, _profile(**{f: v}))
            for f, v in (
                ("capacity", 108),
                ("chunk_opt", 32),
                ("chunk_max", 64),
                ("precision", ("fp16",)),
                ("workspace_bytes", 1),
                ("optimization_level", 5),
            )
        ),
    ]
    keys = {cache_key(v) for v in variants}
    assert len(keys) == len(variants) and cache_key(base) not in keys


def test_cache_lookup_store_and_a_corrupt_entry(tmp_path):
    cache = EngineCache(tmp_path / "trt-engines")
    fields = cache_fields("10.3.0", (8, 7), "a" * 64, _profile())
    assert cache.lookup(fields) is None
    path = cache.store(fields, b"plan bytes", seconds=12.3)
    assert cache.lookup(fields) == path and path.read_bytes() == b"plan bytes"
    assert json.loads(path.with_suffix(".json").read_text())["build_seconds"] == 12.3
    assert cache.lookup(cache_fields("10.3.0", (8, 7), "a" * 64, _profile(chunk_max=9))) is None
    path.write_bytes(b"plan byteS")  # a torn or edited engine: never loaded, removed
    assert cache.lookup(fields) is None
    assert not path.exists() and not path.with_suffix(".json").exists()


def test_invalidation_drops_engines_of_another_bundle_or_an_upgraded_tensorrt_and_keeps_other_gpus(tmp_path):
    cache = EngineCache(tmp_path)
    now = cache_fields("10.3.0", (8, 7), "new" * 21 + "n", _profile())
    entries = {
        "current": now,
        "other profile": cache_fields("10.3.0", (8, 7), now["bundle"], _profile(capacity=500)),
        "other gpu": cache_fields("10.0.1", (8, 6), now["bundle"], _profile()),
        "old bundle": cache_fields("10.3.0", (8, 7), "old" * 21 + "o", _profile()),
        "old tensorrt": cache_fields("8.6.2", (8, 7), now["bundle"], _profile()),
    }
    paths = {name: cache.store(f, name.encode(), 1.0) for name, f in entries.items()}
    (tmp_path / "garbage.json").write_text("{not json")
    removed = cache.invalidate(now)
    assert sorted(removed) == sorted([paths["old bundle"], paths["old tensorrt"], tmp_path / "garbage.engine"])
    kept = {name for name, p in paths.items() if p.exists()}
    assert kept == {"current", "other profile", "other gpu"}
    assert cache.lookup(now) == paths["current"]


def test_the_engine_cache_is_beside_the_bundle_or_in_the_user_cache_where_it_is_read_only(tmp_path, monkeypatch):
    (tmp_path / "b").mkdir()
    assert engine_cache_dir(tmp_path / "b", "c" * 64) == tmp_path / "b" / "trt-engines"
    monkeypatch.setattr(trt_engine.os, "access", lambda path, mode: False)
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(tmp_path / "user"))
    assert engine_cache_dir(tmp_path / "b", "c" * 64) == tmp_path / "user" / "trt-engines" / ("c" * 16)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_the_ring_row_copy_plan_writes_exactly_the_new_rows_into_their_slots(dtype):
    rng = np.random.default_rng(0)
    heads, cap, d = 3, 20, 8
    for row, n in ((0, 1), (7, 1), (19, 1), (4, 9), (0, 20)):
        ring = rng.standard_normal((1, heads, cap, d)).astype(dtype)
        new = rng.standard_normal((1, heads, n, d)).astype(dtype)
        expected = ring.copy()
        expected[:, :, row : row + n] = new
        RowCopy.plan(kv_heads=heads, capacity=cap, row_bytes=d * ring.itemsize, row=row, n=n).apply_host(ring, new)
        np.testing.assert_array_equal(ring, expected)
    with pytest.raises(EdgeRuntimeError, match="outside the ring"):
        RowCopy.plan(kv_heads=heads, capacity=cap, row_bytes=16, row=15, n=6)


def test_parser_errors_name_the_node_and_its_op():
    def error(name, op, desc, index):
        return SimpleNamespace(node_name=lambda: name, node_operator=lambda: op, desc=lambda: desc, node=lambda: index)

    errors = [error("/model/layers.0/attn/Einsum", "Einsum", "unsupported equation", 12), error("", "", "bad", 3)]
    parser = SimpleNamespace(num_errors=2, get_error=lambda i: errors[i])
    text = parser_errors(parser, Path("b/model.onnx"), "10.3.0")
    assert text == (
        "TensorRT 10.3.0's ONNX parser cannot read 'b/model.onnx': node '/model/layers.0/attn/Einsum' (op Einsum): "
        "unsupported equation; node '#3' (op ?): bad"
    )


def test_tensorrt_is_available_where_both_packages_import_and_a_device_answers(monkeypatch):
    monkeypatch.setattr(tensorrt, "_importable", lambda module: True)
    monkeypatch.setattr(
        tensorrt, "_device_reason", lambda: "no CUDA device: cudaErrorNoDevice (no CUDA-capable device)"
    )
    assert "cudaErrorNoDevice" in tensorrt.unavailable_reason("aarch64")
    with pytest.raises(EdgeRuntimeError, match=r"orin-nano.*cudaErrorNoDevice"):
        tensorrt.runtime_profile(load_target("orin-nano"), auto_detected=False)
    monkeypatch.setattr(tensorrt, "_device_reason", lambda: None)
    assert tensorrt.unavailable_reason("aarch64") is None
    orin = load_target("orin-nano")
    assert tensorrt.runtime_profile(orin, auto_detected=False) is orin  # TensorRT runs here: no fallback


def test_a_tensorrt_target_selects_the_tensorrt_backend_and_an_ort_bundle_is_refused(tied_bundle):
    bundle = open_bundle(tied_bundle)
    assert apply_target(LoadOptions(), load_target("orin-nano"), bundle).tensorrt == ORIN
    assert apply_target(LoadOptions(), load_target("x86"), bundle).tensorrt is None
    with pytest.raises(BundleError, match="ort-flavor bundle; TensorRT runs trt-flavor ones"):
        load(tied_bundle, LoadOptions(tensorrt=ORIN))


def test_build_engine_is_refused_before_the_export(tmp_path, monkeypatch):
    r = CliRunner().invoke(export_cli, ["demo", "-o", str(tmp_path / "a"), "--build-engine"])
    assert r.exit_code != 0 and "give a TensorRT --target" in r.output and not (tmp_path / "a").exists()
    monkeypatch.setattr(tensorrt, "unavailable_reason", lambda machine=None: "tensorrt not installed (pip install x)")
    r = CliRunner().invoke(export_cli, ["demo", "-o", str(tmp_path / "b"), "--target", "orin-nano", "--build-engine"])
    assert r.exit_code != 0 and "needs TensorRT on this machine: tensorrt not installed" in r.output
    assert not (tmp_path / "b").exists()


@pytest.mark.skipif(NO_DEVICE is None, reason="this machine has a CUDA device: the no-GPU report is not what runs")
def test_gpu_check_reports_what_it_could_not_check_without_a_gpu():
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check.py")], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 3, r.stdout + r.stderr  # 3: nothing failed, some checks could not run
    assert "NOT CHECKED" in r.stdout and "FAIL" not in r.stdout
    assert "no GPU" in r.stdout


def test_first_use_builds_the_engine_with_the_profiles_and_progress_then_loads_it_from_the_cache(
    trt_bundles, monkeypatch
):
    """ensure_engine over fake_gpu's builder API: what it asks TensorRT for, once; then the cache."""
    from edge_runtime.backends import cuda_buffers

    from .fake_gpu import FakeBuild, FakeCudaRuntime, fake_tensorrt_builder

    bundle, build, lines = trt_bundles["int4"], FakeBuild(), []
    monkeypatch.setattr(cuda_buffers, "runtime", lambda: FakeCudaRuntime())  # compute capability 8.7
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt_builder(build))
    m = open_bundle(bundle).manifest
    cap = m.cache.sinks + m.cache.window + m.cache.slack
    profile = EngineProfile.for_ring(cap, m.cache.slack, ORIN)
    path = trt_engine.ensure_engine(bundle, m, profile, lines.append)
    assert path.parent == bundle / "trt-engines" and path.read_bytes() == b"serialized plan"
    assert build.parsed == str(bundle / "model.onnx")
    assert build.flags == ["FP16", "INT8"]  # orin-nano's [fp16, int8]; the INT4 blocks need none
    assert (build.workspace, build.level, build.timing_cache_in) == (ORIN.workspace_bytes, 3, b"")
    decode, prefill = build.profiles
    assert decode["input_ids"] == ("shape", (1, 1), (1, 1), (1, 1))
    assert prefill["attn_mask"] == ("shape", (1, cap + 1), (m.cache.slack + 1, cap + m.cache.slack + 1), (cap, 2 * cap))
    assert prefill["num_logits_to_keep"] == ("values", (1,), (1,), (cap,))
    assert len(decode) == len(m.graph.inputs)
    assert (bundle / "trt-engines" / "timing-10.3.0-fake-sm87.cache").read_bytes() == b"timings"
    assert lines[0].startswith("building the engine for sm87, TensorRT 10.3.0-fake")
    assert [x.split(" (")[0].split(" done")[0] for x in lines[1:3]] == ["Building engine", "Building engine"]
    assert len(lines) == 4 and lines[-1].startswith("engine built in")  # nested phases are not reported
    build.profiles.clear()
    assert trt_engine.ensure_engine(bundle, m, profile, lines.append) == path and not build.profiles  # cached


def test_a_parser_failure_is_an_error_naming_the_node_and_op(trt_bundles, monkeypatch, tmp_path):
    from .fake_gpu import FakeBuild, fake_tensorrt_builder

    err = SimpleNamespace(
        node_name=lambda: "/model/layers.0/mlp/DequantizeLinear",
        node_operator=lambda: "DequantizeLinear",
        desc=lambda: "zero point must be 0",
        node=lambda: 7,
    )
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt_builder(FakeBuild(), parse_errors=[err]))
    m = open_bundle(trt_bundles["int4"]).manifest
    with pytest.raises(EngineBuildError, match=r"node '/model/layers.0/mlp/DequantizeLinear' \(op DequantizeLinear\)"):
        trt_engine.build_engine(
            trt_bundles["int4"] / "model.onnx", m.graph.inputs, _profile(), timing_cache=tmp_path / "t", progress=print
        )


def _fake_device(bundle, cpu, tmp_path, monkeypatch):
    """fake_gpu's host-memory CUDA and an "engine" running the graph on ONNX Runtime, patched in; returns the
    fake runtime and a loader of the bundle on that TensorRT backend."""
    from edge_runtime.backends import cuda_buffers, trt_backend

    from .fake_gpu import FakeCudaRuntime, fake_tensorrt

    cuda = FakeCudaRuntime()
    monkeypatch.setattr(cuda_buffers, "runtime", lambda: cuda)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(cpu.manifest, cpu.geometry.capacity, cuda))
    plan = tmp_path / "fake.engine"
    plan.write_text(str(bundle / "model.onnx"))
    monkeypatch.setattr(trt_backend, "ensure_engine", lambda *args: plan)
    return cuda, lambda cuda_graph=False: load(bundle, LoadOptions(tensorrt=ORIN, cuda_graph=cuda_graph))


def test_session_snapshots_copy_the_device_ring_out_and_back_on_a_fake_device(gemma3_trt, tmp_path, monkeypatch):
    """A snapshot under TensorRT holds the device ring's rows (not the host pool's stale zeros), and restoring
    it into another session puts them on its device: decoding then continues as on the CPU."""
    from edge_runtime.session import Session

    cpu = Session(load(gemma3_trt))
    _, load_gpu = _fake_device(gemma3_trt, cpu.engine, tmp_path, monkeypatch)
    gpu = Session(load_gpu())
    prompt = np.random.default_rng(4).integers(0, cpu.manifest.model.vocab_size, 150).tolist()
    for s in (cpu, gpu):
        for at in range(0, len(prompt) - 1, 30):  # turns shorter than the window of 40: no overflow warning
            s.prefill(prompt[at : min(at + 30, len(prompt) - 1)])
    snaps = cpu.snapshot(), gpu.snapshot()
    for a, b in zip((*snaps[0].keys, *snaps[0].values), (*snaps[1].keys, *snaps[1].values), strict=True):
        np.testing.assert_array_equal(b, a)
    other = Session(load_gpu())
    other.restore(snaps[1])
    for token in [prompt[-1], 5, 9, 13]:
        np.testing.assert_array_equal(other.engine.decode(token), cpu.engine.decode(token))


@pytest.fixture(scope="module")
def gemma3_trt(tmp_path_factory):
    """A tiny Gemma 3 `trt` bundle (fp16): its local layers keep their own, smaller ring."""
    ckpt = tmp_path_factory.mktemp("gemma3")
    save_tiny_checkpoint("gemma3", ckpt)
    path = tmp_path_factory.mktemp("gemma3-trt") / "b"
    export(ExportOptions(checkpoint=ckpt, out=path, window=40, flavor=Flavor.TRT, precision=Precision.FP16))
    return path


@pytest.mark.parametrize("model", ["llama", "gemma3"])
@pytest.mark.parametrize("cuda_graph", [False, True], ids=["plain", "cuda-graph"])
def test_the_backends_host_side_matches_onnxruntime_on_a_fake_device(
    trt_bundles, gemma3_trt, tmp_path, monkeypatch, cuda_graph, model
):
    """TrtBackend over fake_gpu's host-memory CUDA and an "engine" that runs the graph on ONNX Runtime: its
    staging, per-profile shapes, ring-row copies and decode-graph replay must give ONNX Runtime's own logits,
    through a chunked prompt and past the ring's capacity (and Gemma 3's local ring's)."""
    from edge_runtime.backends import trt_backend

    bundle = trt_bundles["fp16"] if model == "llama" else gemma3_trt
    cpu = load(bundle)
    cuda, load_gpu = _fake_device(bundle, cpu, tmp_path, monkeypatch)
    gpu = load_gpu(cuda_graph)
    assert isinstance(gpu.backend, trt_backend.TrtBackend) and gpu.backend.providers == ["TensorRT 10.3.0-fake"]

    cap = cpu.geometry.capacity
    prompt = np.random.default_rng(3).integers(0, cpu.manifest.model.vocab_size, cap + 20).tolist()
    chunks = len(cpu.ring.chunks(len(prompt)))
    assert chunks >= 2
    a, b = cpu.prefill(prompt), gpu.prefill(prompt)
    np.testing.assert_array_equal(b, a)
    steps = cap + 10  # the ring wraps again while decoding
    for _ in range(steps):
        token = int(np.argmax(a))
        a, b = cpu.decode(token), gpu.decode(token)
        np.testing.assert_array_equal(b, a)
    engine = gpu.backend.runtime.engines[0]
    assert engine.runs == [steps, chunks]  # one decode run per step, one prefill run per chunk
    assert cuda.copies["graph_launches"] == (steps - 1 if cuda_graph else 0)
    layers = cpu.manifest.model.num_layers
    assert cuda.copies["d2d_2d"] == 2 * layers * (steps + chunks)  # every new row written on the "device"
    assert not any(k.any() for k in gpu.pool.keys)  # the host pool is not the cache ...
    gpu.backend.kv_to_host()  # ... until it is copied back
    for x, y in zip((*gpu.pool.keys, *gpu.pool.values), (*cpu.pool.keys, *cpu.pool.values), strict=True):
        np.testing.assert_array_equal(x, y)


# -- where CUDA / TensorRT run ---------------------------------------------------------------------------


@needs_cuda
def test_device_ring_row_copy_matches_the_host_plan():
    from edge_runtime.backends.cuda_buffers import DeviceBuffer, Stream

    rng = np.random.default_rng(1)
    ring, new = (
        rng.standard_normal((1, 2, 16, 8)).astype(np.float16),
        rng.standard_normal((1, 2, 3, 8)).astype(np.float16),
    )
    stream, dst, src = Stream(), DeviceBuffer(ring.nbytes), DeviceBuffer(new.nbytes)
    dst.upload(ring, stream)
    src.upload(new, stream)
    plan = RowCopy.plan(kv_heads=2, capacity=16, row_bytes=16, row=5, n=3)
    plan.run(dst.ptr, src.ptr, stream)
    out = np.empty_like(ring)
    dst.download(out, stream)
    stream.sync()
    plan.apply_host(ring, new)
    np.testing.assert_array_equal(out, ring)


@needs_trt
def test_tensorrt_greedy_decode_matches_onnxruntime_cpu(trt_bundles):
    cpu = load(trt_bundles["fp16"])
    gpu = load(trt_bundles["fp16"], LoadOptions(tensorrt=ORIN))
    prompt = [1, 5, 9, 2, 7]
    tokens = {}
    for name, e in (("cpu", cpu), ("gpu", gpu)):
        logits, out = e.prefill(prompt), []
        for _ in range(12):
            out.append(int(np.argmax(logits)))
            logits = e.decode(out[-1])
        tokens[name] = out
    assert tokens["gpu"] == tokens["cpu"]
