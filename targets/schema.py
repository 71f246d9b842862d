"""The target profile schema: frozen dataclasses, and the check that turns a YAML mapping into them.

Every key a profile may hold is a dataclass field here; the checker derives the allowed keys from
the fields, so the schema has one source of truth. Errors name the file, the dotted key and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any

from edge_runtime.errors import ProfileSchemaError
from edge_runtime.telemetry.base import METER_KINDS

BACKENDS = ("onnxruntime", "tensorrt")
GRAPH_FLAVORS = ("ort", "trt")
QUANTIZATIONS = ("none", "int8", "int4", "int4-awq", "int4-gptq")
MATMUL_KERNELS = ("mlas", "edge")  # exporters.quant.MatMulKernel values
MIXED_PLANS = ("none", "llama-down", "sensitivity")  # exporters.quant.MixedPlan values
BLOCK_SIZES = (32, 64, 128)
TRT_BLOCK_SIZES = (64, 128)  # opset-21 blocked DequantizeLinear as TensorRT 10.3 parses it (docs/architecture.md §5)
TRT_PRECISIONS = ("fp16", "bf16", "tf32", "int8", "int4", "fp8")
SENSOR_HINT_KINDS = ("hwmon", "rail", "powercap")


@dataclass(frozen=True)
class TensorRTOptions:
    precision: tuple[str, ...]  # builder flags, e.g. ("fp16", "int8"); Q/DQ nodes in the graph set weight precision
    workspace_bytes: int  # builder memory-pool limit
    optimization_level: int = 3  # TensorRT builder optimization level 0..5


@dataclass(frozen=True)
class BackendSpec:
    name: str  # one of BACKENDS
    threads: int  # host threads; 0 = the backend's default (all physical cores)
    providers: tuple[str, ...] = ()  # ONNX Runtime execution providers in priority order (onnxruntime only)
    tensorrt: TensorRTOptions | None = None  # tensorrt only


@dataclass(frozen=True)
class KVCacheSpec:
    sinks: int  # StreamingLLM attention sinks kept forever
    window: int  # rolling window of recent tokens

    @property
    def capacity(self) -> int:
        return self.sinks + self.window


@dataclass(frozen=True)
class PowerSpec:
    meters: tuple[str, ...]  # meter kinds in preference order (telemetry.METER_KINDS)
    tdp_watts: float  # full-load power for the CPU-utilisation estimate
    idle_watts: float  # idle power for the same estimate
    sample_hz: float = 10.0  # sampler rate; each meter may cap it lower (Pi PMIC: 10 Hz)
    total_rails: tuple[str, ...] = ()  # INA3221 rails summed for the total; empty = the meter's own rule


@dataclass(frozen=True)
class DetectHints:
    device_tree_model: tuple[str, ...] = ()  # substrings of /proc/device-tree/model
    device_tree_compatible: tuple[str, ...] = ()  # substrings of a /proc/device-tree/compatible entry
    cpu_vendor: tuple[str, ...] = ()  # /proc/cpuinfo vendor_id values (x86)
    cpu_flags: tuple[str, ...] = ()  # /proc/cpuinfo flags that must all be present
    dmi_product: tuple[str, ...] = ()  # substrings of /sys/class/dmi/id/product_name
    sensors: tuple[str, ...] = ()  # "hwmon:<name>", "rail:<INA3221 label>" or "powercap:<zone name>"


@dataclass(frozen=True)
class TargetProfile:
    name: str
    description: str
    backend: BackendSpec
    graph_flavor: str  # one of GRAPH_FLAVORS
    quantization: str  # default quantization, one of QUANTIZATIONS
    block_size: int  # quantization block (MatMulNBits / blocked DequantizeLinear)
    kv_cache: KVCacheSpec
    memory_budget_bytes: int
    power: PowerSpec
    detect: DetectHints
    # kernels of quantized bundles exported on first use: "edge" (csrc/, x86-64 AVX2) where they run, else "mlas"
    matmul_kernel: str = "mlas"
    # Embedding table / LM head bits of quantized bundles exported for the target (`ort` only): 8 (INT8 per
    # row) or 4 (INT4 in block_size blocks, half the LM head's bytes; `edge-export --table-bits`)
    table_bits: int = 8
    # INT4 bundles: Linear groups kept INT8 per channel (`edge-export --mixed`); "sensitivity" calibrates
    mixed_precision: str = "none"
    # edge-serve's generations at once (--parallel's default), their decode steps batched into one call
    serve_parallel: int = 1
    source: str = ""  # the file it was loaded from; not a YAML key


# ---------------------------------------------------------------------------------------------
# The checker
# ---------------------------------------------------------------------------------------------


class _Section:
    """One YAML mapping being checked against a dataclass; knows its file and dotted key for messages."""

    def __init__(self, src: str, prefix: str, data: Any, cls: type) -> None:
        self.src, self.prefix = src, prefix
        where = f"'{prefix}'" if prefix else "the top level"
        if not isinstance(data, dict):
            raise ProfileSchemaError(f"{src}: {where} = {data!r} must be a mapping of keys to values")
        allowed = [f.name for f in dataclasses.fields(cls) if f.name != "source"]
        for key in data:
            if key not in allowed:
                near = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f"did you mean '{near[0]}'? " if near else ""
                raise ProfileSchemaError(
                    f"{src}: unknown key '{self.key(key)}'; {hint}allowed keys in {where}: {', '.join(allowed)}"
                )
        self.data = data

    def key(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else str(key)

    def fail(self, key: str, must: str) -> ProfileSchemaError:
        value = self.data.get(key)
        return ProfileSchemaError(f"{self.src}: '{self.key(key)}' = {value!r} {must}")

    def get(self, key: str, default: Any = dataclasses.MISSING) -> Any:
        if key in self.data and self.data[key] is not None:
            return self.data[key]
        if default is dataclasses.MISSING:
            raise ProfileSchemaError(
                f"{self.src}: required key '{self.key(key)}' is missing; add it "
                "(the built-in profiles in edge_runtime/targets/*.yaml show every key)"
            )
        return default

    def string(self, key: str, choices: tuple[str, ...] | None = None, default: Any = dataclasses.MISSING) -> str:
        value = self.get(key, default)
        if not isinstance(value, str) or not value:
            raise self.fail(key, "must be a non-empty string")
        if choices is not None and value not in choices:
            raise self.fail(key, f"must be one of: {', '.join(choices)}")
        return value

    def integer(self, key: str, minimum: int, default: Any = dataclasses.MISSING) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"must be an integer >= {minimum}")
        return value

    def number(self, key: str, default: Any = dataclasses.MISSING) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise self.fail(key, "must be a positive number")
        return float(value)

    def strings(self, key: str, choices: tuple[str, ...] | None = None, nonempty: bool = False) -> tuple[str, ...]:
        value = self.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(key, "must be a list of non-empty strings")
        if nonempty and not value:
            raise self.fail(key, "must list at least one entry")
        bad = [v for v in value if choices is not None and v not in choices]
        if bad:
            raise self.fail(key, f"has {bad[0]!r}; allowed: {', '.join(choices or ())}")
        return tuple(value)

    def section(self, key: str, cls: type, optional: bool = False) -> _Section | None:
        if optional and self.data.get(key) is None:
            return None
        return _Section(self.src, self.key(key), self.get(key), cls)


def _backend(sec: _Section) -> BackendSpec:
    name = sec.string("name", BACKENDS)
    trt_sec = sec.section("tensorrt", TensorRTOptions, optional=True)
    providers = sec.strings("providers")
    if name == "onnxruntime":
        if trt_sec is not None:
            raise sec.fail("tensorrt", "applies to the tensorrt backend only; remove it or set backend.name: tensorrt")
        if not providers:
            raise sec.fail("providers", "must list at least one ONNX Runtime provider, e.g. [CPUExecutionProvider]")
        trt = None
    else:
        if providers:
            raise sec.fail("providers", "applies to the onnxruntime backend only; remove it")
        if trt_sec is None:
            raise ProfileSchemaError(
                f"{sec.src}: the tensorrt backend needs a 'backend.tensorrt' section with precision and workspace_bytes"
            )
        trt = TensorRTOptions(
            precision=trt_sec.strings("precision", TRT_PRECISIONS, nonempty=True),
            workspace_bytes=trt_sec.integer("workspace_bytes", 1),
            optimization_level=trt_sec.integer("optimization_level", 0, default=3),
        )
        if trt.optimization_level > 5:
            raise trt_sec.fail("optimization_level", "must be between 0 and 5")
    return BackendSpec(name=name, threads=sec.integer("threads", 0), providers=providers, tensorrt=trt)


def _power(sec: _Section) -> PowerSpec:
    power = PowerSpec(
        meters=sec.strings("meters", METER_KINDS, nonempty=True),
        tdp_watts=sec.number("tdp_watts"),
        idle_watts=sec.number("idle_watts"),
        sample_hz=sec.number("sample_hz", default=10.0),
        total_rails=sec.strings("total_rails"),
    )
    if power.idle_watts >= power.tdp_watts:
        raise sec.fail("idle_watts", f"must be below power.tdp_watts ({power.tdp_watts:g})")
    return power


def _detect(sec: _Section | None) -> DetectHints:
    if sec is None:
        return DetectHints()
    sensors = sec.strings("sensors")
    for hint in sensors:
        kind, _, what = hint.partition(":")
        if kind not in SENSOR_HINT_KINDS or not what:
            raise sec.fail("sensors", f"has {hint!r}; each entry is KIND:NAME with KIND one of hwmon, rail, powercap")
    names = [f.name for f in dataclasses.fields(DetectHints) if f.name != "sensors"]
    return DetectHints(**{n: sec.strings(n) for n in names}, sensors=sensors)


def parse_profile(data: Any, src: str) -> TargetProfile:
    """Check a profile mapping (as read from YAML) and build the frozen `TargetProfile`."""
    top = _Section(src, "", data, TargetProfile)
    flavor = top.string("graph_flavor", GRAPH_FLAVORS)
    quant = top.string("quantization", QUANTIZATIONS)
    block = top.integer("block_size", 1)
    if block not in BLOCK_SIZES:
        raise top.fail("block_size", f"must be one of {', '.join(map(str, BLOCK_SIZES))}")
    if flavor == "trt" and quant.startswith("int4") and block not in TRT_BLOCK_SIZES:
        raise top.fail("block_size", "must be 64 or 128 for INT4 on the trt graph flavor (TensorRT blocked DQ)")
    kernel = top.string("matmul_kernel", MATMUL_KERNELS, default="mlas")
    if kernel == "edge" and flavor != "ort":
        raise top.fail(
            "matmul_kernel", "must be 'mlas' unless graph_flavor is 'ort' (edge kernels are ONNX Runtime ops)"
        )
    table_bits = top.integer("table_bits", 4, default=8)
    if table_bits not in (4, 8):
        raise top.fail("table_bits", "must be 8 or 4")
    if table_bits == 4 and flavor != "ort":
        raise top.fail("table_bits", "must be 8 unless graph_flavor is 'ort' (TensorRT 10.3 gathers no INT4 table)")
    mixed = top.string("mixed_precision", MIXED_PLANS, default="none")
    if mixed != "none" and not quant.startswith("int4"):
        raise top.fail("mixed_precision", "must be 'none' unless quantization is int4, int4-awq or int4-gptq")
    backend = _backend(top.section("backend", BackendSpec))
    if backend.name == "tensorrt" and flavor != "trt":
        raise top.fail(
            "graph_flavor", "must be 'trt' with the tensorrt backend (TensorRT cannot parse com.microsoft ops)"
        )
    kv = top.section("kv_cache", KVCacheSpec)
    return TargetProfile(
        name=top.string("name"),
        description=top.string("description"),
        backend=backend,
        graph_flavor=flavor,
        quantization=quant,
        block_size=block,
        kv_cache=KVCacheSpec(sinks=kv.integer("sinks", 0), window=kv.integer("window", 1)),
        memory_budget_bytes=top.integer("memory_budget_bytes", 1),
        power=_power(top.section("power", PowerSpec)),
        detect=_detect(top.section("detect", DetectHints, optional=True)),
        matmul_kernel=kernel,
        table_bits=table_bits,
        mixed_precision=mixed,
        serve_parallel=top.integer("serve_parallel", 1, default=1),
        source=src,
    )
