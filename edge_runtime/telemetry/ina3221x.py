"""Jetson INA3221 through NVIDIA's legacy IIO `ina3221x` driver (JetPack 4, L4T <= 32).

Layout: `/sys/bus/i2c/drivers/ina3221x/<bus>-<addr>/iio:device<N>/` with 0-based channels
`rail_name_<n>`, `in_voltage<n>_input` (mV), `in_current<n>_input` (mA) and `in_power<n>_input` (mW).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from edge_runtime.errors import SensorUnavailableError
from edge_runtime.telemetry.base import Sysfs
from edge_runtime.telemetry.ina3221 import Rail, RailMeter

_RAIL_NAME = re.compile(r"rail_name_(\d+)$")


def iio_rails(sysfs: Sysfs, device: Path) -> dict[str, Rail]:
    rails = {}
    for name_file in sorted(device.glob("rail_name_*")):
        match = _RAIL_NAME.match(name_file.name)
        label = sysfs.maybe_text(name_file)
        if not match or not label or label == "NC":
            continue
        n = match.group(1)
        power = device / f"in_power{n}_input"
        volts, amps = device / f"in_voltage{n}_input", device / f"in_current{n}_input"
        if power.exists() or (volts.exists() and amps.exists()):
            rails[label] = Rail(label, volts, amps, power if power.exists() else None)
    return rails


class Ina3221xMeter(RailMeter):
    kind_name = "ina3221x"

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
        devices = sorted(sysfs.path("/sys/bus/i2c/drivers/ina3221x").glob("*/iio:device*"))
        if not devices:
            raise SensorUnavailableError(
                f"no ina3221x IIO device under {sysfs.path('/sys/bus/i2c/drivers/ina3221x')} (not JetPack 4?)"
            )
        rails: dict[str, Rail] = {}
        for device in devices:
            for label, rail in iio_rails(sysfs, device).items():
                rails[label if label not in rails else f"{label}@{device.parent.name}"] = rail
        super().__init__(rails, sysfs, ", ".join(str(d) for d in devices), total_rails, per_rail, clock)
