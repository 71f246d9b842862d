"""NVIDIA discrete-GPU energy through NVML (`pynvml`, from the nvidia-ml-py package; optional).

`nvmlDeviceGetTotalEnergyConsumption` is a millijoule counter since the driver loaded (Volta and
newer) and is preferred; older GPUs fall back to `nvmlDeviceGetPowerUsage` (milliwatts), sampled.
The boundary is the GPU board only: host CPU, DRAM and PSU losses are outside it.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from edge_runtime.errors import SensorReadError, SensorUnavailableError
from edge_runtime.telemetry.base import Boundary, MeterKind, PowerMeter


def import_pynvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise SensorUnavailableError(
            "pynvml is not installed; `pip install nvidia-ml-py` to read NVIDIA GPU energy"
        ) from exc


class NvmlMeter(PowerMeter):
    kind_name = "nvml"
    boundary = Boundary.GPU_BOARD
    max_rate_hz = 10.0  # the energy counter updates every 20-100 ms

    def __init__(
        self,
        *,
        nvml: Any = None,
        devices: Sequence[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock)
        self.nvml = nvml if nvml is not None else import_pynvml()
        self._error = getattr(self.nvml, "NVMLError", Exception)
        try:
            self.nvml.nvmlInit()
            indices = list(range(self.nvml.nvmlDeviceGetCount())) if devices is None else list(devices)
            self.handles = {f"gpu{i}": self.nvml.nvmlDeviceGetHandleByIndex(i) for i in indices}
        except self._error as exc:
            raise SensorUnavailableError(f"NVML cannot be initialised ({exc}); is the NVIDIA driver loaded?") from exc
        if not self.handles:
            self.nvml.nvmlShutdown()
            raise SensorUnavailableError("NVML reports no NVIDIA GPU")
        try:
            self._start_mj = {name: self._energy_mj(h) for name, h in self.handles.items()}
            self.kind = MeterKind.ENERGY
        except self._error:
            # Pre-Volta: no energy counter, so sample power instead.
            self._start_mj = {}
            self.kind = MeterKind.POWER
            self._read()

    def _energy_mj(self, handle: Any) -> int:
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(handle))

    def _read(self) -> tuple[float, dict[str, float]]:
        try:
            if self.kind is MeterKind.POWER:
                rails = {n: self.nvml.nvmlDeviceGetPowerUsage(h) / 1e3 for n, h in self.handles.items()}
                return sum(rails.values()), rails
            rails = {}
            for name, handle in self.handles.items():
                mj = self._energy_mj(handle)
                if mj < self._start_mj[name]:
                    raise SensorReadError(f"NVML energy counter of {name} went backwards (driver reloaded?)")
                rails[name] = (mj - self._start_mj[name]) / 1e3
            return sum(rails.values()), rails
        except self._error as exc:
            raise SensorReadError(f"NVML read failed: {exc}") from exc

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self._error:
            pass  # shutting down a library that already lost the GPU needs no report

    @property
    def description(self) -> str:
        how = "energy counter" if self.kind is MeterKind.ENERGY else "power (no energy counter on this GPU)"
        return f"NVML {how}, {' + '.join(self.handles)} (GPU board only)"
