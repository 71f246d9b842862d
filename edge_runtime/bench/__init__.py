"""`edge-bench`: fixed-length benchmark runs with per-phase energy, versioned reports, plots and a field log.

- `figures`: the figures of one generation run (shared with `edge-run --stats`)
- `runner`: load, idle baseline, warm-up, N sampled trials
- `report`: the versioned JSON report, its text, `compare`
- `plot`: self-contained HTML + inline SVG of power over time
- `fieldlog`: append-only, fsync'd JSON-lines log and its summary
"""

from edge_runtime.bench.figures import MAIN_FIGURES, describe_meter, median_figures, run_figures
from edge_runtime.bench.runner import BenchRun, BenchSettings, PhaseMarks, deterministic_prompt, run_bench

__all__ = [
    "MAIN_FIGURES",
    "BenchRun",
    "BenchSettings",
    "PhaseMarks",
    "describe_meter",
    "deterministic_prompt",
    "median_figures",
    "run_bench",
    "run_figures",
]
