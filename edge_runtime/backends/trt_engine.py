"""TensorRT engines for `trt` bundles: the build (on the device) and the engine cache beside the bundle.

An engine is specific to the TensorRT version and the GPU it was built on, so it is built where it runs, on
first use (`edge-run`) or ahead of it (`edge-export --target orin-... --build-engine`), and cached under the
bundle's `trt-engines/` (or, where the bundle is read-only, the user cache) keyed by TensorRT version, GPU
compute capability, bundle checksum and `EngineProfile`. Everything but `build_engine` is plain Python and
tested without a GPU.

The build: TensorRT's ONNX parser on the bundle's model.onnx (its weights in model.onnx.data, found beside
it), the profile's precision flags (FP16 for the fp16 activations; the weight precision is what the
graph's DequantizeLinear nodes hold: INT4 blocks or INT8 channels, weight-only), two optimization profiles
(0: the decode step, 1 token; 1: a prefill chunk of 1 .. capacity tokens, tuned for slack + 1, the size of
every chunk past the ring's capacity) over the ring's fixed capacity, and a timing cache per TensorRT
version and GPU so later builds skip the kernel timing.

Not verified on a GPU: no engine has been built by this code yet (scripts/gpu_check.py builds one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_runtime.errors import EdgeRuntimeError

CACHE_FORMAT = 1  # bump when what goes into an engine changes without the key showing it
CACHE_DIR = "trt-engines"
# profile `precision` names -> tensorrt.BuilderFlag members. INT4 is TensorRT's flag for INT4 plugin I/O:
# weight-only INT4 needs no flag, the DequantizeLinear's INT4 constant says it.
BUILDER_FLAGS = {"fp16": "FP16", "bf16": "BF16", "tf32": "TF32", "int8": "INT8", "int4": "INT4", "fp8": "FP8"}
DECODE, PREFILL = 0, 1  # optimization profile indices
# Inputs whose values (not only shapes) set output shapes: TensorRT wants them in host memory, with value ranges.
SHAPE_INPUTS = ("num_logits_to_keep",)

Progress = Callable[[str], None]


class EngineBuildError(EdgeRuntimeError):
    """TensorRT could not parse or build the bundle's graph."""


@dataclass(frozen=True)
class EngineProfile:
    """What an engine is built for beyond the bundle: the ring's capacity (fixed), the prefill chunk range, and
    the builder options of the target profile (backend.tensorrt)."""

    capacity: int
    chunk_min: int
    chunk_opt: int
    chunk_max: int
    precision: tuple[str, ...]
    workspace_bytes: int
    optimization_level: int
    local_capacity: int | None = None  # the local layers' ring (e.g. Gemma 3), fixed too

    @classmethod
    def for_ring(cls, capacity: int, slack: int, options: Any, local_capacity: int | None = None) -> EngineProfile:
        """`options`: the target's TensorRTOptions. A first chunk may fill the whole ring (the smaller ring,
        with local layers); every chunk past capacity is slack + 1 tokens (RingGeometry.max_chunk), the
        common case tuned for."""
        most = capacity if local_capacity is None else min(capacity, local_capacity)
        return cls(
            capacity=capacity,
            chunk_min=1,
            chunk_opt=max(1, min(slack + 1, most)),
            chunk_max=most,
            precision=tuple(options.precision),
            workspace_bytes=int(options.workspace_bytes),
            optimization_level=int(options.optimization_level),
            local_capacity=local_capacity,
        )


def resolve_dims(shape: list[Any], tokens: int, capacity: int, local_capacity: int | None = None) -> tuple[int, ...]:
    """A manifest shape with its symbolic dims (`tokens`, `capacity`, `capacity_plus_tokens`, and with
    local layers `capacity_local`, `capacity_local_plus_tokens`) filled in."""
    names = {"tokens": tokens, "capacity": capacity, "capacity_plus_tokens": capacity + tokens}
    if local_capacity is not None:
        names |= {"capacity_local": local_capacity, "capacity_local_plus_tokens": local_capacity + tokens}
    out = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
        elif d in names:
            out.append(names[d])
        else:
            raise EngineBuildError(
                f"graph input dimension {d!r} is not one the TensorRT build knows ({', '.join(names)})"
            )
    return tuple(out)


def optimization_profiles(inputs: dict[str, Any], p: EngineProfile) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
    """Per optimization profile (DECODE, PREFILL), each input's (min, opt, max): its shape for shape inputs'
    neighbours, its value range for SHAPE_INPUTS."""
    ranges = {DECODE: (1, 1, 1), PREFILL: (p.chunk_min, p.chunk_opt, p.chunk_max)}
    profiles = []
    for index in (DECODE, PREFILL):
        t = ranges[index]
        shapes: dict[str, tuple[tuple[int, ...], ...]] = {}
        for name, spec in inputs.items():
            if name in SHAPE_INPUTS:  # rows of logits kept: 1 in decode, up to the whole chunk in prefill
                shapes[name] = ((1,), (1,), (t[2],))
            else:
                shapes[name] = tuple(resolve_dims(spec["shape"], n, p.capacity, p.local_capacity) for n in t)
        profiles.append(shapes)
    return profiles


def builder_flags(precision: tuple[str, ...], weight_types: set[str]) -> list[str]:
    """BuilderFlag names: the profile's precisions, plus INT8 where the graph dequantizes INT8 weights (Q/DQ
    layers in a weakly typed network run in INT8 only with the flag)."""
    bad = [p for p in precision if p not in BUILDER_FLAGS]
    if bad:
        raise EngineBuildError(f"TensorRT precision {bad[0]!r} is not one of {', '.join(BUILDER_FLAGS)}")
    names = [BUILDER_FLAGS[p] for p in precision]
    if "int8" in weight_types and "INT8" not in names:
        names.append("INT8")
    return names


def graph_weight_types(onnx_path: Path) -> set[str]:
    """Element types of the constants the graph's DequantizeLinear nodes read ("int4", "int8"): the weight-only
    precision as the bundle's Q/DQ express it. Reads the graph only, not its external weights."""
    from edge_runtime.onnx_graph import INT4, INT8, UINT8, read_graph

    graph = read_graph(onnx_path)
    types = graph.initializer_types
    names = {INT4: "int4", INT8: "int8", UINT8: "uint8"}
    return {
        names.get(types[n.inputs[0]], "other")
        for n in graph.nodes
        if n.op_type == "DequantizeLinear" and n.inputs and n.inputs[0] in types
    }


def parser_errors(parser: Any, onnx_path: Path, version: str) -> str:
    """TensorRT's parser errors, each naming the node and its op (TensorRT 10's ParserError.node_name/operator)."""
    lines = []
    for i in range(parser.num_errors):
        e = parser.get_error(i)
        node, op = e.node_name() or f"#{e.node()}", e.node_operator() or "?"
        lines.append(f"node '{node}' (op {op}): {e.desc()}")
    shown = "; ".join(lines[:5]) + (f"; and {len(lines) - 5} more" if len(lines) > 5 else "")
    return f"TensorRT {version}'s ONNX parser cannot read '{onnx_path}': {shown or 'no error reported'}"


# ---------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------


def cache_fields(tensorrt_version: str, capability: tuple[int, int], bundle: str, profile: EngineProfile) -> dict:
    """What an engine depends on, as recorded beside it: change any and it is another engine."""
    return {
        "format": CACHE_FORMAT,
        "tensorrt": tensorrt_version,
        "compute_capability": f"{capability[0]}.{capability[1]}",
        "bundle": bundle,
        "profile": _profile_fields(profile),
    }


def _profile_fields(profile: EngineProfile) -> dict:
    fields = dataclasses.asdict(profile) | {"precision": list(profile.precision)}
    if profile.local_capacity is None:  # keys of engines without local layers stay those built before it existed
        del fields["local_capacity"]
    return fields


def cache_key(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:24]


def engine_cache_dir(bundle_dir: Path, bundle: str) -> Path:
    """`trt-engines/` in the bundle where it may be written, else under the user cache by bundle checksum."""
    beside = Path(bundle_dir) / CACHE_DIR
    if os.access(beside if beside.is_dir() else bundle_dir, os.W_OK):
        return beside
    from edge_runtime.cachedir import cache_dir

    return cache_dir() / CACHE_DIR / bundle[:16]


class EngineCache:
    """`<key>.engine` (the serialized plan) and `<key>.json` (its fields and the plan's sha256) in `root`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, fields: dict) -> Path:
        return self.root / f"{cache_key(fields)}.engine"

    def lookup(self, fields: dict) -> Path | None:
        """The cached engine for `fields`, or None; an entry whose record or bytes do not match is removed."""
        plan = self.path(fields)
        record = _read_record(plan.with_suffix(".json"))
        if not plan.is_file() or record is None:
            return None
        if record.get("fields") != fields or record.get("sha256") != _sha256(plan):
            self._remove(plan)  # a torn write or an edited file: rebuilt, never loaded
            return None
        return plan

    def store(self, fields: dict, plan: bytes, seconds: float) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(fields)
        _write_atomic(path, plan)
        record = {"fields": fields, "sha256": hashlib.sha256(plan).hexdigest(), "build_seconds": round(seconds, 1)}
        _write_atomic(path.with_suffix(".json"), json.dumps(record, indent=2).encode())
        return path

    def invalidate(self, fields: dict) -> list[Path]:
        """Remove engines that can never load again: those of another bundle checksum (the bundle was
        re-exported) and, for this GPU, those of another TensorRT version (it was upgraded). Engines for
        other GPUs stay (a bundle on shared storage serves several devices)."""
        removed = []
        for record_path in sorted(self.root.glob("*.json")) if self.root.is_dir() else []:
            record = _read_record(record_path)
            f = (record or {}).get("fields") or {}
            stale = (
                record is None
                or f.get("format") != CACHE_FORMAT
                or f.get("bundle") != fields["bundle"]
                or (
                    f.get("compute_capability") == fields["compute_capability"]
                    and f.get("tensorrt") != fields["tensorrt"]
                )
            )
            if stale:
                self._remove(record_path.with_suffix(".engine"))
                removed.append(record_path.with_suffix(".engine"))
        return removed

    def timing_cache_path(self, tensorrt_version: str, capability: tuple[int, int]) -> Path:
        return self.root / f"timing-{tensorrt_version}-sm{capability[0]}{capability[1]}.cache"

    @staticmethod
    def _remove(plan: Path) -> None:
        for p in (plan, plan.with_suffix(".json")):
            p.unlink(missing_ok=True)


def _read_record(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stderr_progress(msg: str) -> None:
    print(f"tensorrt: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Build (needs tensorrt and a GPU)
# ---------------------------------------------------------------------------------------------


def ensure_engine(
    bundle_dir: Path, manifest: Any, profile: EngineProfile, progress: Progress = stderr_progress
) -> Path:
    """The engine for this bundle, profile, TensorRT and GPU: from the cache, else built (minutes on an Orin)."""
    import tensorrt as trt

    from edge_runtime.snapshot import bundle_checksum

    from .cuda_buffers import compute_capability

    checksum, capability = bundle_checksum(manifest), compute_capability()
    fields = cache_fields(trt.__version__, capability, checksum, profile)
    cache = EngineCache(engine_cache_dir(bundle_dir, checksum))
    for old in cache.invalidate(fields):
        progress(f"removed stale engine {old.name}")
    hit = cache.lookup(fields)
    if hit is not None:
        return hit
    progress(f"building the engine for sm{capability[0]}{capability[1]}, TensorRT {trt.__version__} (once per GPU)")
    t0 = time.perf_counter()
    plan = build_engine(
        Path(bundle_dir) / manifest.graph.file,
        manifest.graph.inputs,
        profile,
        timing_cache=cache.timing_cache_path(trt.__version__, capability),
        progress=progress,
    )
    path = cache.store(fields, plan, time.perf_counter() - t0)
    progress(f"engine built in {time.perf_counter() - t0:.0f}s: {path} ({len(plan) / 2**20:.1f} MiB)")
    return path


def engine_for_target(bundle_dir: Path, target: Any, progress: Progress = stderr_progress) -> Path:
    """The engine `edge-run --bundle B --target T` loads (its ring as load_options.apply_target sets it), built now
    (`edge-export --build-engine`)."""
    from edge_runtime.bundle import open_bundle
    from edge_runtime.load_options import LoadOptions, apply_target
    from edge_runtime.ring import RingGeometry, local_geometry

    bundle = open_bundle(bundle_dir)
    opts = apply_target(LoadOptions(), target, bundle)
    sinks = bundle.manifest.cache.sinks if opts.sinks is None else opts.sinks
    window = bundle.manifest.cache.window if opts.window is None else opts.window
    ring = RingGeometry(sinks, window, bundle.manifest.cache.slack)
    m = bundle.manifest  # local layers as Engine finds them (engine._local_layers refuses a mismatch)
    local = None
    if m.model.local_window is not None and m.graph.local_cache_layers:
        local = local_geometry(ring, m.model.local_window).capacity
    profile = EngineProfile.for_ring(ring.capacity, ring.slack, target.backend.tensorrt, local)
    return ensure_engine(bundle.path, bundle.manifest, profile, progress)


def build_engine(
    onnx_path: Path, inputs: dict[str, Any], profile: EngineProfile, *, timing_cache: Path, progress: Progress
) -> bytes:
    """Parse the graph (with its external weights) and build a serialized engine."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # resolves model.onnx.data relative to the file
        raise EngineBuildError(parser_errors(parser, onnx_path, trt.__version__))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, profile.workspace_bytes)
    config.builder_optimization_level = profile.optimization_level
    for flag in builder_flags(profile.precision, graph_weight_types(onnx_path)):
        config.set_flag(getattr(trt.BuilderFlag, flag))
    for shapes in optimization_profiles(inputs, profile):
        p = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            t = network.get_input(i)
            if t.name not in shapes:
                raise EngineBuildError(f"graph input '{t.name}' is not in the bundle manifest's inputs")
            if t.is_shape_tensor:
                p.set_shape_input(t.name, *shapes[t.name])
            else:
                p.set_shape(t.name, *shapes[t.name])
        config.add_optimization_profile(p)
    cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=True)  # a cache from another build is skipped, not fatal
    config.progress_monitor = _monitor(trt, progress)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineBuildError(
            f"TensorRT {trt.__version__} could not build an engine from '{onnx_path}' (its log above says why)"
        )
    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(timing_cache, bytes(config.get_timing_cache().serialize()))
    return bytes(plan)


def _monitor(trt: Any, progress: Progress) -> Any:
    """A tensorrt.IProgressMonitor reporting the builder's top-level phases (the nested ones are many)."""

    class Monitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.started: dict[str, float] = {}

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            if parent_phase is None:
                self.started[phase_name] = time.perf_counter()
                progress(f"{phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name: str, step: int) -> bool:
            return True  # never cancels

        def phase_finish(self, phase_name: str) -> None:
            if phase_name in self.started:
                progress(f"{phase_name} done in {time.perf_counter() - self.started.pop(phase_name):.1f}s")

    return Monitor()
