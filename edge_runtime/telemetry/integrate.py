"""Energy from a sample log: trapezoids for power readers, exact differences for energy counters.

Pure functions over a list of `Sample`s, so they are tested on synthetic traces without threads.
A failed read splits the log: no energy is integrated across it, and the span from the last good
sample before it to the first good one after is reported as a `Gap`.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from edge_runtime.telemetry.base import MeterKind


@dataclass(frozen=True)
class Sample:
    t: float
    value: float | None  # watts or cumulative joules; None when the read failed
    rails: Mapping[str, float] = field(default_factory=dict)
    error: str = ""  # why the read failed

    @property
    def ok(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class Gap:
    start: float  # the last good sample before the failures (or the first failure)
    end: float  # the next good sample (or the end of the run)
    failures: int
    error: str  # the first failure's message

    @property
    def seconds(self) -> float:
        return self.end - self.start


def segments(samples: Sequence[Sample]) -> list[tuple[Sample, Sample]]:
    """Consecutive pairs of good samples with no failed read between them."""
    return [(a, b) for a, b in itertools.pairwise(samples) if a.ok and b.ok and b.t > a.t]


def find_gaps(samples: Sequence[Sample], end: float) -> list[Gap]:
    gaps: list[Gap] = []
    last_good: float | None = None
    open_gap: tuple[float, int, str] | None = None  # (start, failures, first error)
    for s in samples:
        if not s.ok:
            if open_gap is None:
                open_gap = (last_good if last_good is not None else s.t, 1, s.error)
            else:
                open_gap = (open_gap[0], open_gap[1] + 1, open_gap[2])
            continue
        if open_gap is not None:
            gaps.append(Gap(open_gap[0], s.t, open_gap[1], open_gap[2]))
            open_gap = None
        last_good = s.t
    if open_gap is not None:
        gaps.append(Gap(open_gap[0], max(end, samples[-1].t), open_gap[1], open_gap[2]))
    return gaps


def _lerp(t: float, t0: float, v0: float, t1: float, v1: float) -> float:
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def integrate(
    pairs: Sequence[tuple[Sample, Sample]],
    kind: MeterKind,
    start: float,
    end: float,
    value: Callable[[Sample], float | None] = lambda s: s.value,
) -> tuple[float, float]:
    """(joules, covered seconds) over [start, end], values interpolated linearly to the window edges."""
    joules = covered = 0.0
    for a, b in pairs:
        u, v = max(start, a.t), min(end, b.t)
        va, vb = value(a), value(b)
        if v <= u or va is None or vb is None:
            continue
        pu, pv = _lerp(u, a.t, va, b.t, vb), _lerp(v, a.t, va, b.t, vb)
        joules += (pu + pv) / 2 * (v - u) if kind is MeterKind.POWER else pv - pu
        covered += v - u
    return joules, covered


def interval_watts(pairs: Sequence[tuple[Sample, Sample]], kind: MeterKind) -> list[float]:
    """Power per sampling interval: the mean of its ends (power) or its counter slope (energy)."""
    if kind is MeterKind.POWER:
        return [(a.value + b.value) / 2 for a, b in pairs if a.value is not None and b.value is not None]
    return [(b.value - a.value) / (b.t - a.t) for a, b in pairs if a.value is not None and b.value is not None]


def spread(values: Sequence[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0
