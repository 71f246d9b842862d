"""Which ONNX Runtime execution providers a session gets: the target profile's, where this onnxruntime has them.

A profile names providers for its board (`backend.providers`, e.g. CUDA then CPU on a GPU machine). The
installed onnxruntime decides what exists: the PyPI wheel has CPU only, onnxruntime-gpu adds CUDA and
TensorRT. A missing provider is a one-line warning naming it and what was used instead, never a failure:
a profile written for a bigger machine must still run. CPU always comes last, for the ops no other
provider takes (edge-runtime's own kernels are CPU ops).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import onnxruntime as ort

CPU = "CPUExecutionProvider"


class ProviderFallbackWarning(RuntimeWarning):
    """A profile's execution provider is not in this onnxruntime build; the session runs without it."""


def session_providers(requested: Sequence[str] | None, available: Sequence[str] | None = None) -> list[str]:
    """`requested` (None: CPU only) filtered to `available` (default: this onnxruntime's), order kept, CPU last."""
    have = list(ort.get_available_providers() if available is None else available)
    wanted = list(requested or [CPU])
    missing = [p for p in wanted if p not in have]
    chosen = [p for p in wanted if p in have and p != CPU] + [CPU]
    if missing:
        warnings.warn(
            f"this onnxruntime ({ort.__version__}) has no {', '.join(missing)} (it has {', '.join(have)}); "
            f"running on {', '.join(chosen)}. For the GPU: pip install onnxruntime-gpu on x86, the JetPack build "
            "of onnxruntime on a Jetson",
            ProviderFallbackWarning,
            stacklevel=3,
        )
    return chosen
