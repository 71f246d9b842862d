"""The TensorRT backend's availability: what a `tensorrt` target needs here, and what to install.

The backend itself: trt_engine.py (engine build and cache), trt_backend.py (execution), cuda_buffers.py
(device memory). It runs where tensorrt and cuda-python import and a CUDA device answers; elsewhere a
`tensorrt` profile runs its `trt` bundle on ONNX Runtime CPU where the target was auto-detected
(`runtime_profile`), and is refused with the reason where it was named. Not verified on a GPU.

The CUDA binding is NVIDIA's cuda-python, not pycuda: it ships wheels for x86-64 and aarch64 (Jetson), so
nothing compiles against the CUDA headers on the device, and it is the binding TensorRT's own samples use.
"""

from __future__ import annotations

import importlib.util
import platform
import warnings
from dataclasses import replace
from typing import TYPE_CHECKING

from edge_runtime.errors import EdgeRuntimeError

if TYPE_CHECKING:
    from edge_runtime.targets import TargetProfile


class TensorRTFallbackWarning(RuntimeWarning):
    """An auto-detected TensorRT target runs on ONNX Runtime CPU instead."""


def install_hint(machine: str | None = None) -> str:
    machine = machine or platform.machine()
    if machine in ("aarch64", "arm64"):
        return "on a Jetson: JetPack 6's TensorRT bindings (apt install python3-libnvinfer), pip install cuda-python"
    return "pip install 'edge-runtime[trt]' (tensorrt and cuda-python)"


def unavailable_reason(machine: str | None = None) -> str | None:
    """Why a `tensorrt` target cannot run on its GPU here (a package missing, no CUDA device); None if it can."""
    missing = [name for name, module in (("tensorrt", "tensorrt"), ("cuda-python", "cuda")) if not _importable(module)]
    if missing:
        return f"{' and '.join(missing)} not installed ({install_hint(machine)})"
    return _device_reason()


def _device_reason() -> str | None:
    from .cuda_buffers import no_device_reason

    return no_device_reason()


def runtime_profile(profile: TargetProfile, *, auto_detected: bool) -> TargetProfile:
    """The profile to run with: itself for ONNX Runtime targets and for `tensorrt` ones where TensorRT runs
    here; otherwise, where the target was auto-detected, the same profile on ONNX Runtime CPU (its `trt`
    bundle runs there) with a warning, and where it was named, a one-line error with the reason and the way out."""
    if profile.backend.name == "onnxruntime":
        return profile
    reason = unavailable_reason()
    if reason is None:
        return profile
    if not auto_detected:
        raise EdgeRuntimeError(
            f"target '{profile.name}' uses the {profile.backend.name} backend: {reason}; its trt-flavor bundles run "
            "on ONNX Runtime CPU with --target auto (on the device) or --target x86"
        )
    warnings.warn(
        f"target '{profile.name}' uses TensorRT: {reason}; running its trt bundle on ONNX Runtime CPU",
        TensorRTFallbackWarning,
        stacklevel=2,
    )
    backend = replace(profile.backend, name="onnxruntime", providers=("CPUExecutionProvider",), tensorrt=None)
    return replace(profile, backend=backend)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
