"""RAPL energy counters through the powercap sysfs (Intel; AMD Zen on Linux >= 5.11).

Zones are keyed by their `name` file, never by index (`intel-rapl:1` is psys on one machine, dram on
another). `energy_uj` wraps to 0 after `max_energy_range_uj`; each read adds the difference since the
last one, adding one range on wrap, so the sampler must read at least twice per wrap period (minutes
even at 100 W). Since CVE-2020-8694 `energy_uj` is root-only on most kernels.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import SensorPermissionError, SensorReadError, SensorUnavailableError
from edge_runtime.telemetry.base import Boundary, MeterKind, PowerMeter, Sysfs

PERMISSION_FIX = (
    "RAPL energy counters are readable by root only since CVE-2020-8694; run as root, or let this user read "
    "them with `sudo chmod a+r /sys/class/powercap/intel-rapl:*/energy_uj` (resets at boot: use a udev rule "
    "or systemd-tmpfiles to keep it)"
)


@dataclass(frozen=True)
class Zone:
    key: str  # "package-0", or "package-0/core" for a subzone
    name: str
    path: Path
    max_range_uj: int | None  # None when unreadable: a backwards step is then an error, not a wrap
    top_level: bool


def _zone_dirs(sysfs: Sysfs) -> list[Path]:
    """Zone dirs, flat (real sysfs: symlinks for every zone) or nested one level (fixture trees)."""
    base = sysfs.path("/sys/class/powercap")
    found: dict[Path, Path] = {}
    for d in sorted([*base.glob("intel-rapl*"), *base.glob("intel-rapl*/intel-rapl*")]):
        if (d / "energy_uj").exists() and (d / "name").exists():
            found.setdefault(d.resolve(), d)
    return list(found.values())


def discover_zones(sysfs: Sysfs) -> list[Zone]:
    dirs = _zone_dirs(sysfs)
    names = {d.name: sysfs.maybe_text(d / "name") or d.name for d in dirs}
    zones: dict[str, Zone] = {}
    # MSR zones first: an `intel-rapl-mmio` zone of the same name measures the same thing twice.
    for d in sorted(dirs, key=lambda p: ("mmio" in p.name, p.name)):
        ids = d.name.split(":")
        top = len(ids) == 2
        key = names[d.name] if top else f"{names.get(':'.join(ids[:2]), ':'.join(ids[:2]))}/{names[d.name]}"
        if key in zones:
            continue
        raw_max = sysfs.maybe_text(d / "max_energy_range_uj")
        max_range = int(raw_max) if raw_max and raw_max.isdigit() and int(raw_max) > 0 else None
        zones[key] = Zone(key, names[d.name], d, max_range, top)
    return list(zones.values())


def total_zones(zones: Sequence[Zone], domains: Sequence[str]) -> tuple[list[Zone], Boundary]:
    if domains:
        chosen = [z for z in zones if z.key in domains or z.name in domains]
        missing = [d for d in domains if not any(d in (z.key, z.name) for z in chosen)]
        if missing:
            raise SensorUnavailableError(
                f"RAPL domain(s) {', '.join(missing)} not found; present: {', '.join(z.key for z in zones)}"
            )
        psys = all(z.name == "psys" for z in chosen)
        return chosen, Boundary.PLATFORM_PSYS if psys else Boundary.CPU_PACKAGE
    psys = [z for z in zones if z.name == "psys"]
    if psys:
        return psys[:1], Boundary.PLATFORM_PSYS
    # Package and DRAM do not overlap (the package excludes the DIMMs); core/uncore are inside the package.
    chosen = [z for z in zones if (z.top_level and z.name.startswith("package-")) or z.name == "dram"]
    if not any(z.name.startswith("package-") for z in chosen):
        raise SensorUnavailableError(f"no RAPL package zone; zones present: {', '.join(z.key for z in zones)}")
    return chosen, Boundary.CPU_PACKAGE


class RaplMeter(PowerMeter):
    kind_name = "rapl"
    kind = MeterKind.ENERGY

    def __init__(
        self,
        root: Path | str = "/",
        *,
        domains: Sequence[str] = (),
        opener: Callable[[Path], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock)
        self.sysfs = Sysfs(root, opener)
        self.zones = discover_zones(self.sysfs)
        if not self.zones:
            raise SensorUnavailableError(
                f"no RAPL zone under {self.sysfs.path('/sys/class/powercap')} "
                "(needs the intel_rapl_msr module; AMD needs Linux >= 5.11)"
            )
        self.total, self.boundary = total_zones(self.zones, domains)
        self._last: dict[str, int] = {}
        self._acc_uj: dict[str, int] = {z.key: 0 for z in self.zones}
        try:
            for zone in self.zones:
                self._last[zone.key] = self._raw(zone)
        except SensorPermissionError as exc:
            raise SensorPermissionError(f"{exc}; {PERMISSION_FIX}") from exc

    def _raw(self, zone: Zone) -> int:
        text = self.sysfs.text(zone.path / "energy_uj")
        if not text.isdigit():
            raise SensorReadError(f"{zone.path / 'energy_uj'} holds {text!r}, not a counter")
        return int(text)

    def _advance(self, zone: Zone) -> None:
        raw, last = self._raw(zone), self._last[zone.key]
        if raw >= last:
            delta = raw - last
        elif zone.max_range_uj is not None:
            delta = raw + zone.max_range_uj - last  # one wrap; the sampler reads often enough for no more
        else:
            raise SensorReadError(
                f"{zone.path / 'energy_uj'} went from {last} to {raw} and max_energy_range_uj is unreadable"
            )
        self._last[zone.key] = raw
        self._acc_uj[zone.key] += delta

    def _read(self) -> tuple[float, dict[str, float]]:
        for zone in self.zones:
            self._advance(zone)
        joules = {key: uj / 1e6 for key, uj in self._acc_uj.items()}
        return sum(joules[z.key] for z in self.total), joules

    @property
    def description(self) -> str:
        what = "platform (psys)" if self.boundary is Boundary.PLATFORM_PSYS else "CPU package"
        return f"RAPL energy counter {' + '.join(z.key for z in self.total)} ({what})"
