"""The figures of one generation run, shared by `edge-bench` (per trial) and `edge-run --stats`.

Speed figures come from `GenerationStats`; achieved weight bandwidth is the manifest's weight bytes
read per token times decode tokens/s; energy comes from the sampler's prefill and decode phases
(telemetry/accounting.py, which edge-serve shares). Energy figures sit in their own `energy` mapping whose
`source` says "estimate" when no sensor produced them (docs/architecture.md §9), and energy above idle is a
separate, labelled mapping. Tokens per joule is generated tokens / (prefill + decode joules), the research
note's headline (§5.5).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from edge_runtime.generate import GenerationStats
from edge_runtime.telemetry import EnergyReport
from edge_runtime.telemetry.accounting import describe_meter as describe_meter
from edge_runtime.telemetry.accounting import energy_figures
from edge_runtime.telemetry.accounting import source_word as source_word

# The figures `compare` and `summary` show: (dotted path, label, unit, which way is better).
MAIN_FIGURES: tuple[tuple[str, str, str, str], ...] = (
    ("ttft_ms", "TTFT", "ms", "lower"),
    ("prefill_tokens_per_s", "prefill", "tok/s", "higher"),
    ("decode_tokens_per_s", "decode", "tok/s", "higher"),
    ("itl_ms.p50", "ITL p50", "ms", "lower"),
    ("itl_ms.p90", "ITL p90", "ms", "lower"),
    ("itl_ms.p99", "ITL p99", "ms", "lower"),
    ("peak_rss_bytes", "peak RSS", "B", "lower"),
    ("weight_bandwidth_gb_s", "weight bandwidth", "GB/s", "higher"),
    ("energy.total_j", "energy (prefill+decode)", "J", "lower"),
    ("energy.avg_watts", "average power", "W", "lower"),
    ("energy.tokens_per_joule", "tokens per joule", "tok/J", "higher"),
    ("energy.above_idle.tokens_per_joule", "tokens per joule above idle", "tok/J", "higher"),
)
ENERGY_PREFIX = "energy."


def weight_bandwidth_gb_s(weight_bytes_per_token: int, decode_tps: float) -> float:
    """Bytes of weights streamed per second while decoding (every weight is read once per token)."""
    return weight_bytes_per_token * decode_tps / 1e9


def run_figures(
    stats: GenerationStats, weight_bytes_per_token: int, report: EnergyReport | None = None
) -> dict[str, Any]:
    """Every figure of one run; `report` must hold one 'prefill' and one 'decode' phase (and may hold 'load')."""
    figures: dict[str, Any] = stats.to_dict()
    figures["weight_bandwidth_gb_s"] = weight_bandwidth_gb_s(weight_bytes_per_token, stats.decode_tps)
    figures["energy"] = None
    if report is not None:
        phases = {p.name: p for p in report.phases}
        figures["energy"] = energy_figures(
            stats.generated_tokens, phases["prefill"], phases["decode"], report, phases.get("load")
        )
    return figures


def get(figures: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path, or None where any step is missing."""
    value: Any = figures
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def median_figures(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-figure medians over runs (nested mappings too); a figure missing in any run is None."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r.get(key) for r in runs]
        if all(isinstance(v, Mapping) for v in values):
            out[key] = median_figures(values)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = statistics.median(values)
        elif all(v == values[0] for v in values):
            out[key] = values[0]
        else:
            out[key] = None  # mixed (e.g. above-idle missing in one run): no median to give
    return out


def _num(value: Any, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def format_speed(f: Mapping[str, Any]) -> str:
    """TTFT, tokens/s, ITL, RSS and bandwidth on one line."""
    itl = f["itl_ms"]
    return (
        f"TTFT {_num(f['ttft_ms'], '.1f')} ms | prefill {_num(f['prefill_tokens_per_s'], '.1f')} tok/s | "
        f"decode {_num(f['decode_tokens_per_s'], '.1f')} tok/s | ITL p50/p90/p99 {_num(itl['p50'], '.2f')}/"
        f"{_num(itl['p90'], '.2f')}/{_num(itl['p99'], '.2f')} ms | peak RSS {f['peak_rss_bytes'] / 2**20:.0f} MiB | "
        f"weight bandwidth {_num(f['weight_bandwidth_gb_s'], '.3f')} GB/s"
    )


def format_energy(f: Mapping[str, Any]) -> str:
    """Energy per phase and tokens per joule; every number is followed by '(estimate)' without a sensor."""
    e = f.get("energy")
    if e is None:
        return "energy: not measured"
    tag = " (estimate)" if e["source"] == "estimate" else ""
    load = "" if e.get("load_j") is None else f"load {e['load_j']:.3f} J, "
    line = (
        f"energy{tag}: {load}prefill {_num(e['prefill_j'], '.3f')} J + decode {_num(e['decode_j'], '.3f')} J = "
        f"{_num(e['total_j'], '.3f')} J at {_num(e['avg_watts'], '.2f')} W | "
        f"{_num(e['tokens_per_joule'], '.2f')} tok/J total{tag}"
    )
    above = e.get("above_idle")
    if above is not None:
        ratio = above["tokens_per_joule"]
        figure = f"{ratio:.2f} tok/J" if ratio is not None else "n/a (no energy above idle)"
        line += f" | above idle ({_num(above['idle_watts'], '.2f')} W idle{tag}): {figure}{tag}"
    return line
