"""CUDA memory for the TensorRT backend through NVIDIA's cuda-python (`cuda.bindings.runtime`).

Device buffers and pinned host arrays are allocated once, at load; a step only copies into them. The new K/V
rows a `trt` graph outputs ([1, Hkv, n, D], contiguous) reach their ring slots ([1, Hkv, capacity, D], rows
row..row+n) as one strided device-to-device copy per buffer (`RowCopy`, cudaMemcpy2DAsync: one "row" of the
copy per KV head), so the cache never crosses to the host. `RowCopy` is plain arithmetic, tested without a GPU.

Not verified on a GPU: no CUDA device was available where this was written (scripts/gpu_check.py checks it).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_runtime.errors import EdgeRuntimeError


class CudaError(EdgeRuntimeError):
    """A CUDA runtime call failed (the message names the call and CUDA's own text)."""


def runtime() -> Any:
    """cuda-python's runtime module: `cuda.bindings.runtime` (cuda-python 12.6.1+), else the older `cuda.cudart`."""
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        try:
            from cuda import cudart as rt  # cuda-python before 12.6.1 (still on some JetPack images)
        except ImportError:
            raise CudaError("cuda-python is not installed (pip install cuda-python)") from None
    return rt


def check(result: tuple, call: str) -> Any:
    """cuda-python returns (error, *values): the values (one, or a tuple), or CudaError naming `call`."""
    rt = runtime()
    err, rest = result[0], result[1:]
    if err != rt.cudaError_t.cudaSuccess:
        _, text = rt.cudaGetErrorString(err)
        raise CudaError(f"{call} failed: {getattr(err, 'name', err)} ({text.decode(errors='replace')})")
    return rest[0] if len(rest) == 1 else rest


def no_device_reason() -> str | None:
    """Why there is no CUDA device to run on here (cuda-python missing, no driver, no GPU); None if there is one."""
    try:
        rt = runtime()
    except CudaError as e:
        return str(e)
    err, count = rt.cudaGetDeviceCount()
    if err != rt.cudaError_t.cudaSuccess:
        _, text = rt.cudaGetErrorString(err)
        return f"no CUDA device: {getattr(err, 'name', err)} ({text.decode(errors='replace')})"
    return None if count > 0 else "no CUDA device: cudaGetDeviceCount found 0"


def compute_capability(device: int = 0) -> tuple[int, int]:
    """The GPU's compute capability (Orin: 8.7); engines are specific to it."""
    rt = runtime()
    major = check(rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, device), "attr")
    minor = check(rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor, device), "attr")
    return int(major), int(minor)


class Stream:
    def __init__(self) -> None:
        self.handle = check(runtime().cudaStreamCreate(), "cudaStreamCreate")

    @property
    def ptr(self) -> int:  # what TensorRT's execute_async_v3 takes
        return int(self.handle)

    def sync(self) -> None:
        check(runtime().cudaStreamSynchronize(self.handle), "cudaStreamSynchronize")

    def close(self) -> None:
        if self.handle is not None:
            runtime().cudaStreamDestroy(self.handle)
            self.handle = None


class DeviceBuffer:
    """`nbytes` of device memory, allocated once."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(int(nbytes), 1)  # TensorRT wants a valid address even for an empty tensor
        self.ptr = int(check(runtime().cudaMalloc(self.nbytes), f"cudaMalloc({self.nbytes})"))

    def upload(self, src: np.ndarray, stream: Stream) -> None:
        """Copy a host array (pinned for the copy to be asynchronous) into the start of this buffer."""
        self._fits(src.nbytes)
        kind = runtime().cudaMemcpyKind.cudaMemcpyHostToDevice
        check(runtime().cudaMemcpyAsync(self.ptr, src.ctypes.data, src.nbytes, kind, stream.handle), "H2D copy")

    def download(self, dst: np.ndarray, stream: Stream) -> None:
        self._fits(dst.nbytes)
        kind = runtime().cudaMemcpyKind.cudaMemcpyDeviceToHost
        check(runtime().cudaMemcpyAsync(dst.ctypes.data, self.ptr, dst.nbytes, kind, stream.handle), "D2H copy")

    def _fits(self, nbytes: int) -> None:
        if nbytes > self.nbytes:
            raise CudaError(f"copy of {nbytes} bytes into a device buffer of {self.nbytes}")

    def free(self) -> None:
        if self.ptr:
            runtime().cudaFree(self.ptr)
            self.ptr = 0


class PinnedArray:
    """A numpy array in page-locked host memory (cudaMallocHost): copies from/to it run asynchronously at full
    bus speed, and a captured CUDA graph may read it (its address never changes)."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype | type) -> None:
        self.dtype = np.dtype(dtype)
        nbytes = max(int(np.prod(shape)) * self.dtype.itemsize, 1)
        self.ptr = int(check(runtime().cudaMallocHost(nbytes), f"cudaMallocHost({nbytes})"))
        raw = (ctypes.c_uint8 * nbytes).from_address(self.ptr)
        self.array = np.frombuffer(raw, self.dtype, count=int(np.prod(shape))).reshape(shape)

    def free(self) -> None:
        if self.ptr:
            self.array = None  # type: ignore[assignment]
            runtime().cudaFreeHost(self.ptr)
            self.ptr = 0


@dataclass(frozen=True)
class RowCopy:
    """One strided copy of n new K (or V) rows [1, H, n, D] into ring rows row..row+n of [1, H, capacity, D]:
    `height` = H rows of `width` bytes, source rows `spitch` apart, destination rows `dpitch` apart, the
    destination starting `dst_offset` bytes into the ring buffer (cudaMemcpy2DAsync's arguments)."""

    dst_offset: int
    dpitch: int
    spitch: int
    width: int
    height: int

    @classmethod
    def plan(cls, *, kv_heads: int, capacity: int, row_bytes: int, row: int, n: int) -> RowCopy:
        if not (0 <= row and n >= 1 and row + n <= capacity):
            raise EdgeRuntimeError(f"K/V rows {row}..{row + n} are outside the ring's {capacity} rows")
        return cls(row * row_bytes, capacity * row_bytes, n * row_bytes, n * row_bytes, kv_heads)

    def apply_host(self, dst: np.ndarray, src: np.ndarray) -> None:
        """The same copy on host bytes (what cudaMemcpy2D does), to check the plan without a GPU."""
        d, s = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
        for h in range(self.height):
            at = self.dst_offset + h * self.dpitch
            d[at : at + self.width] = s[h * self.spitch : h * self.spitch + self.width]

    def run(self, dst_ptr: int, src_ptr: int, stream: Stream) -> None:
        rt = runtime()
        kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        args = (dst_ptr + self.dst_offset, self.dpitch, src_ptr, self.spitch, self.width, self.height, kind)
        check(rt.cudaMemcpy2DAsync(*args, stream.handle), "ring row copy (cudaMemcpy2DAsync)")


class CudaGraph:
    """The work `enqueue` puts on `stream`, captured once and replayed with one launch: the decode step's
    copies and kernels at fixed addresses, without per-kernel launch cost (the seeds' main lever against
    decode-latency jitter). Everything it touches must keep its address: pinned inputs, device buffers."""

    def __init__(self, stream: Stream, enqueue: Callable[[], None]) -> None:
        rt = runtime()
        self.stream = stream
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        check(rt.cudaStreamBeginCapture(stream.handle, mode), "cudaStreamBeginCapture")
        try:
            enqueue()
        finally:
            graph = check(rt.cudaStreamEndCapture(stream.handle), "cudaStreamEndCapture")
        self.graph = graph
        self.exec = check(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")

    def launch(self) -> None:
        check(runtime().cudaGraphLaunch(self.exec, self.stream.handle), "cudaGraphLaunch")

    def close(self) -> None:
        rt = runtime()
        rt.cudaGraphExecDestroy(self.exec)
        rt.cudaGraphDestroy(self.graph)
