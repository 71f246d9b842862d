"""Running a benchmark: load, optional idle baseline, warm-up runs, then N measured trials.

Each step is its own sampler run on one meter and one clock, so its energy is ready (and its field
log record can be written) as soon as it ends. Phases: 'load', 'idle', 'warmup', then per trial
'prefill' (prompt in, first token out) and 'decode' (the remaining tokens). Warm-up runs are sampled
for the plot only; no figure includes them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_runtime.engine import Engine, LoadOptions, apply_target, load
from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.generate import GenerationConfig, GenerationStats, stream_generate
from edge_runtime.telemetry import EnergyReport, IdleBaseline, MeterOptions, PowerMeter, Sampler
from edge_runtime.telemetry.accounting import PhaseMarks as PhaseMarks
from edge_runtime.telemetry.accounting import open_sampler
from edge_runtime.tokenizer import Tokenizer

from .figures import run_figures

if TYPE_CHECKING:
    from edge_runtime.speculative import SpeculativeDecoder

# A fixed public-domain passage: real text gives the tokenizer's usual merges, cycled to any length.
PROMPT_TEXT = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
    "arrows of outrageous fortune, or to take arms against a sea of troubles, and by opposing end them. "
    "To die, to sleep; no more; and by a sleep to say we end the heart-ache and the thousand natural shocks "
    "that flesh is heir to: 'tis a consummation devoutly to be wish'd. "
)


@dataclass(frozen=True)
class BenchSettings:
    prompt_tokens: int = 128
    gen_tokens: int = 128
    trials: int = 3
    warmup: int = 1
    idle_seconds: float = 0.0  # 0: no idle baseline, so no above-idle figures
    sample_hz: float | None = None  # None: the target profile's power.sample_hz

    def __post_init__(self) -> None:
        checks = [
            ("--prompt-tokens", self.prompt_tokens, self.prompt_tokens >= 1, "use 1 or more"),
            ("--gen-tokens", self.gen_tokens, self.gen_tokens >= 2, "use 2 or more (decode speed needs 2 tokens)"),
            ("--trials", self.trials, self.trials >= 1, "use 1 or more"),
            ("--warmup", self.warmup, self.warmup >= 0, "use 0 or more"),
            ("--idle-seconds", self.idle_seconds, self.idle_seconds >= 0, "use 0 (no baseline) or more"),
            ("--sample-hz", self.sample_hz, self.sample_hz is None or self.sample_hz > 0, "use a rate > 0"),
        ]
        for flag, value, ok, fix in checks:
            if not ok:
                raise EdgeRuntimeError(f"{flag} {value!r} is out of range; {fix}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "gen_tokens": self.gen_tokens,
            "trials": self.trials,
            "warmup": self.warmup,
            "idle_seconds": self.idle_seconds,
            "sampling": "greedy",
            "stop_on_eos": False,
        }


def deterministic_prompt(tokenizer: Tokenizer, n: int, avoid: Sequence[int] = ()) -> list[int]:
    """Exactly `n` prompt ids: the passage's ids (BOS first) with its body cycled; never an id in `avoid`."""
    ids = tokenizer.encode(PROMPT_TEXT)
    bos = tokenizer.spec.bos_token_id
    head = ids[:1] if ids and ids[0] == bos else []
    body = [i for i in ids[len(head) :] if i not in set(avoid)]
    if not body:
        raise EdgeRuntimeError("the tokenizer encodes the benchmark passage to no usable ids; check tokenizer.json")
    return [*head, *itertools.islice(itertools.cycle(body), n - len(head))][:n]


def sampled_generation(
    engine: Engine,
    tokenizer: Tokenizer,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    sampler: Sampler,
    speculative: SpeculativeDecoder | None = None,
) -> tuple[GenerationStats, EnergyReport]:
    """One generation inside its own sampler run, marked into prefill and decode."""
    marks = PhaseMarks(sampler)
    final: GenerationStats | None = None
    sampler.start()
    try:
        marks.begin()
        for event in stream_generate(engine, tokenizer, prompt_ids, config, speculative=speculative):
            marks.see(event)
            final = event.stats or final
    finally:
        report = sampler.stop()
    assert final is not None  # stream_generate always ends with a stats-carrying event
    return final, report


@dataclass
class BenchRun:
    """Everything a benchmark produced; `report.build_report` turns it into the JSON report."""

    settings: BenchSettings
    load_options: LoadOptions  # as applied: the target's threads, budget and cache geometry filled in
    bundle_dir: Path
    engine: Engine
    meter_notes: tuple[str, ...]
    sample_hz: float
    load: EnergyReport
    idle: EnergyReport | None  # the baseline's own sampler run (for the plot)
    idle_baseline: IdleBaseline | None
    warmups: list[EnergyReport] = field(default_factory=list)
    trials: list[EnergyReport] = field(default_factory=list)
    trial_figures: list[dict[str, Any]] = field(default_factory=list)
    speculative: str | None = None  # SpeculativeDecoder.describe() of the decoder every run used

    def energy_reports(self) -> list[EnergyReport]:
        """Every sampler run in time order."""
        return [name_report[1] for name_report in self.named_reports()]

    def named_reports(self) -> list[tuple[str, EnergyReport]]:
        """Every sampler run in time order, each with the phase name for a run that marked none (idle)."""
        runs = [("load", self.load), *([("idle", self.idle)] if self.idle else [])]
        warmups = [(f"warmup {i}" if len(self.warmups) > 1 else "warmup", r) for i, r in enumerate(self.warmups, 1)]
        return [*runs, *warmups, *((f"trial {i}", r) for i, r in enumerate(self.trials, 1))]


def run_bench(
    bundle_dir: str | Path,
    profile: Any,
    settings: BenchSettings,
    load_options: LoadOptions | None = None,
    *,
    meter: PowerMeter | None = None,
    meter_options: MeterOptions | None = None,
    on_trial: Callable[[int, dict[str, Any], EnergyReport], None] | None = None,
    progress: Callable[[str], None] | None = None,
    speculative: Callable[[Engine], SpeculativeDecoder | None] | None = None,
) -> BenchRun:
    """Benchmark `bundle_dir` on `profile`'s meters (or the given `meter`); `on_trial(i, figures, energy)` per trial.

    `meter_options` reach the meters (tests point them at fixture trees). `speculative` makes the decoder
    every run uses from the loaded engine (one decoder for all runs: its measured costs carry over, as in
    a long-lived process); each trial's figures then hold its acceptance and tokens per target step.
    """
    say = progress or (lambda _msg: None)
    sampler, notes = open_sampler(profile, meter, settings.sample_hz, meter_options)
    try:
        sampler.start()
        sampler.mark("load")
        engine = load(bundle_dir, load_options, target=profile)
        tokenizer = Tokenizer(engine.bundle.tokenizer_file, engine.manifest.tokenizer)
        load_report = sampler.stop()
        idle_report = baseline = None
        if settings.idle_seconds > 0:
            say(f"measuring idle power for {settings.idle_seconds:g} s (model loaded, nothing running)")
            baseline = sampler.measure_idle(settings.idle_seconds)
            idle_report = sampler.last_report
        run = BenchRun(
            settings=settings,
            load_options=apply_target(load_options or LoadOptions(), profile, engine.bundle),
            bundle_dir=Path(bundle_dir),
            engine=engine,
            meter_notes=notes,
            sample_hz=sampler.rate_hz,
            load=load_report,
            idle=idle_report,
            idle_baseline=baseline,
        )
        spec = speculative(engine) if speculative is not None else None
        run.speculative = spec.describe() if spec is not None else None
        m = engine.manifest
        prompt = deterministic_prompt(tokenizer, settings.prompt_tokens, m.tokenizer.eos_token_ids)
        config = GenerationConfig(max_tokens=settings.gen_tokens, stop_on_eos=False)
        for i in range(settings.warmup):
            say(f"warm-up {i + 1}/{settings.warmup} (not counted)")
            sampler.start()
            sampler.mark("warmup")
            for _event in stream_generate(engine, tokenizer, prompt, config, speculative=spec):
                pass
            run.warmups.append(sampler.stop())
        for i in range(settings.trials):
            before = replace(spec.stats) if spec is not None else None
            stats, report = sampled_generation(engine, tokenizer, prompt, config, sampler, spec)
            figures = run_figures(stats, m.graph.weight_bytes, report)
            if spec is not None and before is not None:
                figures["speculative"] = spec.stats.since(before).to_dict()
            run.trials.append(report)
            run.trial_figures.append(figures)
            say(f"trial {i + 1}/{settings.trials}: {stats.decode_tps:.1f} decode tok/s")
            if on_trial is not None:
                on_trial(i, figures, report)
        return run
    finally:
        if sampler.running:
            sampler.stop()
        sampler.meter.close()
