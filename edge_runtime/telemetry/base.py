"""The one interface every power meter implements, and the sysfs reading helper they share.

A meter is either a *power* source (instantaneous watts: INA3221, Pi PMIC, amdgpu, the estimate),
integrated by the sampler with the trapezoid rule, or an *energy* counter (cumulative joules: RAPL,
NVML), whose exact differences the sampler takes. Every meter names its measurement boundary, since
figures from different boundaries are not comparable.
"""

from __future__ import annotations

import abc
import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edge_runtime.errors import SensorPermissionError, SensorReadError

# Meter kinds a target profile may name (`power.meters`), in no particular order.
METER_KINDS = ("ina3221", "ina3221x", "rpi5-pmic", "rapl", "amdgpu", "nvml", "estimate")


class Boundary(enum.Enum):
    """What a meter's number covers. The value is the stable key written into reports."""

    MODULE_INPUT = "module_input"  # Jetson module input rail (VDD_IN): whole SoM, not the carrier
    SOC_RAILS = "soc_rails"  # a sum of SoC-side rails (AGX Orin: no input rail exists)
    PMIC_RAILS = "pmic_rails"  # Pi 5 PMIC outputs: not USB/HAT loads nor PMIC losses
    CPU_PACKAGE = "cpu_package"  # RAPL package(s): cores, iGPU, uncore (+ DRAM zone if present)
    PLATFORM_PSYS = "platform_psys"  # RAPL psys: SoC plus some platform components
    APU_SOCKET = "apu_socket"  # amdgpu socket power: on an APU this includes the CPU
    GPU_BOARD = "gpu_board"  # NVML: the discrete GPU board only
    ESTIMATE = "estimate"  # no sensor: CPU utilisation x TDP


class MeterKind(enum.Enum):
    POWER = "power"  # read() gives watts now
    ENERGY = "energy"  # read() gives joules accumulated since the meter was opened


@dataclass(frozen=True)
class Reading:
    """One read of a meter: `value` is watts (POWER) or cumulative joules (ENERGY); `rails` likewise."""

    t: float  # seconds on the sampler's monotonic clock
    value: float
    rails: Mapping[str, float] = field(default_factory=dict)


class PowerMeter(abc.ABC):
    """A power or energy source. Subclasses set the class attributes and implement `_read`."""

    kind_name: str = ""  # the profile's meter kind (METER_KINDS)
    kind: MeterKind = MeterKind.POWER
    boundary: Boundary = Boundary.ESTIMATE
    max_rate_hz: float = 100.0  # the fastest rate worth sampling at (read cost, sensor update rate)

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock

    @property
    def estimate(self) -> bool:
        return self.boundary is Boundary.ESTIMATE

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """One line naming the sensor, rails or domains used, and the boundary."""

    @abc.abstractmethod
    def _read(self) -> tuple[float, Mapping[str, float]]:
        """(total, per-rail) in watts or cumulative joules; raise SensorReadError when it cannot."""

    def read(self) -> Reading:
        # Stamp the middle of the read: a PMIC sweep takes ~23 ms, an I2C read ~0.5 ms per register.
        t0 = self.clock()
        value, rails = self._read()
        return Reading(t=(t0 + self.clock()) / 2, value=value, rails=dict(rails))

    def close(self) -> None:  # noqa: B027 - optional hook: most meters hold nothing to release
        """Release what the meter holds (library handles); the default holds nothing."""


def _read_text(path: Path) -> str:
    return path.read_text(encoding="ascii", errors="replace")


class Sysfs:
    """Reads small text files under an injectable root; `opener` lets tests fake permission errors."""

    def __init__(self, root: Path | str = "/", opener: Callable[[Path], str] | None = None) -> None:
        self.root = Path(root)
        self.opener = opener or _read_text

    def path(self, rel: str | Path) -> Path:
        rel = Path(rel)
        return self.root / rel.relative_to("/") if rel.is_absolute() else self.root / rel

    def text(self, path: Path) -> str:
        """The file's stripped text; PermissionError becomes SensorPermissionError, other OSErrors SensorReadError."""
        try:
            return self.opener(path).strip()
        except PermissionError as exc:
            raise SensorPermissionError(f"permission denied reading {path}") from exc
        except OSError as exc:
            raise SensorReadError(f"cannot read {path}: {exc.strerror or exc}") from exc

    def number(self, path: Path) -> float:
        text = self.text(path)
        try:
            return float(text)
        except ValueError:
            raise SensorReadError(f"{path} holds {text!r}, not a number") from None

    def maybe_text(self, path: Path) -> str | None:
        """The text, or None when the file is absent or unreadable (for optional discovery files)."""
        try:
            return self.text(path)
        except (SensorReadError, SensorPermissionError):
            return None
