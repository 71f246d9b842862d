"""A background thread that reads one meter at a fixed rate, and the per-phase energy it yields.

The caller marks phases (load, prefill, decode, ...) with timestamps on the meter's clock; samples
are interpolated to the phase edges, so marking costs no sensor read on the inference thread. A read
that fails (sensor vanished, permission revoked, command error) is logged and the run goes on; the
report lists the gap and integrates nothing across it.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time

from edge_runtime.errors import TelemetryError
from edge_runtime.telemetry.base import PowerMeter
from edge_runtime.telemetry.integrate import Sample, find_gaps, integrate, interval_watts, segments, spread
from edge_runtime.telemetry.results import EnergyReport, IdleBaseline, PhaseEnergy

_FIRST_SAMPLE_TIMEOUT_S = 10.0  # start() waits this long for the first read before going on without it


class Sampler:
    """Samples `meter` at `rate_hz` (capped at the meter's `max_rate_hz`) between start() and stop()."""

    def __init__(self, meter: PowerMeter, rate_hz: float = 10.0) -> None:
        if not rate_hz > 0:
            raise TelemetryError(f"sampler rate {rate_hz!r} Hz must be > 0")
        self.meter = meter
        self.clock = meter.clock  # marks and samples must share one clock
        self.requested_rate_hz = float(rate_hz)
        self.rate_hz = min(self.requested_rate_hz, meter.max_rate_hz)
        self.idle: IdleBaseline | None = None
        self.last_report: EnergyReport | None = None  # what the latest stop() returned (also via `with`)
        self._reset()

    def _reset(self) -> None:
        self._log: list[Sample] = []
        self._marks: list[tuple[str | None, float]] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._read_seconds = 0.0
        self._t_start = 0.0

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def samples_taken(self) -> int:
        return len(self._log)

    @property
    def failed_reads(self) -> int:
        return sum(1 for s in self._log if not s.ok)

    # -- the thread -------------------------------------------------------------------------

    def _sample(self) -> None:
        t0 = time.perf_counter()
        try:
            r = self.meter.read()
            self._log.append(Sample(r.t, r.value, r.rails))
        except Exception as exc:  # any failing read becomes a recorded gap, never a dead run
            self._log.append(Sample(self.clock(), None, {}, f"{type(exc).__name__}: {exc}"))
        self._read_seconds += time.perf_counter() - t0

    def _run(self, first: threading.Event) -> None:
        period = 1.0 / self.rate_hz
        due = time.monotonic()
        while True:
            self._sample()
            first.set()
            if self._stop.is_set():
                return  # this last read came after stop() was called: it closes the run
            due += period
            delay = due - time.monotonic()
            if delay < 0:  # a slow read: carry on from now rather than bursting to catch up
                due, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    # -- the caller's side ------------------------------------------------------------------

    def start(self) -> None:
        if self.running:
            raise TelemetryError("sampler already started; call stop() first")
        self._reset()
        first = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(first,), name="power-sampler", daemon=True)
        self._thread.start()
        first.wait(_FIRST_SAMPLE_TIMEOUT_S)
        self._t_start = self._log[0].t if self._log else self.clock()

    def mark(self, phase: str | None, t: float | None = None) -> None:
        """Begin `phase` at `t` (default: now), ending the previous one; `None` only ends the current one."""
        if not self.running:
            raise TelemetryError(f"mark({phase!r}) before start(); start the sampler first")
        if phase is not None and (not isinstance(phase, str) or not phase):
            raise TelemetryError(f"phase name {phase!r} must be a non-empty string")
        t = self.clock() if t is None else float(t)
        last = self._marks[-1][1] if self._marks else self._t_start
        if t < last:
            raise TelemetryError(f"phase {phase!r} marked at t={t} before the previous mark at t={last}")
        self._marks.append((phase, t))

    def stop(self, t: float | None = None) -> EnergyReport:
        """End the run at `t` (default: now), take a last sample, and build the report."""
        if self._thread is None:
            raise TelemetryError("stop() before start(); start the sampler first")
        t_end = self.clock() if t is None else float(t)
        last = self._marks[-1][1] if self._marks else self._t_start
        if t_end < last:
            raise TelemetryError(f"stop at t={t_end} is before the last mark at t={last}; stop later or omit t")
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.last_report = self._report(t_end)
        return self.last_report

    def measure_idle(self, seconds: float) -> IdleBaseline:
        """Sample for `seconds` with nothing running; later reports give energy above this baseline too."""
        if self.running:
            raise TelemetryError("measure_idle() while a run is being sampled; call it before start()")
        self.start()
        time.sleep(seconds)
        report = self.stop()
        if report.total.avg_watts is None:
            raise TelemetryError(
                f"no idle baseline: {report.meter} gave no two consecutive readings in {seconds} s "
                f"({report.gaps[0].error if report.gaps else 'too short'}); lengthen it or fix the sensor"
            )
        watts = interval_watts(segments(report.samples), report.kind)
        self.idle = IdleBaseline(
            watts=report.total.avg_watts,
            stdev_watts=spread(watts),
            duration_s=report.total.duration_s,
            covered_s=report.total.covered_s,
            samples=sum(1 for s in report.samples if s.ok),
            gaps=len(report.gaps),
        )
        return self.idle

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.running:
            self.stop()

    # -- the report -------------------------------------------------------------------------

    def _phase(self, name: str, start: float, end: float) -> PhaseEnergy:
        pairs = segments(self._log)
        kind = self.meter.kind
        joules, covered = integrate(pairs, kind, start, end)
        rail_names = sorted({k for s in self._log for k in s.rails})
        rails = {r: integrate(pairs, kind, start, end, lambda s, r=r: s.rails.get(r))[0] for r in rail_names}
        above = None if self.idle is None else joules - self.idle.watts * covered
        return PhaseEnergy(name, start, end, joules, covered, rails, above)

    def _report(self, t_end: float) -> EnergyReport:
        phases = []
        bounds = [*self._marks, (None, t_end)]
        for (name, t0), (_next, t1) in itertools.pairwise(bounds):
            if name is not None:
                phases.append(self._phase(name, t0, t1))
        return EnergyReport(
            meter=self.meter.kind_name,
            description=self.meter.description,
            boundary=self.meter.boundary,
            estimate=self.meter.estimate,
            kind=self.meter.kind,
            rate_hz=self.rate_hz,
            requested_rate_hz=self.requested_rate_hz,
            total=self._phase("run", self._t_start, t_end),
            phases=tuple(phases),
            gaps=tuple(
                # The last read comes after stop(): clip gaps to the run they are reported for.
                dataclasses.replace(g, start=max(g.start, self._t_start), end=min(g.end, t_end))
                for g in find_gaps(self._log, t_end)
                if g.end > self._t_start and g.start < t_end
            ),
            idle=self.idle,
            samples=tuple(self._log),
            read_seconds=self._read_seconds,
        )
