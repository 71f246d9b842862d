"""Raspberry Pi 5 PMIC rails through `vcgencmd pmic_read_adc` (V x I summed over paired rails).

Each rail prints a current line (`VDD_CORE_A current(7)=...A`) and a voltage line (`VDD_CORE_V
volt(15)=...V`) with *different* ADC indexes, so lines are paired by rail name, never by index.
Rails with only a voltage (EXT5V, BATT) carry no power and are skipped; rail names drift across
firmware (0V8_SYS vs 0V8_SW), so no list is hard-coded.
"""

from __future__ import annotations

import math
import re
import subprocess
import time
from collections.abc import Callable, Sequence

from edge_runtime.errors import SensorPermissionError, SensorReadError, SensorUnavailableError
from edge_runtime.telemetry.base import Boundary, PowerMeter

COMMAND = ("vcgencmd", "pmic_read_adc")
_LINE = re.compile(r"^\s*([A-Za-z0-9_]+)_([AV])\s+(current|volt)\((\d+)\)=\s*([-+0-9.eE]+|nan)\s*([AV])\s*$")

Runner = Callable[[Sequence[str]], str]


def parse_pmic_adc(text: str) -> dict[str, float]:
    """Watts per rail that has both a current and a voltage line; unpaired and `nan` rails are left out."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    # The mailbox interface separates lines with NULs instead of newlines.
    for line in text.replace("\x00", "\n").splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        rail, suffix, quantity, _index, value, unit = match.groups()
        if suffix != unit or (quantity == "current") != (unit == "A"):
            continue  # a line that contradicts itself is not guessed at
        number = float(value)
        if math.isfinite(number):
            (amps if unit == "A" else volts)[rail] = number
    return {rail: amps[rail] * volts[rail] for rail in amps if rail in volts}


def run_command(argv: Sequence[str]) -> str:
    """Run a command and return its stdout; a non-zero exit is a SensorReadError with stderr in it."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=5, check=False)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise SensorReadError(f"`{' '.join(argv)}` exited with {proc.returncode}: {detail[0] if detail else ''}")
    return proc.stdout


class RpiPmicMeter(PowerMeter):
    kind_name = "rpi5-pmic"
    boundary = Boundary.PMIC_RAILS
    # The firmware ADC sweep takes ~23 ms per read; faster sampling steals time from inference.
    max_rate_hz = 10.0

    def __init__(self, runner: Runner | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self.runner = runner or run_command
        try:
            text = self.runner(COMMAND)
        except FileNotFoundError as exc:
            raise SensorUnavailableError(
                "`vcgencmd` not found: the Pi 5 PMIC reader needs Raspberry Pi OS's raspi-utils"
            ) from exc
        except PermissionError as exc:
            raise SensorPermissionError(
                "permission denied running `vcgencmd pmic_read_adc`; add the user to the `video` group"
            ) from exc
        except (OSError, subprocess.SubprocessError, SensorReadError) as exc:
            raise SensorUnavailableError(f"`vcgencmd pmic_read_adc` failed: {exc}") from exc
        if "failed to open vchiq" in text or "VCHI initialization failed" in text:
            raise SensorPermissionError(
                "`vcgencmd` cannot open the VideoCore interface; add the user to the `video` group"
            )
        watts = parse_pmic_adc(text)
        if not watts or "error_msg" in text:
            first = text.strip().splitlines()[0] if text.strip() else "no output"
            raise SensorUnavailableError(
                f"`vcgencmd pmic_read_adc` reported no rail with both current and voltage ({first!r}); "
                "this reader needs a Raspberry Pi 5; use an external meter on older boards"
            )
        self.rails = tuple(sorted(watts))

    def _read(self) -> tuple[float, dict[str, float]]:
        try:
            text = self.runner(COMMAND)
        except (OSError, subprocess.SubprocessError) as exc:
            raise SensorReadError(f"`vcgencmd pmic_read_adc` failed: {exc}") from exc
        watts = parse_pmic_adc(text)
        missing = [r for r in self.rails if r not in watts]
        if missing:
            # Summing fewer rails than at the start would silently shrink the boundary.
            raise SensorReadError(f"`vcgencmd pmic_read_adc` no longer reports rail(s) {', '.join(missing)}")
        return sum(watts[r] for r in self.rails), {r: watts[r] for r in self.rails}

    @property
    def description(self) -> str:
        return f"Raspberry Pi 5 PMIC rails, sum of V x I over {len(self.rails)} rails (excludes USB/HAT loads)"
