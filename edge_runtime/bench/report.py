"""The versioned JSON benchmark report, its text rendering, and `compare` (ratios B/A).

Report layout (`report_version` 1): environment, target, bundle, settings, measurement (meter,
boundary, whether it is an estimate, sampler overhead, gaps), load, idle, per-trial figures and
their medians. Energy figures carry `source` "estimate" when no sensor produced them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edge_runtime.atomic_write import write_file
from edge_runtime.bounded_read import read_text_bounded
from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.telemetry import EnergyReport

from .environment import bundle_info, environment
from .figures import (
    ENERGY_PREFIX,
    MAIN_FIGURES,
    describe_meter,
    format_energy,
    format_speed,
    get,
    median_figures,
    source_word,
)
from .runner import BenchRun

REPORT_VERSION = 1


def measurement(run: BenchRun) -> dict[str, Any]:
    """The meter and boundary every energy figure belongs to, and how well the samples covered the runs."""
    reports = run.energy_reports()
    first = reports[0]
    t0 = first.total.start
    return {
        **describe_meter(first),
        "requested_rate_hz": first.requested_rate_hz,
        "notes": list(run.meter_notes),
        "samples": sum(sum(1 for s in r.samples if s.ok) for r in reports),
        "sampler_read_s": sum(r.read_seconds for r in reports),
        "gaps": [
            {"start_s": g.start - t0, "end_s": g.end - t0, "failures": g.failures, "error": g.error}
            for r in reports
            for g in r.gaps
        ],
        "complete": all(r.complete for r in reports),
    }


def _phase_block(report: EnergyReport, name: str) -> dict[str, Any]:
    p = report.by_phase().get(name, report.total)
    return {
        "seconds": p.duration_s,
        "energy_j": p.joules,
        "avg_watts": p.avg_watts,
        "source": source_word(report.estimate),
    }


def build_report(run: BenchRun, target: Mapping[str, Any], env_root: Path | str = "/") -> dict[str, Any]:
    """The versioned report of a finished run; `target` names the profile and how it was chosen."""
    idle = None
    if run.idle_baseline is not None and run.idle is not None:
        base = run.idle_baseline
        idle = {
            "watts": base.watts,
            "stdev_watts": base.stdev_watts,
            "duration_s": base.duration_s,
            "samples": base.samples,
            "gaps": base.gaps,
            "source": source_word(run.idle.estimate),
            "when": "after load: model resident, nothing running",
        }
    g = run.engine.geometry
    return {
        "report_version": REPORT_VERSION,
        "tool": "edge-bench",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(env_root),
        "target": dict(target),
        "bundle": bundle_info(run.bundle_dir, run.engine.manifest),
        "settings": {
            **run.settings.to_dict(),
            "sample_hz": run.sample_hz,
            "threads": run.load_options.threads,  # None: ONNX Runtime's default (all cores)
            "cache": {"sinks": g.sinks, "window": g.window},
            "speculative": run.speculative,
        },
        "measurement": measurement(run),
        "load": _phase_block(run.load, "load"),
        "idle": idle,
        "trials": run.trial_figures,
        "median": median_figures(run.trial_figures),
    }


def write_json(report: Mapping[str, Any], path: str | Path) -> None:
    """Write atomically (temp file + rename): a crash never leaves half a report. A device or FIFO
    (/dev/null, /dev/stdout) is written through, never replaced (atomic_write.py)."""
    text = json.dumps(report, indent=2) + "\n"
    write_file(path, [text.encode("utf-8")], mode=0o644)  # a report is kept and shared like a bundle (0644)


# A report is tens of KB (trials, per-phase figures): a larger file is not one, and is not read whole.
MAX_REPORT_BYTES = 16 << 20


def read_report(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise EdgeRuntimeError(f"report '{path}' does not exist; write one with edge-bench --json-out")
    try:  # a regular file only: a FIFO would block, /dev/zero never end
        data = json.loads(read_text_bounded(path, MAX_REPORT_BYTES, "report"))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise EdgeRuntimeError(
            f"report '{path}' is not valid JSON ({exc}); pass an edge-bench --json-out file"
        ) from exc
    version = data.get("report_version") if isinstance(data, dict) else None
    if version != REPORT_VERSION:
        raise EdgeRuntimeError(
            f"report '{path}' has report_version {version!r:.40}; this edge-bench reads version {REPORT_VERSION} "
            "(re-run edge-bench to get one)"
        )
    # What compare() reads, of the types it reads them as: an edited report is one line, not a KeyError
    shape = {"median": dict, "measurement": dict, "settings": dict}
    bad = [k for k, t in shape.items() if not isinstance(data.get(k), t)]
    m = data.get("measurement")
    if not bad and not (isinstance(m.get("estimate"), bool) and isinstance(m.get("boundary"), str)):
        bad = ["measurement.estimate/boundary"]
    if bad:
        raise EdgeRuntimeError(f"report '{path}' lacks {', '.join(bad)} (or holds another type); pass an edge-bench "
                               "--json-out file")  # fmt: skip
    return data


def cpu_line(env: Mapping[str, Any]) -> str:
    """The CPU, its kernel-relevant features and the kernels that ran: every speed figure depends on them."""
    features = ", ".join(env.get("cpu_features") or []) or "features unknown"
    kernels = env.get("edge_kernels") or "not available"
    return f"{env.get('cpu', 'unknown')} ({features}); edge kernels: {kernels}"


def format_report(report: Mapping[str, Any]) -> str:
    """The text edge-bench prints: settings, boundary, medians, and every energy figure labelled."""
    m, s, med = report["measurement"], report["settings"], report["median"]
    tag = " (estimate)" if m["estimate"] else ""
    lines = [
        f"device      {report['environment']['device']} | target {report['target']['name']} | "
        f"onnxruntime {report['environment']['onnxruntime']}",
        f"cpu         {cpu_line(report['environment'])}",
        f"bundle      {report['bundle']['path']} sha256 {report['bundle']['sha256'][:16]}... "
        f"({report['bundle']['weight_bytes_per_token'] / 1e6:.2f} MB weights read per token)",
        f"settings    {s['prompt_tokens']} prompt + {s['gen_tokens']} generated tokens (greedy, EOS ignored), "
        f"{s['trials']} trials after {s['warmup']} warm-up, cache {s['cache']['sinks']}+{s['cache']['window']}",
        f"power       {m['label']}; sampled at {m['rate_hz']:g} Hz, {m['samples']} samples, "
        f"sampler reads {m['sampler_read_s'] * 1e3:.1f} ms",
    ]
    lines += [f"            {n}" for n in m["notes"]]  # meters skipped, and why
    if m["gaps"]:
        lines.append(f"            {len(m['gaps'])} gap(s) without readings: energy covers only the sampled time")
    load = report["load"]
    lines.append(f"load        {load['seconds']:.3f} s, {load['energy_j']:.3f} J{tag}")
    if report["idle"] is not None:
        i = report["idle"]
        lines.append(f"idle        {i['watts']:.3f} W ± {i['stdev_watts']:.3f}{tag} over {i['duration_s']:.1f} s")
    lines.append(f"median      {format_speed(med)}")
    spec = med.get("speculative")
    if spec is not None:
        lines.append(
            f"            speculative ({s['speculative']}): {spec['acceptance']:.0%} of proposals accepted, "
            f"{spec['tokens_per_step']:.2f} tokens per target call"
        )
    lines.append(f"            {format_energy(med)}")
    return "\n".join(lines)


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows (figure, A, B, B/A) over the medians, and warnings where the two are not like for like."""
    rows = []
    for path, label, unit, better in MAIN_FIGURES:
        va, vb = (_number(get(r["median"], path)) for r in (a, b))
        ratio = vb / va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va != 0 else None
        est = path.startswith(ENERGY_PREFIX) and (a["measurement"]["estimate"] or b["measurement"]["estimate"])
        row = {"figure": path, "label": label, "unit": unit, "better": better, "a": va, "b": vb, "ratio": ratio}
        rows.append({**row, "estimate": est})
    warnings = []
    ma, mb = a["measurement"], b["measurement"]
    if ma["boundary"] != mb["boundary"]:
        warnings.append(
            f"energy boundaries differ ({ma['boundary']} vs {mb['boundary']}): energy ratios are not like for like"
        )
    for key in ("prompt_tokens", "gen_tokens"):
        if a["settings"].get(key) != b["settings"].get(key):
            warnings.append(f"settings differ: {key} {a['settings'].get(key)} vs {b['settings'].get(key)}")
    return rows, warnings


def _number(v: Any) -> float | int | None:
    """A figure as compare prints it: a number, else None (n/a), whatever an edited report holds there."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def format_compare(rows: list[dict[str, Any]], warnings: list[str], name_a: str, name_b: str) -> str:
    def cell(v: Any) -> str:
        return "n/a" if v is None else f"{v:.4g}"

    lines = [f"A = {name_a}", f"B = {name_b}", f"{'figure':<64} {'A':>12} {'B':>12} {'B/A':>8}"]
    for r in rows:
        label = f"{r['label']} ({r['unit']}, {r['better']} is better)" + (" estimate" if r["estimate"] else "")
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(f"{label:<64} {cell(r['a']):>12} {cell(r['b']):>12} {ratio:>8}")
    lines += [f"warning: {w}" for w in warnings]
    return "\n".join(lines)
