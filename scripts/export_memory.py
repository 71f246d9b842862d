"""Each export's memory estimate beside its measured peak, and its wall time per stage.

    python scripts/export_memory.py --case "demo fp32=demo" --case "demo nuc=demo --target nuc" \\
        --case "SmolLM2 GGUF int4=$(python -m tests.real_model --gguf) --quant int4" [--write PAGE]

Each case is `LABEL=SOURCE [edge-export flags]`: one `edge-export SOURCE -o OUT FLAGS` process under
`/usr/bin/time -v` (its peak is the process's maximum resident set). The estimate is what the export printed
before the work (`estimated peak memory`, and for a .gguf the conversion's `needs about`: the larger of the
two); the stages' seconds and peaks are the manifest's (`provenance.stage_seconds`, `stage_peak_rss_bytes`).
The goal the table checks: the estimate never under the peak, and within 20% above it. `--write PAGE`
writes the table as a dated page naming the CPU and commit (replaced, not appended). A case that fails is a
row saying so, with its log's last line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from export_scale import Timed, timed

_EXPORT_ESTIMATE = re.compile(r"estimated peak memory ([\d,]+) MB")
_CONVERSION_ESTIMATE = re.compile(r"conversion to float32 needs about ([\d,]+) MB")
STAGES = ("load", "weights", "graph", "write", "validate", "checksums")


@dataclass(frozen=True)
class Result:
    label: str
    command: str
    estimate_mb: int | None
    conversion_mb: int | None
    peak_mb: float | None
    wall_s: float | None
    stages: dict[str, float]
    failure: str | None = None
    phase_mb: dict[str, int] | None = None  # the estimate's phases (manifest `estimated_phase_bytes`)
    stage_peak_mb: dict[str, int] | None = None  # the process's peak when each stage ended


def _mb(pattern: re.Pattern[str], text: str) -> int | None:
    m = pattern.search(text)
    return int(m.group(1).replace(",", "")) if m else None


def run_case(spec: str, work: Path) -> Result:
    label, _, rest = spec.partition("=")
    argv = shlex.split(rest)
    if not label or not argv:
        raise SystemExit(f"--case {spec!r}: write LABEL=SOURCE [edge-export flags]")
    out = work / re.sub(r"\W+", "-", label)
    log = out.with_suffix(".log")
    cli = Path(sys.executable).with_name("edge-export")
    cmd = [str(cli) if cli.exists() else "edge-export", argv[0], "-o", str(out), *argv[1:], "--overwrite"]
    shown = "edge-export " + shlex.join([argv[0], "-o", "OUT", *argv[1:]])
    try:
        t: Timed | None = timed(cmd, log)
        failure = None
    except SystemExit:
        t, failure = None, (log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
        if "Command exited" in failure or "Exit status" in failure:  # /usr/bin/time's lines: find the error
            errors = [x for x in log.read_text(errors="replace").splitlines() if x.startswith("Error")]
            failure = errors[-1] if errors else failure
    text = log.read_text(errors="replace")
    stages: dict[str, float] = {}
    phases = peaks = None
    manifest = out / "manifest.json"
    if manifest.exists():
        provenance = json.loads(manifest.read_text())["provenance"]
        stages = provenance.get("stage_seconds", {})
        phases = {k: round(v / 1e6) for k, v in provenance.get("estimated_phase_bytes", {}).items()}
        peaks = {k: round(v / 1e6) for k, v in provenance.get("stage_peak_rss_bytes", {}).items()}
        out.with_suffix(".provenance.json").write_text(json.dumps(provenance, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    return Result(
        label,
        shown,
        _mb(_EXPORT_ESTIMATE, text),
        _mb(_CONVERSION_ESTIMATE, text),
        None if t is None else round(t.peak_rss_mib * 2**20 / 1e6),
        None if t is None else t.wall_s,
        stages,
        failure,
        phases,
        peaks,
    )


def table(results: list[Result]) -> str:
    head = "| export | estimate MB | peak MB | estimate / peak | wall s | " + " | ".join(STAGES) + " |"
    lines = [head, "| --- " * (5 + len(STAGES)) + "|"]
    for r in results:
        if r.failure is not None or r.peak_mb is None:
            cells = " - |" * (1 + len(STAGES))
            estimate = "-" if r.estimate_mb is None else f"{r.estimate_mb:,}"
            lines.append(f"| {r.label} | {estimate} | - | failed: {r.failure} |{cells}")
            continue
        estimate = max(x for x in (r.estimate_mb, r.conversion_mb, 0) if x is not None)
        ratio = f"{100 * (estimate / r.peak_mb - 1):+.0f}%"
        stage_cells = " | ".join(f"{r.stages[s]:.1f}" if s in r.stages else "-" for s in STAGES)
        lines.append(f"| {r.label} | {estimate:,} | {r.peak_mb:,.0f} | {ratio} | {r.wall_s:.1f} | {stage_cells} |")
    return "\n".join(lines)


# Each phase of the estimate against the process's peak when the stages it covers ended (a peak only grows: a
# stage's figure is its own peak where it is above the stage's before it)
PHASE_STAGES = {"prepare": "weights", "graph": "write", "validate": "validate"}


def phase_table(results: list[Result]) -> str:
    head = "| export | " + " | ".join(f"{p} est. / peak at {s} MB" for p, s in PHASE_STAGES.items()) + " |"
    lines = [head, "| --- " * (1 + len(PHASE_STAGES)) + "|"]
    for r in results:
        if not r.phase_mb or not r.stage_peak_mb:
            continue
        cells = [
            f"{r.phase_mb.get(p, 0):,} / {r.stage_peak_mb[s]:,}" if s in r.stage_peak_mb else "-"
            for p, s in PHASE_STAGES.items()
        ]
        lines.append(f"| {r.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def page(results: list[Result], cases: list[str]) -> str:
    from edge_runtime.bench.environment import cpu_model

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()
    regen = "python scripts/export_memory.py " + " ".join(f"--case {shlex.quote(c)}" for c in cases)
    return "\n".join(
        [
            "# Export memory: the estimate beside the peak",
            "",
            f"Measured {datetime.now(timezone.utc):%Y-%m-%d} on {cpu_model(default='unknown CPU')} "
            f"({os.cpu_count()} logical CPUs), commit {commit or 'unknown'}"
            + (" + uncommitted changes" if dirty else "")
            + f"; load average {load[0]:.1f} at the end of the run. One `edge-export` process per row under "
            "`/usr/bin/time -v`: its peak is the process's maximum resident set; the estimate is what the export "
            "printed before the work (for a .gguf the larger of the conversion's and the export's); the stages' "
            "seconds are the manifest's. The estimate must never be under the peak, and is meant to be within "
            "20% above it. Wall times move with the machine's load: compare them only within one run.",
            "",
            "Regenerate (this replaces the page; the real models' paths from `python -m tests.real_model --gguf` "
            f"and `python -m tests.real_gemma`): `{regen} --write docs/benchmarks/export-memory.md`",
            "",
            table(results),
            "",
            "By phase: the estimate's phases beside the process's peak when the stages they cover had ended "
            "(a peak only grows, so a phase's own peak shows where it is above the one before):",
            "",
            phase_table(results),
            "",
            "Commands:",
            "",
            *[f"- {r.label}: `{r.command}`" for r in results],
            "",
        ]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", required=True, help="LABEL=SOURCE [edge-export flags]")
    ap.add_argument("--work", type=Path, help="where bundles and logs go (default: a temporary directory)")
    ap.add_argument("--write", type=Path, help="write the table as a dated Markdown page (replaced)")
    a = ap.parse_args()
    if not Path("/usr/bin/time").exists():
        raise SystemExit("needs /usr/bin/time (GNU time, for -v); install the `time` package")
    work = a.work or Path(tempfile.mkdtemp(prefix="export-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for spec in a.case:
        results.append(run_case(spec, work))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    print(table(results))
    print(phase_table(results))
    if a.write:
        a.write.write_text(page(results, a.case))
    return 0


if __name__ == "__main__":
    sys.exit(main())
