"""TensorRT backend: a `trt` bundle's engine run on the GPU through cuda-python, behind the Backend protocol.

Allocated once, at load: the K/V ring of every layer on the device ([1, Hkv, capacity, D], never copied to the
host), device buffers for every step input and output at the largest chunk, pinned host staging for the
inputs (ids, rotary rows, masks) and for the logits. Two execution contexts, one per optimization profile
(trt_engine.DECODE: 1 token, shapes fixed at load; PREFILL: 1 .. capacity tokens), share those buffers on
one stream. After a call the graph's new rows are copied into their ring slots on the device
(cuda_buffers.RowCopy); the host reads back only the logits it needs.

`cuda_graph=True` captures the decode step (input copies, the engine's kernels, the logits copy) as one CUDA
graph after its first run and replays it: every address it touches is fixed. The ring-row copy stays
outside it (its destination row moves every step).

The host pool's K/V arrays are not kept in step with the device: `kv_to_host` / `kv_from_host` copy the whole
ring for callers that read or restore it (session snapshots; not wired yet).

Not verified on a GPU: this code has not run on one where it was written (scripts/gpu_check.py runs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.errors import BundleError, EdgeRuntimeError
from edge_runtime.manifest import Manifest
from edge_runtime.pool import StaticPool
from edge_runtime.ring import StepInputs

from .cuda_buffers import CudaGraph, DeviceBuffer, PinnedArray, RowCopy, Stream
from .trt_engine import DECODE, PREFILL, SHAPE_INPUTS, EngineProfile, ensure_engine, resolve_dims, stderr_progress


def open_trt_backend(
    bundle_dir: Path,
    manifest: Manifest,
    pool: StaticPool,
    capacity: int,
    slack: int,
    options: Any,
    *,
    local_capacity: int | None = None,
    cuda_graph: bool = False,
) -> TrtBackend:
    """The engine for this bundle and ring (built on first use, with progress on stderr) and its backend."""
    if manifest.graph.flavor != "trt":
        raise BundleError(
            f"'{bundle_dir}' is an {manifest.graph.flavor}-flavor bundle; TensorRT runs trt-flavor ones: "
            "re-export it with edge-export --target orin-..."
        )
    profile = EngineProfile.for_ring(capacity, slack, options, local_capacity)
    return TrtBackend(
        ensure_engine(bundle_dir, manifest, profile, stderr_progress), manifest, pool, cuda_graph=cuda_graph
    )


class TrtBackend:
    def __init__(
        self,
        engine_path: Path | None,
        manifest: Manifest,
        pool: StaticPool,
        *,
        cuda_graph: bool = False,
        shared: TrtBackend | None = None,
    ) -> None:
        """`shared`: a backend whose deserialized engine this one runs too (another cache of one model: `bind`),
        with device buffers, contexts and a stream of its own."""
        import tensorrt as trt

        self.trt, self.pool, self.manifest = trt, pool, manifest
        if shared is not None:
            self.logger, self.runtime, self.engine = shared.logger, shared.runtime, shared.engine
        else:
            self.logger = trt.Logger(trt.Logger.WARNING)
            self.runtime = trt.Runtime(self.logger)
            self.engine = self.runtime.deserialize_cuda_engine(Path(str(engine_path)).read_bytes())
        if self.engine is None:
            raise BundleError(f"TensorRT {trt.__version__} cannot load the engine '{engine_path}' (its log says why)")
        self.providers = [f"TensorRT {trt.__version__}"]
        self.stream = Stream()
        self.layers = manifest.model.num_layers
        self.capacity = pool.global_rows
        local = sorted(pool.local_layers)
        self.local_capacity = pool.keys[local[0]].shape[2] if local else None
        self.max_chunk = int(self.engine.get_tensor_profile_shape("input_ids", PREFILL)[2][1])
        self._check_dtypes()
        self._allocate()
        self.contexts = [self._context(i) for i in (DECODE, PREFILL)]
        self.cuda_graph, self._graph, self._decode_runs = cuda_graph, None, 0
        decode = self.contexts[DECODE]
        for name in self.step_inputs:
            if name not in SHAPE_INPUTS:
                shape = resolve_dims(manifest.graph.inputs[name]["shape"], 1, self.capacity, self.local_capacity)
                _ok(decode.set_input_shape(name, shape), f"set the shape of '{name}' to {shape}")

    def bind(self, pool: StaticPool) -> TrtBackend:
        """The same engine over another cache's pool: its own device ring, buffers and contexts (the weights,
        in the engine, once)."""
        return TrtBackend(None, self.manifest, pool, cuda_graph=self.cuda_graph, shared=self)

    # -- setup ---------------------------------------------------------------------------------------

    def _check_dtypes(self) -> None:
        """The engine's I/O types are the manifest's (an engine of another bundle would fail here, not later)."""
        specs = self.manifest.graph.inputs | self.manifest.graph.outputs
        for i in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(i)
            have = np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(name)))
            if name not in specs or have != np.dtype(specs[name]["dtype"]):
                raise BundleError(
                    f"the TensorRT engine's tensor '{name}' ({have}) does not match the bundle's manifest"
                )

    def _allocate(self) -> None:
        m, cap, t = self.manifest, self.capacity, self.max_chunk
        kv = {f"past_key.{i}": k for i, k in enumerate(self.pool.keys)} | {
            f"past_value.{i}": v for i, v in enumerate(self.pool.values)
        }
        self.kv = {name: DeviceBuffer(a.nbytes) for name, a in kv.items()}
        for name, a in kv.items():  # the pool's zeroed rows: the ring starts masked either way
            self.kv[name].upload(a, self.stream)
        self.step_inputs = [n for n in m.graph.inputs if n not in kv]
        self.staged: dict[str, PinnedArray] = {}
        self.device: dict[str, DeviceBuffer] = {}
        for name in self.step_inputs:
            spec = m.graph.inputs[name]
            self.staged[name] = PinnedArray(resolve_dims(spec["shape"], t, cap, self.local_capacity), spec["dtype"])
            if name not in SHAPE_INPUTS:  # shape inputs are read by TensorRT from host memory
                self.device[name] = DeviceBuffer(self.staged[name].array.nbytes)
        self.outputs: dict[str, DeviceBuffer] = {}
        self.host_out: dict[str, PinnedArray] = {}
        for name, spec in m.graph.outputs.items():
            shape = [t if d in ("tokens", "kept") else d for d in spec["shape"]]
            size = int(np.prod(shape)) * np.dtype(spec["dtype"]).itemsize
            self.outputs[name] = DeviceBuffer(size)
            if not name.startswith(("new_key.", "new_value.")):  # logits (and next_token) come back to the host
                self.host_out[name] = PinnedArray(tuple(shape), spec["dtype"])
        self.row_bytes = self.pool.keys[0].shape[3] * self.pool.keys[0].dtype.itemsize
        self.kv_heads = [k.shape[1] for k in self.pool.keys]
        self.stream.sync()

    def _context(self, profile: int) -> Any:
        ctx = self.engine.create_execution_context()
        _ok(ctx.set_optimization_profile_async(profile, self.stream.ptr), f"select optimization profile {profile}")
        for name, buf in (self.kv | self.device | self.outputs).items():
            _ok(ctx.set_tensor_address(name, buf.ptr), f"bind '{name}'")
        for name in SHAPE_INPUTS:
            if name in self.staged:
                _ok(ctx.set_tensor_address(name, self.staged[name].ptr), f"bind '{name}'")
        for name in self.kv:
            _ok(ctx.set_input_shape(name, self._kv_shape(name)), f"set the shape of '{name}'")
        return ctx

    def _kv_shape(self, name: str) -> tuple[int, ...]:
        i = int(name.rsplit(".", 1)[1])
        return tuple((self.pool.keys if name.startswith("past_key") else self.pool.values)[i].shape)

    # -- steps ---------------------------------------------------------------------------------------

    def _stage(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each step input copied into the front of its pinned buffer; the views, shaped as fed."""
        views = {}
        for name in self.step_inputs:
            a = np.asarray(feeds[name])
            view = self.staged[name].array.reshape(-1)[: a.size].reshape(a.shape)
            np.copyto(view, a, casting="same_kind")
            views[name] = view
        return views

    def _enqueue(self, ctx: Any, views: dict[str, np.ndarray], kept: int) -> None:
        for name, view in views.items():
            if name in self.device:
                self.device[name].upload(view, self.stream)
        if not ctx.execute_async_v3(self.stream.ptr):
            raise EdgeRuntimeError("TensorRT could not enqueue the step (its log says why)")
        for name, host in self.host_out.items():
            self.outputs[name].download(host.array[:, :kept], self.stream)  # [1, kept, ...]: contiguous

    def _write_rows(self, row: int, n: int, local_row: int | None) -> None:
        """The new rows into slots [row, row + n) of every layer (of the local ring from local_row)."""
        for i, heads in enumerate(self.kv_heads):
            at, cap = (row, self.capacity) if i not in self.pool.local_layers else (local_row, self.local_capacity)
            if at is None or cap is None:
                raise EdgeRuntimeError("a local layer's rows without the local ring's write index")  # a wiring bug
            copy = RowCopy.plan(kv_heads=heads, capacity=cap, row_bytes=self.row_bytes, row=at, n=n)
            copy.run(self.kv[f"past_key.{i}"].ptr, self.outputs[f"new_key.{i}"].ptr, self.stream)
            copy.run(self.kv[f"past_value.{i}"].ptr, self.outputs[f"new_value.{i}"].ptr, self.stream)

    def _decode_feeds(self) -> dict[str, np.ndarray]:
        p, d = self.pool, self.pool.decode
        feeds = {
            "input_ids": p.input_ids,
            "cos": d.cos,
            "sin": d.sin,
            "cos_sink": d.cos_sink,
            "sin_sink": d.sin_sink,
            "attn_mask": d.attn_mask,
            "sink_mask": d.sink_mask,
            "num_logits_to_keep": p.keep,
        }
        if d.local is not None:
            feeds |= {"cos_local": d.local.cos, "sin_local": d.local.sin, "attn_mask_local": d.local.attn_mask}
        return feeds

    def run_decode(self, row: int) -> None:
        """One token: inputs from the pool's decode buffers; logits into pool.logits, the rows into slot `row`."""
        views = self._stage(self._decode_feeds())
        ctx = self.contexts[DECODE]
        if self._graph is not None:
            self._graph.launch()
        elif self.cuda_graph and self._decode_runs > 0:  # captured after one plain run (TensorRT's lazy setup)
            self._graph = CudaGraph(self.stream, lambda: self._enqueue(ctx, views, 1))
            self._graph.launch()
        else:
            self._enqueue(ctx, views, 1)
        self._decode_runs += 1
        local = self.pool.decode.local
        self._write_rows(row, 1, None if local is None else int(local.write_index[0]))
        self.stream.sync()
        self.pool.logits[...] = self.host_out["logits"].array[:, :1]
        if self.pool.next_token is not None and "next_token" in self.host_out:
            self.pool.next_token[...] = self.host_out["next_token"].array[:, :1]

    def run_chunk(self, ids: np.ndarray, plan: StepInputs, keep: int) -> np.ndarray:
        """A prefill chunk of n <= capacity tokens; the logits of its last `keep` tokens, [keep, V]."""
        n = ids.shape[0]
        if not 1 <= keep <= n <= self.max_chunk:
            raise EdgeRuntimeError(f"chunk of {n} tokens keeping {keep} is outside the engine's 1..{self.max_chunk}")
        views = self._stage(plan.feeds(ids, keep))
        ctx = self.contexts[PREFILL]
        for name, view in views.items():
            if name not in SHAPE_INPUTS:
                _ok(ctx.set_input_shape(name, view.shape), f"set the shape of '{name}' to {view.shape}")
        self._enqueue(ctx, views, keep)
        local_row = None if plan.write_index_local is None else int(plan.write_index_local[0])
        self._write_rows(int(plan.write_index[0]), n, local_row)  # chunks never wrap: the rows are contiguous
        self.stream.sync()
        return self.host_out["logits"].array[0, :keep].copy()

    # -- the rest of the protocol ----------------------------------------------------------------------

    def kernel_ops(self) -> set[str]:
        return set()  # edge-runtime's CPU ops never run in an engine

    def end_profiling(self) -> Path | None:
        return None

    def kv_to_host(self) -> None:
        """The device ring copied into the pool's K/V arrays (for snapshots)."""
        for name, buf in self.kv.items():
            i = int(name.rsplit(".", 1)[1])
            buf.download((self.pool.keys if name.startswith("past_key") else self.pool.values)[i], self.stream)
        self.stream.sync()

    def kv_from_host(self) -> None:
        """The pool's K/V arrays copied onto the device (after a snapshot was restored into them)."""
        for name, buf in self.kv.items():
            i = int(name.rsplit(".", 1)[1])
            buf.upload((self.pool.keys if name.startswith("past_key") else self.pool.values)[i], self.stream)
        self.stream.sync()

    def close(self) -> None:
        if self._graph is not None:
            self._graph.close()
        for buf in (*self.kv.values(), *self.device.values(), *self.outputs.values()):
            buf.free()
        for host in (*self.staged.values(), *self.host_out.values()):
            host.free()
        self.stream.close()


def _ok(done: bool, what: str) -> None:
    """TensorRT's context setters answer False (and log why) instead of raising."""
    if not done:
        raise EdgeRuntimeError(f"TensorRT could not {what} (its log says why)")
