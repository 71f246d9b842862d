"""Energy accounting of a generation: a sampler for a target, prefill/decode marks, joules per phase.

Shared by every front end that measures energy (edge-run --stats, edge-serve --energy, edge-bench), so it
lives beside the meters rather than in the benchmark: a generation is marked 'prefill' from its start to its
first token, then 'decode' to its last; its figures are joules per phase and tokens per joule over prefill +
decode (every generated token is in there), tagged "estimate" when no sensor produced them
(docs/architecture.md §9).
"""

from __future__ import annotations

from typing import Any, Protocol

from edge_runtime.telemetry.base import PowerMeter
from edge_runtime.telemetry.results import EnergyReport, PhaseEnergy
from edge_runtime.telemetry.sampler import Sampler
from edge_runtime.telemetry.select import MeterOptions, meter_for_profile


class _Event(Protocol):
    """What PhaseMarks reads of a generation's event (generate.TokenEvent)."""

    elapsed_s: float  # since the request started
    stats: object | None  # set on the last event only


def source_word(estimate: bool) -> str:
    """What every energy figure is tagged with: a model's output is called an estimate."""
    return "estimate" if estimate else "sensor"


def describe_meter(report: EnergyReport) -> dict[str, Any]:
    """The meter, boundary and coverage of one sampler run, for a report or a field-log record."""
    return {
        "meter": report.meter,
        "boundary": report.boundary.value,
        "label": report.label(),
        "source": source_word(report.estimate),
        "estimate": report.estimate,
        "rate_hz": report.rate_hz,
        "gaps": len(report.gaps),
        "complete": report.complete,
    }


def energy_figures(
    generated_tokens: int,
    prefill: PhaseEnergy,
    decode: PhaseEnergy,
    report: EnergyReport,
    load: PhaseEnergy | None = None,
) -> dict[str, Any]:
    """Joules per phase and tokens per joule over prefill + decode (every generated token is in there).

    Load energy, when the run sampled it, is given on its own and kept out of tokens per joule.
    """
    total = prefill.joules + decode.joules
    covered = prefill.covered_s + decode.covered_s
    duration = prefill.duration_s + decode.duration_s
    above = None
    if report.idle is not None and prefill.joules_above_idle is not None and decode.joules_above_idle is not None:
        above_total = prefill.joules_above_idle + decode.joules_above_idle
        above = {
            "idle_watts": report.idle.watts,
            "idle_stdev_watts": report.idle.stdev_watts,
            "prefill_j": prefill.joules_above_idle,
            "decode_j": decode.joules_above_idle,
            "total_j": above_total,
            # Idle noise can exceed a short run's increment: no ratio from a non-positive energy (or
            # from float residue when the run drew exactly idle power).
            "tokens_per_joule": generated_tokens / above_total if above_total > 1e-9 * abs(total) else None,
        }
    return {
        "source": source_word(report.estimate),
        "boundary": report.boundary.value,
        "load_j": None if load is None else load.joules,
        "prefill_j": prefill.joules,
        "decode_j": decode.joules,
        "total_j": total,
        "prefill_s": prefill.duration_s,
        "decode_s": decode.duration_s,
        "avg_watts": total / covered if covered > 0 else None,
        "tokens_per_joule": generated_tokens / total if total > 0 else None,
        "joules_per_token": total / generated_tokens if generated_tokens > 0 else None,
        "covered_fraction": covered / duration if duration > 0 else None,
        "above_idle": above,
    }


class PhaseMarks:
    """Marks 'prefill' from the request's start to its first token, then 'decode' to its last.

    Fed with the events of one `stream_generate`, it places the marks at the stream's own timings
    (start + `elapsed_s`), so the phases span exactly the TTFT and decode time the stats report,
    whatever the caller does after an event arrives. A `None` sampler makes every call a no-op.
    """

    def __init__(self, sampler: Sampler | None) -> None:
        self.sampler = sampler
        self._t0 = 0.0
        self._decoding = False

    def begin(self) -> None:
        """Call right before asking the stream for its first event."""
        if self.sampler is not None:
            self._t0 = self.sampler.clock()
            self.sampler.mark("prefill", self._t0)

    def see(self, event: _Event) -> None:
        if self.sampler is None:
            return
        t = self._t0 + event.elapsed_s
        if not self._decoding:
            self.sampler.mark("decode", t)  # the first token's elapsed time is the TTFT
            self._decoding = True
        if event.stats is not None:
            self.sampler.mark(None, t)


def open_sampler(
    profile: Any,
    meter: PowerMeter | None = None,
    rate_hz: float | None = None,
    meter_options: MeterOptions | None = None,
) -> tuple[Sampler, tuple[str, ...]]:
    """A sampler on `meter`, or on the first readable meter the profile names (notes say what was skipped)."""
    notes: tuple[str, ...] = ()
    if meter is None:
        choice = meter_for_profile(profile, meter_options)
        meter, notes = choice.meter, choice.notes
    return Sampler(meter, rate_hz=rate_hz or profile.power.sample_hz), notes
