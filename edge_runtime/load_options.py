"""How a bundle is loaded: `LoadOptions`, and `apply_target`, which fills them in from a target profile.

Below the engine and the backends both: a backend that builds for a target (backends/trt_engine.py) sizes the
ring as a load would, without importing the engine that loads it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from .bundle import Bundle, VerifyMode
    from .targets import TargetProfile
    from .targets.schema import TensorRTOptions


@dataclass(frozen=True)
class LoadOptions:
    sinks: int | None = None  # None: the bundle's default
    window: int | None = None
    slack: int | None = None  # None: the bundle's; ring rows beyond the window (prefill chunk, rollback depth)
    threads: int | None = None  # None: ONNX Runtime's default (all cores)
    memory_budget: int | None = None  # bytes; None: no check
    position_offset: int = 0  # absolute position of the first token (tests emulate long streams)
    verify: bool | VerifyMode = True  # True: "sampled" (bundle.py); "full" hashes every byte; False: "off"
    profile: Path | None = None  # ONNX Runtime per-node profile: JSON file prefix (written by end_profiling)
    # False: the compute threads sleep between calls instead of spinning. Two engines taking turns in one
    # process (a speculative draft and its target) must not spin: each one's idle threads would hold the
    # cores the other is running on.
    spin: bool = True
    # ONNX Runtime execution providers in priority order (a target profile's backend.providers); None: CPU.
    providers: tuple[str, ...] | None = None
    # A `tensorrt` target's builder options (targets.schema.TensorRTOptions): run on TensorRT (backends/
    # trt_backend.py, the engine built on first use); None: ONNX Runtime. Not verified on a GPU.
    tensorrt: TensorRTOptions | None = None
    cuda_graph: bool = False  # TensorRT only: replay the decode step as a captured CUDA graph
    # KV caches preallocated beside the model (engine.Model.caches): one per stream that lives at once (edge-serve's
    # slots); the memory budget counts them all.
    caches: int = 1


def apply_target(opts: LoadOptions, profile: TargetProfile, bundle: Bundle) -> LoadOptions:
    """Fill what `opts` leaves open from a target profile: threads, memory budget and cache geometry.
    The profile's window is clamped to the model's trained context; an explicit one is not."""
    sinks, window = opts.sinks, opts.window
    if sinks is None and window is None:
        sinks = profile.kv_cache.sinks
        window = min(profile.kv_cache.window, bundle.manifest.model.max_position_embeddings - sinks)
    return replace(
        opts,
        sinks=sinks,
        window=window,
        threads=opts.threads or profile.backend.threads or None,
        memory_budget=opts.memory_budget if opts.memory_budget is not None else profile.memory_budget_bytes,
        providers=opts.providers or profile.backend.providers or None,
        tensorrt=opts.tensorrt or (profile.backend.tensorrt if profile.backend.name == "tensorrt" else None),
    )
