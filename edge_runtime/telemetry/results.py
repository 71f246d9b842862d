"""What a sampling run produces: energy per phase, the idle baseline, gaps, and the meter's boundary.

Figures above idle are always a separate, labelled field next to the total; a meter that is an
estimate says so in `estimate` and in its description, and `label()` puts the word in front.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from edge_runtime.telemetry.base import Boundary, MeterKind
from edge_runtime.telemetry.integrate import Gap, Sample, interval_watts, segments


@dataclass(frozen=True)
class PhaseEnergy:
    name: str
    start: float
    end: float
    joules: float  # over the covered time only: nothing is guessed for gaps
    covered_s: float  # time inside the phase with readings on both sides
    rails: Mapping[str, float]  # joules per rail / domain over the same covered time
    joules_above_idle: float | None = None  # joules - idle watts x covered time; None without a baseline

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    @property
    def gap_s(self) -> float:
        return max(0.0, self.duration_s - self.covered_s)

    @property
    def complete(self) -> bool:
        """True when readings cover the whole phase (allowing float rounding)."""
        return self.gap_s <= 1e-9 * max(1.0, abs(self.end))

    @property
    def avg_watts(self) -> float | None:
        return self.joules / self.covered_s if self.covered_s > 0 else None


@dataclass(frozen=True)
class IdleBaseline:
    watts: float  # mean power while idle, same meter and rate as the run
    stdev_watts: float  # spread of the per-interval power
    duration_s: float
    covered_s: float
    samples: int
    gaps: int


@dataclass(frozen=True)
class EnergyReport:
    meter: str  # the meter kind ("ina3221", "rapl", "estimate", ...)
    description: str  # sensor, rails and boundary in words
    boundary: Boundary
    estimate: bool  # True when no sensor produced these numbers
    kind: MeterKind
    rate_hz: float  # the rate sampled at (after the meter's cap)
    requested_rate_hz: float
    total: PhaseEnergy  # the whole run, start() to stop()
    phases: tuple[PhaseEnergy, ...]  # in the order they were marked
    gaps: tuple[Gap, ...]
    idle: IdleBaseline | None
    samples: tuple[Sample, ...]  # the raw log, for power-over-time plots
    read_seconds: float  # time spent inside meter reads: the sampler's own overhead

    @property
    def complete(self) -> bool:
        return not self.gaps and self.total.complete

    def label(self) -> str:
        """The boundary name to print next to every figure; an estimate is called one."""
        # An estimate's description already opens with the word "estimate".
        return self.description if self.estimate else f"{self.boundary.value}: {self.description}"

    def by_phase(self) -> dict[str, PhaseEnergy]:
        """Phases of the same name (e.g. decode over several trials) summed into one entry each."""
        out: dict[str, PhaseEnergy] = {}
        for p in self.phases:
            if p.name not in out:
                out[p.name] = p
                continue
            q = out[p.name]
            rails = {k: q.rails.get(k, 0.0) + p.rails.get(k, 0.0) for k in {*q.rails, *p.rails}}
            above = None
            if q.joules_above_idle is not None and p.joules_above_idle is not None:
                above = q.joules_above_idle + p.joules_above_idle
            # Summed phases keep the first start; duration is rebuilt from the summed durations.
            out[p.name] = PhaseEnergy(
                p.name,
                q.start,
                q.start + q.duration_s + p.duration_s,
                q.joules + p.joules,
                q.covered_s + p.covered_s,
                rails,
                above,
            )
        return out

    def power_trace(self) -> list[tuple[float, float]]:
        """(time, watts) points for plotting: samples for power meters, interval slopes for counters."""
        if self.kind is MeterKind.POWER:
            return [(s.t, s.value) for s in self.samples if s.value is not None]
        pairs = segments(self.samples)
        return [((a.t + b.t) / 2, w) for (a, b), w in zip(pairs, interval_watts(pairs, self.kind), strict=True)]
