"""What a target profile asks of an export: flavor, quantization, block, kernel, table bits, mixed precision,
cache geometry.

Shared by `edge-export --target T` and `edge-run`'s first-use export, so a bundle built for a device on a
build host and the one the device builds for itself are the same. Plain values only: `targets` does not
import the exporters. `PORTABLE` is what `edge-export` writes without `--target`: a bundle that runs on any
machine with ONNX Runtime (float weights, ONNX Runtime's own kernels).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from edge_runtime.targets.schema import TargetProfile

# The INT4 block where neither --block nor a profile gives one: 32 for ort (MatMulQ4, llama.cpp's Q4_0), 128 for
# trt (TensorRT's INT4 blocks are 64 and 128). exporters/plan.py's default_block reads it.
DEFAULT_INT4_BLOCK = {"ort": 32, "trt": 128}


@dataclass(frozen=True)
class ExportSettings:
    flavor: str = "ort"
    quant: str = "none"
    block: int | None = None  # None: DEFAULT_INT4_BLOCK[flavor]
    kernel: str = "mlas"
    table_bits: int = 8
    mixed: str = "none"  # MixedPlan value: INT4 bundles only
    sinks: int = 4
    window: int | None = None  # None: the model's trained context (capped by the exporter)
    target: str | None = None  # the profile these came from; recorded in the manifest's provenance

    @property
    def int4_block(self) -> int:
        """The INT4 block these settings export with (INT4 quantization or an INT4 table)."""
        return self.block if self.block is not None else DEFAULT_INT4_BLOCK[self.flavor]

    def with_overrides(self, **explicit: object) -> ExportSettings:
        """These settings with every explicitly given value (not None) in its place: flags win."""
        return replace(self, **{k: v for k, v in explicit.items() if v is not None})  # type: ignore[arg-type]


PORTABLE = ExportSettings()


def settings_for(profile: TargetProfile, *, edge_kernels_here: bool = True) -> ExportSettings:
    """The profile's export defaults. The edge kernels apply only to quantized `ort` bundles, and only where
    edge-runtime's kernel library runs (the export validates the graph on this machine)."""
    quantized = profile.quantization != "none"
    kernel = "edge" if profile.matmul_kernel == "edge" and quantized and edge_kernels_here else "mlas"
    return ExportSettings(
        flavor=profile.graph_flavor,
        quant=profile.quantization,
        block=profile.block_size,
        kernel=kernel,
        table_bits=profile.table_bits if quantized else 8,
        mixed=profile.mixed_precision,
        sinks=profile.kv_cache.sinks,
        window=profile.kv_cache.window,
        target=profile.name,
    )
