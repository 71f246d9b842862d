"""Energy integration on synthetic traces, and the sampling thread: phases, idle baseline, gaps."""

from __future__ import annotations

import math
import random
import shutil
import threading
import time
from pathlib import Path

import pytest

from edge_runtime.errors import SensorReadError, TelemetryError
from edge_runtime.telemetry import (
    Boundary,
    CpuEstimateMeter,
    Ina3221Meter,
    MeterKind,
    PowerMeter,
    Reading,
    Sample,
    Sampler,
)
from edge_runtime.telemetry.integrate import find_gaps, integrate, segments

FIXTURES = Path(__file__).parent / "fixtures" / "telemetry"


def power(t: float) -> float:
    return 5.0 + 3.0 * math.sin(math.pi * t) + 0.5 * t


def energy(a: float, b: float) -> float:
    """The exact integral of `power` over [a, b]."""
    return 5.0 * (b - a) - 3.0 / math.pi * (math.cos(math.pi * b) - math.cos(math.pi * a)) + 0.25 * (b * b - a * a)


def _times(n: int, span: float, seed: int = 7) -> list[float]:
    rng = random.Random(seed)  # jittered 10 Hz sampling, as a busy sampler thread produces
    return [0.0, *sorted(rng.uniform(0, span) for _ in range(n - 2)), span]


# ---------------------------------------------------------------------------------------------
# Pure integration
# ---------------------------------------------------------------------------------------------


def test_trapezoid_recovers_a_known_integral_within_one_percent():
    samples = [Sample(t, power(t)) for t in _times(101, 10.0)]
    joules, covered = integrate(segments(samples), MeterKind.POWER, 0.0, 10.0)
    assert joules == pytest.approx(energy(0.0, 10.0), rel=0.01)
    assert covered == pytest.approx(10.0)


def test_phase_windows_interpolate_to_their_edges():
    samples = [Sample(t / 10, power(t / 10)) for t in range(101)]
    for a, b in [(0.0, 2.05), (2.05, 7.33), (7.33, 10.0), (3.31, 3.34)]:
        joules, covered = integrate(segments(samples), MeterKind.POWER, a, b)
        assert joules == pytest.approx(energy(a, b), rel=0.01)
        assert covered == pytest.approx(b - a)


def test_energy_counters_use_exact_differences():
    samples = [Sample(t, 1000.0 + energy(0.0, t)) for t in _times(41, 10.0)]
    joules, _ = integrate(segments(samples), MeterKind.ENERGY, 0.0, 10.0)
    assert joules == pytest.approx(energy(0.0, 10.0), rel=1e-12)  # no integration error at sample edges


def test_no_energy_is_integrated_across_a_failed_read():
    samples = [Sample(float(t), 10.0) for t in range(4)]
    samples += [Sample(3.5, None, error="SensorReadError: gone"), Sample(4.2, None, error="SensorReadError: again")]
    samples += [Sample(float(t), 10.0) for t in range(5, 9)]
    joules, covered = integrate(segments(samples), MeterKind.POWER, 0.0, 8.0)
    assert covered == pytest.approx(6.0)  # [0, 3] and [5, 8]
    assert joules == pytest.approx(60.0)
    gaps = find_gaps(samples, end=8.0)
    assert len(gaps) == 1
    assert (gaps[0].start, gaps[0].end, gaps[0].failures) == (3.0, 5.0, 2)
    assert gaps[0].error == "SensorReadError: gone" and gaps[0].seconds == 2.0


def test_a_gap_that_never_closes_runs_to_the_end():
    samples = [Sample(0.0, 1.0), Sample(1.0, 1.0), Sample(1.5, None, error="x")]
    (gap,) = find_gaps(samples, end=4.0)
    assert (gap.start, gap.end) == (1.0, 4.0)


# ---------------------------------------------------------------------------------------------
# The sampling thread (injected clock: time advances a fixed step per call)
# ---------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self, step: float = 0.001) -> None:
        self.t, self.step, self.lock = 0.0, step, threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            self.t += self.step
            return self.t


class FakeMeter(PowerMeter):
    kind_name = "fake"
    boundary = Boundary.MODULE_INPUT

    def __init__(self, clock, watts=power, fail_reads=(), kind=MeterKind.POWER, max_rate_hz=1000.0):
        super().__init__(clock)
        self.watts, self.fail, self.kind, self.max_rate_hz = watts, set(fail_reads), kind, max_rate_hz
        self.reads = 0

    @property
    def description(self) -> str:
        return "fake module input"

    def _value(self, t: float) -> tuple[float, dict[str, float]]:
        n, self.reads = self.reads, self.reads + 1
        if n in self.fail:
            raise SensorReadError(f"read {n}: device gone")
        value = self.watts(t) if self.kind is MeterKind.POWER else energy(0.0, t)
        return value, {"half": value / 2}

    def read(self) -> Reading:
        # One clock call per read: the value belongs exactly to its timestamp.
        t = self.clock()
        value, rails = self._value(t)
        return Reading(t, value, rails)

    def _read(self):
        return self._value(self.clock())


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the sampler thread made no progress"
        time.sleep(0.002)


def test_sampler_integrates_phases_against_the_exact_energy():
    clock = FakeClock()
    sampler = Sampler(FakeMeter(clock), rate_hz=500)
    sampler.start()
    for phase in ("load", "prefill", "decode"):
        sampler.mark(phase)
        target = sampler.samples_taken + 8
        _wait_for(lambda target=target: sampler.samples_taken >= target)
    report = sampler.stop()
    assert [p.name for p in report.phases] == ["load", "prefill", "decode"]
    assert report.complete and not report.gaps
    for p in (*report.phases, report.total):
        assert p.joules == pytest.approx(energy(p.start, p.end), rel=0.01)
        assert p.complete and p.avg_watts == pytest.approx(p.joules / p.duration_s)
        assert p.rails["half"] == pytest.approx(p.joules / 2)
    assert report.phases[-1].end == report.total.end
    assert report.boundary is Boundary.MODULE_INPUT and report.label().startswith("module_input")
    assert report.read_seconds > 0 and report.rate_hz == 500


def test_sampler_with_an_energy_counter():
    clock = FakeClock()
    sampler = Sampler(FakeMeter(clock, kind=MeterKind.ENERGY), rate_hz=500)
    with sampler:
        sampler.mark("decode")
        _wait_for(lambda: sampler.samples_taken >= 10)
    report = sampler.last_report
    assert report is not None and not sampler.running
    assert report.kind is MeterKind.ENERGY
    for p in (report.phases[0], report.total):
        assert p.joules == pytest.approx(energy(p.start, p.end), rel=0.01)
    trace = report.power_trace()
    assert len(trace) == len(report.samples) - 1
    assert all(w == pytest.approx(power(t), rel=0.01) for t, w in trace)


def test_a_failing_read_mid_run_is_a_gap_and_the_run_goes_on():
    clock = FakeClock()
    meter = FakeMeter(clock, watts=lambda t: 4.0, fail_reads={3, 4, 5})
    sampler = Sampler(meter, rate_hz=500)
    sampler.start()
    sampler.mark("decode")
    _wait_for(lambda: sampler.samples_taken >= 12)
    report = sampler.stop()
    (gap,) = report.gaps
    assert gap.failures == 3 and "device gone" in gap.error and "SensorReadError" in gap.error
    good = [s.t for s in report.samples if s.ok]
    assert gap.start == good[2] and gap.end == good[3]  # last good before, first good after
    run = report.total
    assert not report.complete and run.gap_s == pytest.approx(gap.seconds)
    assert run.joules == pytest.approx(4.0 * run.covered_s)  # nothing guessed for the gap


def test_a_sensor_that_vanishes_mid_run_is_reported(tmp_path):
    root = Path(shutil.copytree(FIXTURES / "orin-nano-jp6", tmp_path / "nano"))
    meter = Ina3221Meter(root, clock=FakeClock())
    sampler = Sampler(meter, rate_hz=500)
    assert sampler.rate_hz == 100.0  # capped by the chip's update_interval
    sampler.start()
    sampler.mark("decode")
    _wait_for(lambda: sampler.samples_taken >= 3)
    shutil.rmtree(root / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1")
    _wait_for(lambda: sampler.failed_reads >= 2)
    report = sampler.stop()
    (gap,) = report.gaps
    assert "in1_input" in gap.error
    assert gap.end == report.total.end  # it never came back
    assert report.total.covered_s > 0 and report.total.gap_s > 0
    assert report.total.joules == pytest.approx(5064 * 981 / 1e6 * report.total.covered_s)


def test_idle_baseline_gives_energy_above_idle_as_a_separate_figure():
    clock = FakeClock()
    level = {"watts": 2.0}
    sampler = Sampler(FakeMeter(clock, watts=lambda t: level["watts"]), rate_hz=500)
    idle = sampler.measure_idle(0.05)
    assert idle.watts == pytest.approx(2.0) and idle.stdev_watts == pytest.approx(0.0)
    assert idle.samples >= 2 and idle.gaps == 0
    level["watts"] = 5.0
    sampler.start()
    sampler.mark("decode")
    _wait_for(lambda: sampler.samples_taken >= 6)
    report = sampler.stop()
    decode = report.phases[0]
    assert report.idle == idle
    assert decode.joules == pytest.approx(5.0 * decode.covered_s)
    assert decode.joules_above_idle == pytest.approx(3.0 * decode.covered_s)


def test_idle_baseline_without_readings_is_an_error():
    sampler = Sampler(FakeMeter(FakeClock(), fail_reads=range(10_000)), rate_hz=500)
    with pytest.raises(TelemetryError, match=r"no idle baseline.*device gone"):
        sampler.measure_idle(0.02)


def test_repeated_phases_sum_by_name_and_none_ends_a_phase():
    clock = FakeClock()
    sampler = Sampler(FakeMeter(clock, watts=lambda t: 1.0), rate_hz=500)
    sampler.start()
    for name in ("decode", None, "decode"):
        sampler.mark(name)
        target = sampler.samples_taken + 3
        _wait_for(lambda target=target: sampler.samples_taken >= target)
    report = sampler.stop()
    assert [p.name for p in report.phases] == ["decode", "decode"]
    total = report.by_phase()["decode"]
    assert total.joules == pytest.approx(sum(p.joules for p in report.phases))
    assert total.duration_s == pytest.approx(sum(p.duration_s for p in report.phases))
    assert total.duration_s < report.total.duration_s  # the unnamed stretch between them is not decode


def test_marks_and_stops_are_checked():
    clock = FakeClock()
    sampler = Sampler(FakeMeter(clock), rate_hz=500)
    with pytest.raises(TelemetryError, match="before start"):
        sampler.mark("decode")
    with pytest.raises(TelemetryError, match=r"stop\(\) before start"):
        sampler.stop()
    sampler.start()
    sampler.mark("prefill")
    with pytest.raises(TelemetryError, match=r"marked at t=0.0 before the previous mark"):
        sampler.mark("decode", t=0.0)
    with pytest.raises(TelemetryError, match="non-empty string"):
        sampler.mark("")
    with pytest.raises(TelemetryError, match="already started"):
        sampler.start()
    with pytest.raises(TelemetryError, match="before the last mark"):
        sampler.stop(t=0.0)
    assert sampler.stop().phases[0].name == "prefill"
    with pytest.raises(TelemetryError, match="must be > 0"):
        Sampler(FakeMeter(clock), rate_hz=0)


def test_estimate_runs_are_labelled_estimate(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/stat").write_text("cpu  100 0 0 900 0 0 0 0 0 0\n")
    sampler = Sampler(CpuEstimateMeter(tdp_watts=10, idle_watts=2, root=tmp_path, clock=FakeClock()), rate_hz=50)
    assert sampler.rate_hz == 10.0
    sampler.start()
    _wait_for(lambda: sampler.samples_taken >= 2)
    report = sampler.stop()
    assert report.estimate and report.boundary is Boundary.ESTIMATE
    assert report.label().startswith("estimate")
    assert report.total.avg_watts == pytest.approx(2.0)  # no CPU ticks in the fixture: idle power
