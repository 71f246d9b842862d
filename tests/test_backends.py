"""Backends without a GPU: the profile's ONNX Runtime providers where this onnxruntime has them (a warning and
CPU where not), TensorRT's availability and install hint, and a TensorRT target's fallback: ONNX Runtime CPU
where it was auto-detected, a one-line refusal where it was named."""

from __future__ import annotations

import warnings
from dataclasses import replace

import onnxruntime as ort
import pytest
from click.testing import CliRunner

from edge_runtime.backends import tensorrt
from edge_runtime.backends.providers import CPU, ProviderFallbackWarning, session_providers
from edge_runtime.backends.tensorrt import TensorRTFallbackWarning, runtime_profile, unavailable_reason
from edge_runtime.cli.run import main as run_cli
from edge_runtime.engine import LoadOptions, load
from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.targets import Detection, load_target

CUDA, TRT = "CUDAExecutionProvider", "TensorrtExecutionProvider"


def test_providers_this_onnxruntime_has_are_kept_in_order_with_cpu_last():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing missing: no warning
        assert session_providers([CPU, CUDA], available=[TRT, CUDA, CPU]) == [CUDA, CPU]
        assert session_providers([TRT, CUDA, CPU], available=[TRT, CUDA, CPU]) == [TRT, CUDA, CPU]
        assert session_providers(None, available=[CPU]) == [CPU]


def test_a_missing_provider_is_a_warning_naming_it_and_the_session_runs_on_cpu():
    with pytest.warns(ProviderFallbackWarning, match=f"no {CUDA}.*running on {CPU}.*onnxruntime-gpu"):
        assert session_providers([CUDA, CPU], available=[CPU]) == [CPU]


def test_the_engine_runs_on_the_profiles_providers(tied_bundle):
    if CUDA in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: the fallback is not what would run")
    with pytest.warns(ProviderFallbackWarning, match=CUDA):
        engine = load(tied_bundle, LoadOptions(providers=(CUDA, CPU)))
    assert engine.backend.providers == [CPU]
    assert engine.backend.session.get_providers() == [CPU]
    assert engine.prefill([0, 5, 9]).shape == (engine.manifest.model.vocab_size,)


def test_a_target_profiles_providers_reach_the_session(tied_bundle):
    profile = load_target("x86")
    with pytest.warns(ProviderFallbackWarning, match=CUDA):
        engine = load(tied_bundle, target=replace(profile, backend=replace(profile.backend, providers=(CUDA, CPU))))
    assert engine.backend.providers == [CPU]


def test_tensorrt_unavailable_says_what_to_install(monkeypatch):
    monkeypatch.setattr(tensorrt, "_importable", lambda module: False)
    assert "pip install 'edge-runtime[trt]'" in unavailable_reason("x86_64")
    assert "JetPack" in unavailable_reason("aarch64") and "cuda-python" in unavailable_reason("aarch64")
    monkeypatch.setattr(tensorrt, "_importable", lambda module: True)
    monkeypatch.setattr(tensorrt, "_device_reason", lambda: "no CUDA device: cudaGetDeviceCount found 0")
    assert unavailable_reason("x86_64") == "no CUDA device: cudaGetDeviceCount found 0"  # installed is not enough


def test_a_named_tensorrt_target_is_refused_in_one_line_with_the_way_out():
    with pytest.raises(EdgeRuntimeError, match=r"target 'orin-nano' uses the tensorrt backend: .*--target auto"):
        runtime_profile(load_target("orin-nano"), auto_detected=False)


def test_an_auto_detected_orin_without_tensorrt_runs_on_onnxruntime_cpu():
    orin = load_target("orin-nano")
    with pytest.warns(TensorRTFallbackWarning, match="running its trt bundle on ONNX Runtime CPU"):
        profile = runtime_profile(orin, auto_detected=True)
    assert (profile.backend.name, profile.backend.providers, profile.backend.tensorrt) == ("onnxruntime", (CPU,), None)
    assert (profile.graph_flavor, profile.kv_cache, profile.backend.threads) == ("trt", orin.kv_cache, 6)
    x86 = load_target("x86")
    assert runtime_profile(x86, auto_detected=True) is x86


def test_edge_run_on_an_auto_detected_orin_generates_on_cpu(tied_bundle, monkeypatch):
    """The device path end to end: detection says Orin Nano, TensorRT is absent, edge-run still answers."""
    import edge_runtime.targets.choose as choose

    orin = Detection(load_target("orin-nano"), "detected")
    monkeypatch.setattr(choose, "resolve_target", lambda spec, root=None: orin)
    with pytest.warns(TensorRTFallbackWarning, match="orin-nano"):
        r = CliRunner().invoke(run_cli, ["--bundle", str(tied_bundle), "--target", "auto", "--max-tokens", "4"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip()
