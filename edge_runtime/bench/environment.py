"""What a report or field-log record says about where it was measured: device, software, bundle identity."""

from __future__ import annotations

import hashlib
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from edge_runtime import __version__
from edge_runtime.manifest import Manifest


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace").strip("\x00\n ")
    except OSError:
        return ""


def cpu_model(root: Path | str = "/", default: str | None = None) -> str:
    """/proc/cpuinfo's `model name` (what every benchmark figure is recorded with), else `default`, else the
    platform's processor or machine type."""
    for line in _read(Path(root) / "proc/cpuinfo").splitlines():
        if line.partition(":")[0].strip() == "model name":
            return line.partition(":")[2].strip()
    return default if default is not None else (platform.processor() or platform.machine() or "unknown")


# /proc/cpuinfo flags that decide which kernels run and how fast (x86 `flags`, ARM `Features`), in the
# names reports use: every speed figure names them, since the CPU changes between machines and sessions.
_FEATURES = {
    "avx2": "AVX2",
    "fma": "FMA",
    "f16c": "F16C",
    "avx512f": "AVX-512F",
    "avx512_vnni": "AVX-512 VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "AVX-512 BF16",
    "amx_int8": "AMX-INT8",
    "amx_bf16": "AMX-BF16",
    "asimd": "NEON",
    "asimddp": "NEON dot product",
    "i8mm": "I8MM",
    "sve": "SVE",
}


def cpu_features(root: Path | str = "/") -> list[str]:
    """The kernel-relevant features of the first CPU in /proc/cpuinfo, in _FEATURES' order ([] if unknown)."""
    for line in _read(Path(root) / "proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            have = set(value.split())
            return [name for flag, name in _FEATURES.items() if flag in have]
    return []


def cpu_line(root: Path | str = "/") -> str:
    """One line for a timing table's header: the CPU, its kernel-relevant flags and the edge kernels that run."""
    from edge_runtime import kernels

    flags = ", ".join(cpu_features(root)) or "flags unknown"
    return f"{cpu_model(root, default='unknown CPU')} ({flags}; edge kernels {kernels.isa() or 'not available'})"


def device_name(root: Path | str = "/") -> str:
    """The board's device-tree model (Jetson, Pi), else DMI product and CPU model (x86), else the machine type."""
    root = Path(root)
    model = _read(root / "proc/device-tree/model")
    if model:
        return model
    cpu = cpu_model(root, default="")
    product = _read(root / "sys/class/dmi/id/product_name")
    parts = [p for p in (product, cpu) if p]
    return " / ".join(parts) if parts else platform.machine() or "unknown"


def bundle_sha256(manifest: Manifest) -> str:
    """One digest for a bundle: sha256 of its manifest's file list in `sha256sum` format, sorted by name.

    Built from the checksums the manifest already holds, so identifying a bundle reads no weights.
    """
    listing = "".join(f"{manifest.files[name]}  {name}\n" for name in sorted(manifest.files))
    return hashlib.sha256(listing.encode()).hexdigest()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment(root: Path | str = "/") -> dict[str, Any]:
    from edge_runtime import kernels

    return {
        "device": device_name(root),
        "cpu": cpu_model(root),
        "cpu_features": cpu_features(root),
        "machine": platform.machine(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "edge_runtime": __version__,
        "onnxruntime": _version("onnxruntime"),
        "edge_kernels": kernels.isa(),  # MatMulQ4's implementation here; None where the ops cannot run
    }


def bundle_info(bundle_dir: Path, manifest: Manifest) -> dict[str, Any]:
    m = manifest
    return {
        "path": str(bundle_dir),
        "sha256": bundle_sha256(m),
        "model": f"{m.model.source_model_type} -> {m.model.arch}",
        "parameters": m.model.parameters,
        "flavor": m.graph.flavor,
        "weight_dtype": m.graph.weight_dtype,
        "quantization": m.quantization.get("method"),
        "weight_bytes_per_token": m.graph.weight_bytes,
    }
