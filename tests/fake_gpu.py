"""Stand-ins for cuda-python's runtime and TensorRT's runtime API, on host memory, for testing the TensorRT
backend's host side without a GPU: its buffer plan, staging, shapes per optimization profile, ring-row copies
and CUDA-graph replay. "Device" memory is ctypes memory; the "engine" runs the bundle's graph with ONNX Runtime
CPU on the bound addresses. What this cannot test is TensorRT itself (parsing, building, its kernels):
scripts/gpu_check.py does that on a GPU."""

from __future__ import annotations

import ctypes
import enum
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort

OK = 0


class FakeStream:
    def __int__(self) -> int:  # cudaStream_t: int() gives the handle TensorRT takes
        return id(self)


class FakeCudaRuntime:
    """The cuda.bindings.runtime calls cuda_buffers.py makes, each returning (error, *values) like cuda-python."""

    cudaError_t = enum.IntEnum("cudaError_t", {"cudaSuccess": 0, "cudaErrorInvalidValue": 1}, start=0)
    cudaMemcpyKind = enum.IntEnum(
        "cudaMemcpyKind", "cudaMemcpyHostToDevice cudaMemcpyDeviceToHost cudaMemcpyDeviceToDevice"
    )
    cudaStreamCaptureMode = enum.IntEnum("cudaStreamCaptureMode", "cudaStreamCaptureModeThreadLocal")
    cudaDeviceAttr = enum.IntEnum(
        "cudaDeviceAttr", "cudaDevAttrComputeCapabilityMajor cudaDevAttrComputeCapabilityMinor"
    )

    def __init__(self) -> None:
        self.blocks: dict[int, ctypes.Array] = {}
        self.capture: list | None = None  # ops recorded between BeginCapture and EndCapture
        self.copies = {"h2d": 0, "d2h": 0, "d2d_2d": 0, "graph_launches": 0}

    def enqueue(self, op) -> None:
        if self.capture is not None:
            self.capture.append(op)
        else:
            op()

    def cudaGetErrorString(self, err):
        return OK, b"fake error"

    def cudaGetDeviceCount(self):
        return OK, 1

    def cudaDeviceGetAttribute(self, attr, device):
        return OK, 8 if attr.name.endswith("Major") else 7

    def _alloc(self, n):
        block = (ctypes.c_uint8 * n)()
        self.blocks[ctypes.addressof(block)] = block
        return OK, ctypes.addressof(block)

    cudaMalloc = cudaMallocHost = _alloc

    def _free(self, ptr):
        self.blocks.pop(ptr)
        return (OK,)

    cudaFree = cudaFreeHost = _free

    def cudaMemcpyAsync(self, dst, src, n, kind, stream):
        self.copies["h2d" if kind.name.endswith("HostToDevice") else "d2h"] += 1
        self.enqueue(lambda: ctypes.memmove(dst, src, n))
        return (OK,)

    def cudaMemcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        self.copies["d2d_2d"] += 1

        def op():
            for h in range(height):
                ctypes.memmove(dst + h * dpitch, src + h * spitch, width)

        self.enqueue(op)
        return (OK,)

    def cudaStreamCreate(self):
        return OK, FakeStream()

    def cudaStreamSynchronize(self, stream):
        return (OK,)

    def cudaStreamDestroy(self, stream):
        return (OK,)

    def cudaStreamBeginCapture(self, stream, mode):
        self.capture = []
        return (OK,)

    def cudaStreamEndCapture(self, stream):
        graph, self.capture = self.capture, None
        return OK, graph

    def cudaGraphInstantiate(self, graph, flags):
        return OK, list(graph)

    def cudaGraphLaunch(self, graph, stream):
        self.copies["graph_launches"] += 1
        for op in graph:
            op()
        return (OK,)

    def cudaGraphExecDestroy(self, graph):
        return (OK,)

    cudaGraphDestroy = cudaGraphExecDestroy


def _view(ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    n = int(np.prod(shape))
    return np.frombuffer((ctypes.c_uint8 * (n * dtype.itemsize)).from_address(ptr), dtype, count=n).reshape(shape)


class FakeContext:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine, self.addresses, self.shapes, self.profile = engine, {}, {}, None

    def set_optimization_profile_async(self, index, stream):
        self.profile = index
        return True

    def set_tensor_address(self, name, ptr):
        self.addresses[name] = ptr
        return True

    def set_input_shape(self, name, shape):
        self.shapes[name] = tuple(shape)
        return True

    def execute_async_v3(self, stream):
        self.engine.cuda.enqueue(self._run)
        return True

    def _run(self) -> None:
        e = self.engine
        feeds = {}
        for name, spec in e.inputs.items():
            shape = (1,) if name == "num_logits_to_keep" else self.shapes[name]
            feeds[name] = _view(self.addresses[name], shape, np.dtype(spec["dtype"])).copy()
        names = [o.name for o in e.session.get_outputs()]
        for name, value in zip(names, e.session.run(names, feeds), strict=True):
            ctypes.memmove(self.addresses[name], np.ascontiguousarray(value).ctypes.data, value.nbytes)
        e.runs[self.profile] += 1


class FakeEngine:
    def __init__(self, graph: Path, manifest, max_chunk: int, cuda: FakeCudaRuntime) -> None:
        self.session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        self.inputs, self.outputs, self.cuda = manifest.graph.inputs, manifest.graph.outputs, cuda
        self.names = [*self.inputs, *self.outputs]
        self.max_chunk, self.runs = max_chunk, [0, 0]

    @property
    def num_io_tensors(self):
        return len(self.names)

    def get_tensor_name(self, i):
        return self.names[i]

    def get_tensor_dtype(self, name):
        return (self.inputs | self.outputs)[name]["dtype"]

    def get_tensor_profile_shape(self, name, profile):
        return [(1, 1), (1, 1), (1, self.max_chunk)]

    def create_execution_context(self):
        return FakeContext(self)


def fake_tensorrt(manifest, max_chunk: int, cuda: FakeCudaRuntime) -> SimpleNamespace:
    """A `tensorrt` module whose Runtime deserializes an 'engine' file holding the path of a model.onnx."""

    class Runtime:
        def __init__(self, logger):
            self.engines: list[FakeEngine] = []

        def deserialize_cuda_engine(self, plan: bytes):
            engine = FakeEngine(Path(plan.decode()), manifest, max_chunk, cuda)
            self.engines.append(engine)
            return engine

    class Logger:
        WARNING = 2

        def __init__(self, level=None):
            self.level = level

    return SimpleNamespace(__version__="10.3.0-fake", Logger=Logger, Runtime=Runtime, nptype=np.dtype)


class FakeBuild:
    """What a fake TensorRT build was asked for: flags, pool limit, level, profiles, timing cache, phases."""

    def __init__(self) -> None:
        self.flags: list[str] = []
        self.profiles: list[dict] = []
        self.workspace = self.level = self.timing_cache_in = None
        self.parsed: str | None = None


def fake_tensorrt_builder(build: FakeBuild, *, parse_errors: list | None = None) -> SimpleNamespace:
    """A `tensorrt` module with the builder API trt_engine.build_engine calls; the network's inputs are the
    ONNX graph's, `num_logits_to_keep` a shape tensor as TensorRT's parser makes it."""
    import onnx

    class Network:
        def __init__(self) -> None:
            self.inputs: list = []

        @property
        def num_inputs(self):
            return len(self.inputs)

        def get_input(self, i):
            return self.inputs[i]

    class OnnxParser:
        def __init__(self, network, logger):
            self.network, self.errors = network, list(parse_errors or [])

        @property
        def num_errors(self):
            return len(self.errors)

        def get_error(self, i):
            return self.errors[i]

        def parse_from_file(self, path):
            build.parsed = path
            model = onnx.load(path, load_external_data=False)
            self.network.inputs = [
                SimpleNamespace(name=i.name, is_shape_tensor=i.name == "num_logits_to_keep") for i in model.graph.input
            ]
            return not self.errors

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict = {}

        def set_shape(self, name, lo, opt, hi):
            self.shapes[name] = ("shape", lo, opt, hi)

        def set_shape_input(self, name, lo, opt, hi):
            self.shapes[name] = ("values", lo, opt, hi)

    class Config:
        def __init__(self) -> None:
            self.progress_monitor = None
            self.cache = b""

        def set_memory_pool_limit(self, pool, size):
            build.workspace = size

        @property
        def builder_optimization_level(self):
            return build.level

        @builder_optimization_level.setter
        def builder_optimization_level(self, level):
            build.level = level

        def set_flag(self, flag):
            build.flags.append(flag)

        def add_optimization_profile(self, p):
            build.profiles.append(p.shapes)

        def create_timing_cache(self, data):
            build.timing_cache_in = data
            return SimpleNamespace(serialize=lambda: b"timings")

        def set_timing_cache(self, cache, ignore_mismatch):
            self.cache = cache

        def get_timing_cache(self):
            return self.cache

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags):
            return Network()

        def create_builder_config(self):
            return Config()

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            monitor = config.progress_monitor
            monitor.phase_start("Building engine", None, 2)
            monitor.phase_start("Tactic timing", "Building engine", 10)  # nested: not reported
            monitor.phase_finish("Tactic timing")
            monitor.phase_finish("Building engine")
            return b"serialized plan"

    class IProgressMonitor:
        def __init__(self) -> None:
            pass

    class Logger:
        WARNING = 2

        def __init__(self, level=None):
            self.level = level

    flags = SimpleNamespace(**{n: n for n in ("FP16", "BF16", "TF32", "INT8", "INT4", "FP8")})
    return SimpleNamespace(
        __version__="10.3.0-fake",
        Logger=Logger,
        Builder=Builder,
        OnnxParser=OnnxParser,
        BuilderFlag=flags,
        MemoryPoolType=SimpleNamespace(WORKSPACE="workspace"),
        IProgressMonitor=IProgressMonitor,
    )
