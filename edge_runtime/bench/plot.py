"""A self-contained HTML page with an inline SVG of power over time, the phases shaded and named.

Written by hand (no plotting dependency, nothing fetched): one polyline per sampler run (runs are
not joined across the pauses between them), a band per phase, the idle baseline as a dashed line,
and the report's text summary underneath. An estimate says so in the title and on the axis.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from edge_runtime.telemetry import EnergyReport

PHASE_COLORS = {
    "load": "#9e9e9e",
    "idle": "#cfd8dc",
    "warmup": "#ffe082",
    "prefill": "#ef9a9a",
    "decode": "#90caf9",
}
_OTHER_COLOR = "#c5e1a5"
_W, _H = 960, 380
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 20, 40, 50


def nice_step(span: float, target: int = 5) -> float:
    """A tick step of 1, 2, 2.5 or 5 times a power of ten giving about `target` intervals over `span`:
    ticks at 0, 2, 4, 6 W rather than 0, 6.16, 12.32."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Ticks from the multiple of the step at or below `lo` to the one at or above `hi`."""
    step = nice_step(hi - lo, target)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(i * step, 10) for i in range(first, last + 1)]


def _label(v: float) -> str:
    return f"{v:g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"


def phase_spans(runs: Sequence[tuple[str, EnergyReport]]) -> list[tuple[str, float, float]]:
    """(name, start, end) of every phase; a run that marked no phase is one span named by the caller."""
    spans = []
    for name, report in runs:
        if report.phases:
            spans += [(p.name, p.start, p.end) for p in report.phases]
        else:
            spans.append((name.rstrip("0123456789 ") or name, report.total.start, report.total.end))  # "warmup 2"
    return spans


def power_svg(
    runs: Sequence[tuple[str, EnergyReport]], *, estimate: bool, idle_watts: float | None = None, title: str = ""
) -> str:
    traces = [r.power_trace() for _name, r in runs]
    spans = phase_spans(runs)
    times = [t for tr in traces for t, _w in tr] + [t for _n, a, b in spans for t in (a, b)]
    watts = [w for tr in traces for _t, w in tr] + ([idle_watts] if idle_watts is not None else [])
    t0, t1 = min(times), max(times)
    t1 = t1 if t1 > t0 else t0 + 1.0
    w_ticks = nice_ticks(0.0, max([*watts, 1e-3]) * 1.05)
    w1 = w_ticks[-1]
    flat = len({round(w, 6) for tr in traces for _t, w in tr}) <= 1  # a constant model, not a measurement
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(t: float) -> float:
        return _LEFT + (t - t0) / (t1 - t0) * pw

    def y(w: float) -> float:
        return _TOP + ph - w / w1 * ph

    tag = " (estimate)" if estimate else ""
    out = [
        f'<svg viewBox="0 0 {_W} {_H}" width="100%" style="max-width:{_W}px" role="img" font-family="sans-serif" '
        f'font-size="12"><title>{html.escape(title + tag)}</title>',
        f'<text x="{_LEFT}" y="22" font-size="15">{html.escape(title)}{tag}</text>',
    ]
    for name, a, b in spans:  # bands first, so the trace is drawn over them
        width = max(x(b) - x(a), 1.0)  # a millisecond phase still shows as a hairline
        color = PHASE_COLORS.get(name, _OTHER_COLOR)
        out.append(
            f'<rect class="phase" data-phase="{html.escape(name)}" x="{x(a):.2f}" y="{_TOP}" width="{width:.2f}" '
            f'height="{ph}" fill="{color}" fill-opacity="0.55"><title>{html.escape(name)}: '
            f"{a - t0:.3f} to {b - t0:.3f} s</title></rect>"
        )
    out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    for t in nice_ticks(0.0, t1 - t0, 8):
        if t <= t1 - t0 + 1e-9:
            out.append(f'<text x="{x(t0 + t):.1f}" y="{_TOP + ph + 16}" text-anchor="middle">{_label(t)}</text>')
    for w in w_ticks:
        out.append(f'<text x="{_LEFT - 6}" y="{y(w) + 4:.1f}" text-anchor="end">{_label(w)}</text>')
        out.append(f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{y(w):.1f}" y2="{y(w):.1f}" stroke="#0001"/>')
    out.append(f'<text x="{_LEFT + pw / 2}" y="{_H - 10}" text-anchor="middle">time, s</text>')
    out.append(f'<text transform="translate(16 {_TOP + ph / 2}) rotate(-90)" text-anchor="middle">power, W{tag}</text>')
    if idle_watts is not None:
        out.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{y(idle_watts):.1f}" y2="{y(idle_watts):.1f}" '
            f'stroke="#555" stroke-dasharray="6 4"/><text x="{_LEFT + pw - 4}" y="{y(idle_watts) - 4:.1f}" '
            f'text-anchor="end">idle {idle_watts:.2f} W{tag}</text>'
        )
    dash = ' stroke-dasharray="5 4"' if estimate else ""  # an estimate must not look like a measured trace
    for (name, report), tr in zip(runs, traces, strict=True):
        if tr:
            points = " ".join(f"{x(t):.2f},{y(w):.2f}" for t, w in tr)
            out.append(
                f'<polyline class="power" fill="none" stroke="#b71c1c" stroke-width="1.5"{dash} points="{points}"/>'
            )
        # Each run (warmup, trial 1, ...) named where it starts, so trials can be told apart.
        a = max(report.total.start, t0)
        out.append(
            f'<text class="run" x="{x(a) + 3:.1f}" y="{_TOP + 13}" font-size="11" fill="#333">'
            f"{html.escape(name)}</text>"
        )
    if estimate:
        what = "a constant" if flat else "an"
        out.append(
            f'<text class="estimate-note" x="{_LEFT + pw / 2}" y="{_TOP + ph / 2}" text-anchor="middle" font-size="14" '
            f'fill="#b71c1c">no power sensor: the dashed line is {what} estimate from CPU utilisation and TDP, '
            "not a measurement</text>"
        )
    names = list(dict.fromkeys(n for n, _a, _b in spans))  # legend in order of first appearance
    lx = _LEFT + 320
    for i, name in enumerate(names):
        color = PHASE_COLORS.get(name, _OTHER_COLOR)
        out.append(
            f'<rect x="{lx + i * 95}" y="12" width="12" height="12" fill="{color}"/>'
            f'<text x="{lx + i * 95 + 16}" y="22">{html.escape(name)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def power_html(
    runs: Sequence[tuple[str, EnergyReport]],
    *,
    estimate: bool,
    boundary: str,
    summary: str,
    idle_watts: float | None = None,
    title: str = "edge-bench: power over time",
) -> str:
    """The whole page: heading, boundary, the SVG, and the text summary (no scripts, links or fonts)."""
    tag = " (estimate)" if estimate else ""
    note = (
        "<p><strong>Estimate:</strong> no power sensor was readable; every watt and joule here is an "
        "estimate from CPU utilisation and the target's TDP, not a measurement.</p>"
        if estimate
        else ""
    )
    svg = power_svg(runs, estimate=estimate, idle_watts=idle_watts, title=title)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}{tag}</title>"
        # pre-wrap: the summary's long lines wrap instead of running off a narrow window.
        "<style>body{font-family:sans-serif;margin:1.5em;max-width:1100px}"
        "pre{background:#f5f5f5;padding:1em;white-space:pre-wrap;overflow-wrap:anywhere}</style>"
        f"</head><body><h1>{html.escape(title)}{tag}</h1>{note}"
        f"<p>Measurement boundary: {html.escape(boundary)}</p>\n{svg}\n"
        f"<pre>{html.escape(summary)}</pre></body></html>\n"
    )
