"""Jetson INA3221 power monitors through the mainline hwmon driver (JetPack 5/6, L4T >= 34).

Chips are found by the driver directory and by hwmon `name`, channels by their `in<N>_label`; hwmon
indexes change across JetPack releases, so none is hard-coded. The driver has no power file:
power = bus voltage (mV) x current (mA), per channel, per sample (the input is not always 5 V).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import SensorPermissionError, SensorUnavailableError
from edge_runtime.telemetry.base import Boundary, PowerMeter, Sysfs

# Module input rails: Orin Nano/NX and Xavier NX (VDD_IN), JetPack 4 Nano (POM_5V_IN).
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")
# AGX Orin has no input rail: its HV input feeds GPU/SOC and CPU/CV, its MV input is VIN_SYS_5V0,
# which in turn feeds VDDQ_VDD2_1V8AO, so adding that one would count it twice.
AGX_ORIN_TOTAL = ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")


@dataclass(frozen=True)
class Rail:
    label: str
    volts_file: Path  # mV (JetPack 4: in_voltage<N>_input, also mV)
    amps_file: Path  # mA
    power_file: Path | None = None  # mW, JetPack 4 only


def choose_total(rails: Collection[str], requested: Sequence[str], where: str) -> tuple[tuple[str, ...], Boundary]:
    """The rails whose sum is the total, and the boundary that sum measures."""
    if requested:
        missing = [r for r in requested if r not in rails]
        if missing:
            raise SensorUnavailableError(
                f"INA3221 rail(s) {', '.join(missing)} not found under {where} (rails present: "
                f"{', '.join(sorted(rails)) or 'none'}); fix power.total_rails in the target profile"
            )
        chosen = tuple(requested)
    else:
        candidates = [(r,) for r in INPUT_RAILS] + [AGX_ORIN_TOTAL]
        found = [c for c in candidates if all(r in rails for r in c)]
        if not found:
            raise SensorUnavailableError(
                f"INA3221 rails {', '.join(sorted(rails)) or 'none'} under {where} include no known total "
                f"({' or '.join(INPUT_RAILS)}, or {' + '.join(AGX_ORIN_TOTAL)}); "
                "name the rails to sum in power.total_rails of the target profile"
            )
        chosen = found[0]
    boundary = Boundary.MODULE_INPUT if len(chosen) == 1 and chosen[0] in INPUT_RAILS else Boundary.SOC_RAILS
    return chosen, boundary


class RailMeter(PowerMeter):
    """Shared by both INA3221 layouts: sums chosen rails, reports every rail."""

    def __init__(
        self,
        rails: dict[str, Rail],
        sysfs: Sysfs,
        where: str,
        total_rails: Sequence[str],
        per_rail: bool,
        clock: Callable[[], float],
    ) -> None:
        super().__init__(clock)
        self.sysfs, self.where = sysfs, where
        self.total_rails, self.boundary = choose_total(rails, total_rails, where)
        self.rails = rails if per_rail else {r: rails[r] for r in self.total_rails}
        try:
            self._read()  # fail at open, not mid-run, when the files exist but cannot be read
        except SensorPermissionError as exc:
            raise SensorPermissionError(
                f"{exc}; INA3221 inputs are normally world-readable: check the file mode "
                "(`sudo chmod a+r` on the *_input files) or run as root"
            ) from exc

    def rail_watts(self, rail: Rail) -> float:
        if rail.power_file is not None:
            return self.sysfs.number(rail.power_file) / 1e3
        return self.sysfs.number(rail.volts_file) * self.sysfs.number(rail.amps_file) / 1e6

    def _read(self) -> tuple[float, dict[str, float]]:
        watts = {label: self.rail_watts(rail) for label, rail in self.rails.items()}
        return sum(watts[r] for r in self.total_rails), watts

    @property
    def description(self) -> str:
        what = "module input" if self.boundary is Boundary.MODULE_INPUT else "sum of SoC rails, excludes the carrier"
        return f"Jetson INA3221 {' + '.join(self.total_rails)} ({what}) at {self.where}"


def find_hwmon_chips(sysfs: Sysfs) -> list[Path]:
    """INA3221 hwmon dirs: under the i2c driver, and any /sys/class/hwmon entry named ina3221."""
    dirs = sorted(sysfs.path("/sys/bus/i2c/drivers/ina3221").glob("*/hwmon/hwmon*"))
    dirs += [
        d for d in sorted(sysfs.path("/sys/class/hwmon").glob("hwmon*")) if sysfs.maybe_text(d / "name") == "ina3221"
    ]
    unique: dict[Path, Path] = {}
    for d in dirs:
        unique.setdefault(d.resolve(), d)
    return list(unique.values())


def hwmon_rails(sysfs: Sysfs, chip: Path) -> dict[str, Rail]:
    """Labelled, enabled channels 1-3 (4-6 are shunt voltages, 7 the shunt sum; `NC` = not connected)."""
    rails = {}
    for ch in (1, 2, 3):
        label = sysfs.maybe_text(chip / f"in{ch}_label")
        if not label or label == "NC" or sysfs.maybe_text(chip / f"in{ch}_enable") == "0":
            continue
        volts, amps = chip / f"in{ch}_input", chip / f"curr{ch}_input"
        if volts.exists() and amps.exists():
            rails[label] = Rail(label, volts, amps)
    return rails


class Ina3221Meter(RailMeter):
    kind_name = "ina3221"

    def __init__(
        self,
        root: Path | str = "/",
        *,
        total_rails: Sequence[str] = (),
        per_rail: bool = True,
        opener: Callable[[Path], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        sysfs = Sysfs(root, opener)
        chips = find_hwmon_chips(sysfs)
        if not chips:
            raise SensorUnavailableError(
                f"no INA3221 hwmon device under {sysfs.path('/sys/bus/i2c/drivers/ina3221')} "
                "(not a Jetson on JetPack 5/6?)"
            )
        rails: dict[str, Rail] = {}
        for chip in chips:
            for label, rail in hwmon_rails(sysfs, chip).items():
                rails[label if label not in rails else f"{label}@{chip.name}"] = rail
        # The chip's conversion time bounds how often a new value appears.
        interval_ms = sysfs.maybe_text(chips[0] / "update_interval")
        if interval_ms and interval_ms.isdigit() and int(interval_ms) > 0:
            self.max_rate_hz = min(100.0, 1000.0 / int(interval_ms))
        super().__init__(rails, sysfs, ", ".join(str(c) for c in chips), total_rails, per_rail, clock)
