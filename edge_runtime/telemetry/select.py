"""Opening meters by kind, and choosing the first readable one from a target profile's list.

A kind that cannot be opened (no such sensor, permission denied, library missing) is skipped with a
note saying why and how to fix it; when none can be read, the CPU-utilisation estimate is used and
labelled as such.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_runtime.errors import SensorUnavailableError, TelemetryError
from edge_runtime.telemetry.amdgpu import AmdgpuMeter
from edge_runtime.telemetry.base import METER_KINDS, PowerMeter
from edge_runtime.telemetry.estimate import CpuEstimateMeter
from edge_runtime.telemetry.ina3221 import Ina3221Meter
from edge_runtime.telemetry.ina3221x import Ina3221xMeter
from edge_runtime.telemetry.nvml import NvmlMeter
from edge_runtime.telemetry.rapl import RaplMeter
from edge_runtime.telemetry.rpi_pmic import RpiPmicMeter, Runner


@dataclass(frozen=True)
class MeterOptions:
    """Everything a meter may need; tests inject the root, opener, command runner, NVML and clock."""

    root: Path | str = "/"
    opener: Callable[[Path], str] | None = None
    runner: Runner | None = None
    nvml: Any = None
    total_rails: tuple[str, ...] = ()
    tdp_watts: float | None = None
    idle_watts: float | None = None
    clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True)
class MeterChoice:
    meter: PowerMeter
    notes: tuple[str, ...]  # one line per kind skipped before it, with the reason and the fix


def _estimate(o: MeterOptions) -> PowerMeter:
    if o.tdp_watts is None or o.idle_watts is None:
        raise SensorUnavailableError("the estimate needs power.tdp_watts and power.idle_watts in the target profile")
    return CpuEstimateMeter(o.tdp_watts, o.idle_watts, o.root, opener=o.opener, clock=o.clock)


# One factory per kind a profile may name (METER_KINDS); a test checks none is missing.
FACTORIES: dict[str, Callable[[MeterOptions], PowerMeter]] = {
    "ina3221": lambda o: Ina3221Meter(o.root, total_rails=o.total_rails, opener=o.opener, clock=o.clock),
    "ina3221x": lambda o: Ina3221xMeter(o.root, total_rails=o.total_rails, opener=o.opener, clock=o.clock),
    "rpi5-pmic": lambda o: RpiPmicMeter(o.runner, clock=o.clock),
    "rapl": lambda o: RaplMeter(o.root, opener=o.opener, clock=o.clock),
    "amdgpu": lambda o: AmdgpuMeter(o.root, opener=o.opener, clock=o.clock),
    "nvml": lambda o: NvmlMeter(nvml=o.nvml, clock=o.clock),
    "estimate": _estimate,
}


def open_meter(kind: str, options: MeterOptions | None = None) -> PowerMeter:
    """Open one meter by kind; raises SensorUnavailableError (or its permission subclass) when it cannot."""
    if kind not in FACTORIES:
        raise TelemetryError(f"unknown power meter kind {kind!r}; known kinds: {', '.join(METER_KINDS)}")
    return FACTORIES[kind](options or MeterOptions())


def choose_meter(kinds: Sequence[str], options: MeterOptions | None = None) -> MeterChoice:
    """The first of `kinds` that opens; the estimate is tried last even if `kinds` does not name it."""
    options = options or MeterOptions()
    notes: list[str] = []
    order = [*kinds, *(["estimate"] if "estimate" not in kinds else [])]
    for kind in order:
        try:
            meter = open_meter(kind, options)
        except SensorUnavailableError as exc:
            notes.append(f"{kind}: {exc}")
            continue
        if meter.estimate and notes:
            notes.append("no sensor could be read: power figures are an estimate")
        return MeterChoice(meter, tuple(notes))
    raise SensorUnavailableError("no power meter could be opened: " + " | ".join(notes))


def meter_for_profile(profile: Any, options: MeterOptions | None = None) -> MeterChoice:
    """Choose from a `TargetProfile`'s `power.meters`, with its rails and TDP figures filled in."""
    base = options or MeterOptions()
    power = profile.power
    merged = dataclasses.replace(
        base,
        total_rails=base.total_rails or power.total_rails,
        tdp_watts=base.tdp_watts if base.tdp_watts is not None else power.tdp_watts,
        idle_watts=base.idle_watts if base.idle_watts is not None else power.idle_watts,
    )
    return choose_meter(power.meters, merged)
