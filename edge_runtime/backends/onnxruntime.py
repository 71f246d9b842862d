"""ONNX Runtime backend: one InferenceSession, IOBinding over the static pool.

Decode binds every buffer once (`_decode_binding`) and then only the arrays' contents change; each
layer's K/V OrtValue is bound as both `past_*` input and `present_*` output, so the `ort` graph's
GroupQueryAttention (until the ring is full) or TensorScatter (after), or with --kernel edge
LinearAttention and then RingAttention, writes the new row in place, no cache copy. Host-copy (`trt`)
bundles bind the new rows to small pool buffers and the caller copies them into their slots.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edge_runtime import kernels
from edge_runtime.errors import BundleError, EdgeRuntimeError
from edge_runtime.manifest import NEXT_TOKEN, ROW_CACHE, KvUpdate, Manifest
from edge_runtime.pool import BatchBuffers, StaticPool
from edge_runtime.ring import ONE_CACHE, StepInputs

from .providers import session_providers

_ov = ort.OrtValue.ortvalue_from_numpy  # shares memory with the numpy array on CPU

# Nothing of ours phones home or leaves traces on a device. ORT_DISABLE_TELEMETRY (set by
# edge_runtime/__init__.py before onnxruntime loads) keeps the telemetry client from starting; this
# covers a process that imported onnxruntime before edge_runtime.
ort.disable_telemetry_events()


class ThreadsClampedWarning(RuntimeWarning):
    """More compute threads were asked for than this process may run on; the CPU count was used."""


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, e.g. under taskset/cgroups)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def bounded_threads(threads: int | None) -> int | None:
    """`threads` for ONNX Runtime's intra-op pool, at most the usable CPUs; None or 0: its default.

    Clamped with a warning rather than refused: target profiles name their board's core count, and
    running one on a smaller machine should still work. Unbounded, ONNX Runtime tries to start every
    thread (--threads 100000 spent minutes in session creation, deaf to Ctrl-C).
    """
    if not threads:
        return None
    if threads < 0:
        raise EdgeRuntimeError(f"threads must be 1 or more (0 or none: one per core), got {threads}")
    cpus = usable_cpus()
    if threads > cpus:
        warnings.warn(
            f"{threads} threads asked for but this process may run on {cpus} CPUs; using {cpus}",
            ThreadsClampedWarning,
            stacklevel=3,
        )
        return cpus
    return threads


class OrtBackend:
    def __init__(
        self,
        graph: Path,
        manifest: Manifest,
        pool: StaticPool,
        *,
        threads: int | None = None,
        log_severity: int = 3,
        profile: Path | None = None,
        spin: bool = True,
        providers: tuple[str, ...] | None = None,
    ):
        """`providers`: ONNX Runtime execution providers in priority order (the target profile's; None: CPU),
        those this onnxruntime lacks dropped with a ProviderFallbackWarning."""
        so = ort.SessionOptions()
        if not spin:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = log_severity
        threads = bounded_threads(threads)
        if threads:
            so.intra_op_num_threads = threads
        if profile is not None:  # per-node timings, for scripts/profile_ops.py
            so.enable_profiling = True
            so.profile_file_prefix = str(profile)
        kernels.register(so)
        try:
            self.providers = session_providers(providers)
            self.session = ort.InferenceSession(str(graph), so, providers=self.providers)
        except Exception as e:  # onnxruntime raises its own exception types for unreadable graphs
            if any(op in str(e) for op in kernels.OPS) and not kernels.available():
                raise BundleError(
                    f"'{graph}' was exported with --kernel edge, whose ops cannot run here: "
                    f"{kernels.unavailable_reason()}; re-export it with --kernel mlas"
                ) from e
            raise BundleError(f"ONNX Runtime cannot load '{graph}': {e}") from e
        self.graph_file = graph
        self.inputs = {i.name for i in self.session.get_inputs()}  # graphs take different subsets of the feeds
        self.layers = manifest.model.num_layers
        self.host_copy = manifest.graph.kv_update is KvUpdate.HOST_COPY
        self._attach(pool)

    def _attach(self, pool: StaticPool) -> None:
        self.pool = pool
        # OrtValues wrapping pool arrays: created once, kept alive as long as the bindings.
        self._kv = [(_ov(k), _ov(v)) for k, v in zip(pool.keys, pool.values, strict=True)]
        self._decode_binding = self._bind_decode()
        self._chunk_io: ort.IOBinding | None = None

    def bind(self, pool: StaticPool) -> OrtBackend:
        """The same graph over another cache's pool: one InferenceSession (weights loaded once), bindings of its
        own. Runs share the session's thread pool, one at a time (ONNX Runtime's Run is thread-safe, but the
        caches are driven from one thread)."""
        other = object.__new__(OrtBackend)
        other.providers, other.session, other.graph_file = self.providers, self.session, self.graph_file
        other.inputs, other.layers, other.host_copy = self.inputs, self.layers, self.host_copy
        other._attach(pool)
        return other

    def kernel_ops(self) -> set[str]:
        """The edge-runtime ops (kernels.DOMAIN) the graph runs, subgraphs included."""
        from edge_runtime.onnx_graph import graph_ops, read_graph

        return {op for domain, op in graph_ops(read_graph(self.graph_file)) if domain == kernels.DOMAIN}

    def _bind_kv(self, io: ort.IOBinding, kv: list[tuple[ort.OrtValue, ort.OrtValue]]) -> None:
        for i, (k, v) in enumerate(kv):
            io.bind_ortvalue_input(f"past_key.{i}", k)
            io.bind_ortvalue_input(f"past_value.{i}", v)
            if not self.host_copy:
                io.bind_ortvalue_output(f"present_key.{i}", k)
                io.bind_ortvalue_output(f"present_value.{i}", v)

    def _bind_decode(self) -> ort.IOBinding:
        p, d = self.pool, self.pool.decode
        io = self.session.io_binding()
        self._decode_values = {
            "input_ids": _ov(p.input_ids),
            "cos": _ov(d.cos),
            "sin": _ov(d.sin),
            "cos_sink": _ov(d.cos_sink),
            "sin_sink": _ov(d.sin_sink),
            "attn_mask": _ov(d.attn_mask),
            "sink_mask": _ov(d.sink_mask),
            "sink_rows": _ov(d.sink_rows),
            "ring_full": _ov(d.ring_full),
            "seqlens_k": _ov(d.seqlens_k),
            "total_sequence_length": _ov(d.total_len),
            "cos_cache": _ov(d.cos_cache),
            "sin_cache": _ov(d.sin_cache),
            "num_logits_to_keep": _ov(p.keep),
            "write_index": _ov(d.write_index),
            ROW_CACHE: _ov(ONE_CACHE),
        }
        if d.local is not None:  # the local layers' ring (e.g. Gemma 3)
            self._decode_values |= {
                "cos_local": _ov(d.local.cos),
                "sin_local": _ov(d.local.sin),
                "attn_mask_local": _ov(d.local.attn_mask),
                "write_index_local": _ov(d.local.write_index),
            }
        for name, value in self._decode_values.items():
            if name in self.inputs:
                io.bind_ortvalue_input(name, value)
        self._bind_kv(io, self._kv)
        self._logits = _ov(p.logits)
        io.bind_ortvalue_output("logits", self._logits)
        if p.next_token is not None:
            self._next_token = _ov(p.next_token)
            io.bind_ortvalue_output(NEXT_TOKEN, self._next_token)
        if self.host_copy:
            self._new = [(_ov(k), _ov(v)) for k, v in zip(p.new_keys, p.new_values, strict=True)]
            for i, (k, v) in enumerate(self._new):
                io.bind_ortvalue_output(f"new_key.{i}", k)
                io.bind_ortvalue_output(f"new_value.{i}", v)
        return io

    def kv_to_host(self) -> None:
        """Nothing to copy: the pool's K/V arrays are the bound cache."""

    def kv_from_host(self) -> None:
        """Nothing to copy: the pool's K/V arrays are the bound cache."""

    def end_profiling(self) -> Path | None:
        """Write the per-node profile (LoadOptions.profile) and return its path; None if not profiling."""
        return Path(self.session.end_profiling()) if self.session.get_session_options().enable_profiling else None

    def run_decode(self, row: int) -> None:
        """One token; inputs already written into the pool. Logits land in `pool.logits`."""
        self.session.run_with_iobinding(self._decode_binding)
        if self.host_copy:
            local = self.pool.decode.local
            local_row = row if local is None else int(local.write_index[0])
            for i in range(self.layers):
                r = local_row if i in self.pool.local_layers else row
                self.pool.keys[i][:, :, r] = self.pool.new_keys[i][:, :, 0]
                self.pool.values[i][:, :, r] = self.pool.new_values[i][:, :, 0]

    def batch(self, buffers: BatchBuffers, first: StaticPool) -> BatchRunner:
        """Decode steps over several caches at once (graphs that take manifest.ROW_CACHE), on `buffers`; `first`:
        a cache's pool, for the inputs only the else branch of ring_full reads (never taken: ring_full is True)."""
        return BatchRunner(self.session, self.inputs, buffers, first)

    def _chunk_binding(self) -> ort.IOBinding:
        """The binding chunks reuse: the K/V buffers and the rotary caches stay bound (rebinding the 4 x
        layers K/V names cost ~0.3 ms a call, a tenth of a 2-row verification on the 135M model); each
        call rebinds only its step inputs and outputs, whose shapes vary."""
        if self._chunk_io is None:
            io = self._chunk_io = self.session.io_binding()
            self._caches = {"cos_cache": _ov(self.pool.decode.cos_cache), "sin_cache": _ov(self.pool.decode.sin_cache)}
            for name, value in self._caches.items():
                if name in self.inputs:
                    io.bind_ortvalue_input(name, value)
            self._bind_kv(io, self._kv)
        return self._chunk_io

    def run_chunk(self, ids: np.ndarray, plan: StepInputs, keep: int) -> np.ndarray:
        """A prefill chunk of n tokens (shapes vary per chunk, so this binding is built per call).
        Returns the logits of the last `keep` tokens, [keep, V]."""
        n = ids.shape[0]
        io = self._chunk_binding()
        held = {name: _ov(np.ascontiguousarray(a)) for name, a in plan.feeds(ids, keep).items() if name in self.inputs}
        for name, value in held.items():
            io.bind_ortvalue_input(name, value)
        logits = np.empty((1, keep, self.pool.logits.shape[-1]), np.float32)
        io.bind_ortvalue_output("logits", _ov(logits))
        new = []
        if self.host_copy:
            for i, k in enumerate(self.pool.keys):
                shape = (1, k.shape[1], n, k.shape[3])
                pair = (np.empty(shape, k.dtype), np.empty(shape, k.dtype))
                io.bind_ortvalue_output(f"new_key.{i}", _ov(pair[0]))
                io.bind_ortvalue_output(f"new_value.{i}", _ov(pair[1]))
                new.append(pair)
        self.session.run_with_iobinding(io)
        row = int(plan.write_index[0])
        local_row = row if plan.write_index_local is None else int(plan.write_index_local[0])
        for i, (k, v) in enumerate(new):  # chunks never wrap, so the rows are contiguous
            if i in self.pool.local_layers:
                self.pool.keys[i][:, :, local_row : local_row + n] = k
                self.pool.values[i][:, :, local_row : local_row + n] = v
                continue
            self.pool.keys[i][:, :, row : row + n] = k
            self.pool.values[i][:, :, row : row + n] = v
        return logits[0]


class BatchRunner:
    """Runs decode steps over the first B rows of a BatchBuffers. A binding per B, made on first use and kept:
    each binds views of the buffers' first B rows, so a step rebinds nothing."""

    def __init__(self, session: ort.InferenceSession, inputs: set[str], buffers: BatchBuffers, first: StaticPool):
        self.session, self.inputs, self.buffers = session, inputs, buffers
        d = first.decode
        self._fixed = {  # read by LinearAttention only (the else branch), or constant
            "sink_rows": _ov(d.sink_rows),
            "ring_full": _ov(buffers.ring_full),
            "seqlens_k": _ov(np.zeros(1, np.int32)),
            "total_sequence_length": _ov(np.ones((), np.int32)),
            "cos_cache": _ov(d.cos_cache),
            "sin_cache": _ov(d.sin_cache),
            "num_logits_to_keep": _ov(buffers.keep),
        }
        self._kv = [(_ov(k), _ov(v)) for k, v in zip(buffers.keys, buffers.values, strict=True)]
        self._bindings: dict[int, tuple[ort.IOBinding, list[ort.OrtValue]]] = {}

    def _binding(self, rows: int) -> ort.IOBinding:
        if rows in self._bindings:
            return self._bindings[rows][0]
        b, io = self.buffers, self.session.io_binding()
        views = {
            "input_ids": b.input_ids[:, :rows],
            "cos": b.cos[:rows],
            "sin": b.sin[:rows],
            "cos_sink": b.cos_sink[:rows],
            "sin_sink": b.sin_sink[:rows],
            "attn_mask": b.attn_mask[:rows],
            "write_index": b.write_index[:rows],
            ROW_CACHE: b.row_cache[:rows],
        }
        if b.cos_local is not None and b.sin_local is not None:
            views |= {"cos_local": b.cos_local[:rows], "sin_local": b.sin_local[:rows]}
        if b.attn_mask_local is not None and b.write_index_local is not None:
            views |= {"attn_mask_local": b.attn_mask_local[:rows], "write_index_local": b.write_index_local[:rows]}
        held = [_ov(v) for v in views.values()]  # views of contiguous leading rows: the buffers' own memory
        for name, value in [*zip(views, held, strict=True), *self._fixed.items()]:
            if name in self.inputs:
                io.bind_ortvalue_input(name, value)
        for i, (k, v) in enumerate(self._kv):
            io.bind_ortvalue_input(f"past_key.{i}", k)
            io.bind_ortvalue_input(f"past_value.{i}", v)
            io.bind_ortvalue_output(f"present_key.{i}", k)
            io.bind_ortvalue_output(f"present_value.{i}", v)
        held.append(_ov(b.logits[:, :rows]))
        io.bind_ortvalue_output("logits", held[-1])
        if b.next_token is not None:
            held.append(_ov(b.next_token[:, :rows]))
            io.bind_ortvalue_output(NEXT_TOKEN, held[-1])
        self._bindings[rows] = (io, held)
        return io

    def run(self, rows: int) -> None:
        """One step over rows 0..rows-1 (their inputs written by BatchBuffers.set_row); logits land in
        buffers.logits[0, :rows]."""
        self.buffers.keep[0] = rows
        self.session.run_with_iobinding(self._binding(rows))
