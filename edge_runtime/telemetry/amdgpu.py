"""AMD APU socket power from the amdgpu hwmon (`power1_input` / `power1_average`, microwatts).

On an APU this is socket power and includes the CPU cores, and it is readable without root, which
makes it the best non-root source on Ryzen mini PCs. Some APUs expose only one of the two files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from edge_runtime.errors import SensorPermissionError, SensorUnavailableError
from edge_runtime.telemetry.base import Boundary, PowerMeter, Sysfs

POWER_FILES = ("power1_input", "power1_average")  # instantaneous first; the average lags by ~1 s


def find_amdgpu_hwmon(sysfs: Sysfs) -> list[Path]:
    dirs = sorted(sysfs.path("/sys/class/hwmon").glob("hwmon*"))
    dirs += sorted(sysfs.path("/sys/class/drm").glob("card*/device/hwmon/hwmon*"))
    unique: dict[Path, Path] = {}
    for d in dirs:
        if sysfs.maybe_text(d / "name") == "amdgpu":
            unique.setdefault(d.resolve(), d)
    return list(unique.values())


class AmdgpuMeter(PowerMeter):
    kind_name = "amdgpu"
    boundary = Boundary.APU_SOCKET
    max_rate_hz = 20.0  # the SMU refreshes socket power every few tens of milliseconds

    def __init__(
        self,
        root: Path | str = "/",
        *,
        opener: Callable[[Path], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock)
        self.sysfs = Sysfs(root, opener)
        hwmons = find_amdgpu_hwmon(self.sysfs)
        files = [d / f for d in hwmons for f in POWER_FILES if (d / f).exists()]
        if not files:
            where = self.sysfs.path("/sys/class/hwmon")
            found = "an amdgpu hwmon without power1_input/power1_average" if hwmons else "no amdgpu hwmon"
            raise SensorUnavailableError(f"{found} under {where} (not an AMD APU, or the amdgpu driver is not loaded)")
        # The first amdgpu device is the APU on a mini PC; a second one would be a discrete card.
        self.file = files[0]
        try:
            self._read()
        except SensorPermissionError as exc:
            raise SensorPermissionError(
                f"{exc}; amdgpu hwmon files are normally world-readable: check the mode"
            ) from exc

    def _read(self) -> tuple[float, dict[str, float]]:
        watts = self.sysfs.number(self.file) / 1e6
        return watts, {"socket": watts}

    @property
    def description(self) -> str:
        return f"amdgpu socket power {self.file.name} (APU: CPU + GPU + SoC) at {self.file.parent}"
