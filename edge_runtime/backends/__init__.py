"""Execution backends. Each runs one graph call over the static pool; only ONNX Runtime exists today
(on the providers the target profile names: providers.py). TensorRT's availability and the fallback of a
`tensorrt` target: tensorrt.py.

The engine talks to a `Backend`; the ring, the pool and the sampling never see which one runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from edge_runtime.pool import StaticPool
    from edge_runtime.ring import StepInputs


class Backend(Protocol):
    """One compiled graph over one cache's static pool (edge_runtime.pool.StaticPool), bound once."""

    providers: list[str]  # what it runs on, for reports (ONNX Runtime execution providers)

    def run_decode(self, row: int) -> None:
        """One token, inputs already in the pool's decode buffers; logits (or next_token) into the pool."""
        ...

    def run_chunk(self, ids: np.ndarray, plan: StepInputs, keep: int) -> np.ndarray:
        """A chunk of tokens with its planned inputs; the last `keep` rows' logits."""
        ...

    def bind(self, pool: StaticPool) -> Backend:
        """The same compiled graph over another cache's pool (engine.Model's caches): weights shared, bindings
        and any device ring of its own."""
        ...

    def kernel_ops(self) -> set[str]:
        """edge-runtime's own ops the graph runs (kernels.DOMAIN)."""
        ...

    def end_profiling(self) -> Path | None: ...

    def kv_to_host(self) -> None:
        """Make the pool's K/V arrays hold the cache (a device backend copies its ring back; snapshots)."""
        ...

    def kv_from_host(self) -> None:
        """Make the cache hold the pool's K/V arrays (after a snapshot was restored into them)."""
        ...
