"""The labelled fallback when no sensor is readable: power estimated from CPU utilisation and TDP.

P = idle + (TDP - idle) x utilisation, utilisation from `/proc/stat` deltas between reads. It is a
model, not a measurement: its boundary is ESTIMATE and every description says "estimate".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from edge_runtime.errors import SensorReadError, SensorUnavailableError
from edge_runtime.telemetry.base import Boundary, PowerMeter, Sysfs


def cpu_times(text: str) -> tuple[int, int]:
    """(busy, total) jiffies from the aggregate `cpu` line of /proc/stat."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            # user nice system idle iowait irq softirq steal; guest time is already inside user.
            values = [int(v) for v in fields[1:9]]
            if len(values) < 4:
                break
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            return sum(values) - idle, sum(values)
    raise SensorReadError("/proc/stat has no aggregate 'cpu' line")


class CpuEstimateMeter(PowerMeter):
    kind_name = "estimate"
    boundary = Boundary.ESTIMATE
    max_rate_hz = 10.0  # jiffies tick at 100-250 Hz: faster reads see too few ticks to mean anything

    def __init__(
        self,
        tdp_watts: float,
        idle_watts: float,
        root: Path | str = "/",
        *,
        opener: Callable[[Path], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock)
        if not 0 <= idle_watts < tdp_watts:
            raise SensorUnavailableError(
                f"estimate needs 0 <= idle_watts ({idle_watts}) < tdp_watts ({tdp_watts}); fix the target profile"
            )
        self.tdp_watts, self.idle_watts = float(tdp_watts), float(idle_watts)
        self.sysfs = Sysfs(root, opener)
        self.stat_path = self.sysfs.path("/proc/stat")
        try:
            self._last = cpu_times(self.sysfs.text(self.stat_path))
        except (SensorReadError, ValueError) as exc:
            raise SensorUnavailableError(f"cannot estimate power: {exc}") from exc
        self._util = 0.0

    def _read(self) -> tuple[float, dict[str, float]]:
        try:
            busy, total = cpu_times(self.sysfs.text(self.stat_path))
        except ValueError as exc:
            raise SensorReadError(f"{self.stat_path} is garbled: {exc}") from exc
        d_busy, d_total = busy - self._last[0], total - self._last[1]
        if d_total > 0:  # no tick since the last read: keep the previous utilisation
            self._util = min(1.0, max(0.0, d_busy / d_total))
            self._last = (busy, total)
        watts = self.idle_watts + (self.tdp_watts - self.idle_watts) * self._util
        return watts, {}

    @property
    def description(self) -> str:
        return (
            f"estimate from CPU utilisation (/proc/stat) between {self.idle_watts:g} W idle "
            f"and {self.tdp_watts:g} W TDP; no sensor measured this"
        )
