"""What a report or field-log record says about where it was measured: device, software, bundle identity."""

from __future__ import annotations

import hashlib
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from edge_runtime import __version__
from edge_runtime.cpuinfo import cpu_features, cpu_model, read_file
from edge_runtime.manifest import Manifest


def cpu_line(root: Path | str = "/") -> str:
    """One line for a timing table's header: the CPU, its kernel-relevant flags and the edge kernels that run."""
    from edge_runtime import kernels

    flags = ", ".join(cpu_features(root)) or "flags unknown"
    return f"{cpu_model(root, default='unknown CPU')} ({flags}; edge kernels {kernels.isa() or 'not available'})"


def device_name(root: Path | str = "/") -> str:
    """The board's device-tree model (Jetson, Pi), else DMI product and CPU model (x86), else the machine type."""
    root = Path(root)
    model = read_file(root / "proc/device-tree/model")
    if model:
        return model
    cpu = cpu_model(root, default="")
    product = read_file(root / "sys/class/dmi/id/product_name")
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
