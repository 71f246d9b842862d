"""What `edge-export targets` lists: every built-in profile, what an export for it uses on this machine, which
one `--target auto` picks here, and the export time per 100M parameters where it was measured.

Export times come only from a measurements file: the one scripts/bench_export_time.py writes into the cache
directory (edge_runtime/cachedir.py), or one the user names. The installed package carries no figures measured
on other machines; without a file the listing says the time is not measured here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_runtime import kernels
from edge_runtime.bounded_read import read_bounded
from edge_runtime.cachedir import cache_dir
from edge_runtime.errors import TargetError
from edge_runtime.targets.detect import detect_target
from edge_runtime.targets.export_settings import ExportSettings, settings_for
from edge_runtime.targets.loader import known_targets, load_target
from edge_runtime.targets.schema import TargetProfile

MEASUREMENTS_FILE = "export-times.json"
MEASUREMENTS_FORMAT = 1
_MEASUREMENTS_MAX_BYTES = 1 << 20  # a few hundred bytes per export setting
NOT_MEASURED = "not measured on this machine (scripts/bench_export_time.py)"


def measurements_path() -> Path:
    """Where scripts/bench_export_time.py writes, and `edge-export targets` looks by default."""
    return cache_dir() / MEASUREMENTS_FILE


def settings_key(s: ExportSettings) -> str:
    """The settings an export's time depends on, as one string: profiles with the same key export alike (the
    cache geometry changes only the ring's size, not the work)."""
    return f"{s.flavor}/{s.quant}/block-{s.int4_block}/{s.kernel}/table-{s.table_bits}/mixed-{s.mixed}"


def here_settings(profile: TargetProfile) -> ExportSettings:
    """What `edge-export --target NAME` exports with on this machine (its kernel where the edge ops run here)."""
    return settings_for(profile, edge_kernels_here=kernels.available())


@dataclass(frozen=True)
class ExportTime:
    seconds: float  # wall-clock time of `edge-export MODEL -o OUT --target T`
    parameters: int  # the bundle's, from its manifest

    @property
    def per_100m(self) -> float:
        return self.seconds * 1e8 / self.parameters


@dataclass(frozen=True)
class Measurements:
    path: Path
    cpu: str
    machine: str
    measured_at: str  # ISO 8601, UTC
    model: str
    times: dict[str, ExportTime]  # settings_key -> time

    def describe(self) -> str:
        params = {t.parameters for t in self.times.values()}
        size = f", {next(iter(params)) / 1e6:.1f}M parameters" if len(params) == 1 else ""
        return (
            f"measured on {self.cpu} ({self.machine}), {self.measured_at[:10]}, exporting {self.model}{size}; "
            f"scaled linearly to 100M parameters ({self.path})"
        )


def read_measurements(path: Path) -> Measurements:
    """A measurements file, checked; TargetError in one line naming it otherwise."""
    raw = read_bounded(path, _MEASUREMENTS_MAX_BYTES, "export-time measurements", TargetError)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise TargetError(f"export-time measurements '{path}' are not JSON: {e}") from None
    bad = TargetError(
        f"export-time measurements '{path}' are not in format {MEASUREMENTS_FORMAT} "
        "(written by scripts/bench_export_time.py); measure again"
    )
    if not isinstance(data, dict) or data.get("format") != MEASUREMENTS_FORMAT:
        raise bad
    texts = [data.get(k) for k in ("cpu", "machine", "measured_at", "model")]
    exports = data.get("exports")
    if not all(isinstance(t, str) for t in texts) or not isinstance(exports, dict):
        raise bad
    times = {}
    for key, entry in exports.items():
        seconds = entry.get("seconds") if isinstance(entry, dict) else None
        parameters = entry.get("parameters") if isinstance(entry, dict) else None
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
            raise bad
        if isinstance(parameters, bool) or not (isinstance(parameters, int) and parameters > 0):
            raise bad
        times[key] = ExportTime(float(seconds), parameters)
    cpu, machine, measured_at, model = texts
    return Measurements(path, cpu, machine, measured_at, model, times)


@dataclass(frozen=True)
class TargetRow:
    profile: TargetProfile
    settings: ExportSettings  # what an export for it uses on this machine
    auto: bool  # the profile `--target auto` picks here
    export_time: ExportTime | None


@dataclass(frozen=True)
class Listing:
    rows: list[TargetRow]
    auto: str | None  # the profile `--target auto` picks here; None where detection fails
    auto_reason: str
    measurements: Measurements | None
    measurements_note: str  # where the export times come from, or why there are none


def listing(measurements: Path | None = None) -> Listing:
    """Every built-in profile as it applies here. `measurements`: a file the user names (its errors are
    theirs to see); None: the cache directory's, where the bench script wrote one."""
    try:
        detection = detect_target()
        auto, reason = detection.profile.name, detection.reason
    except TargetError as e:
        auto, reason = None, str(e)
    found, note = None, NOT_MEASURED
    if measurements is not None:
        found = read_measurements(measurements)
    elif measurements_path().is_file():
        try:
            found = read_measurements(measurements_path())
        except TargetError as e:  # a stale or damaged cache file must not stop the listing
            note = f"{NOT_MEASURED}: {e}"
    if found is not None:
        note = found.describe()
    rows = []
    for name in known_targets():
        profile = load_target(name)
        s = here_settings(profile)
        time = found.times.get(settings_key(s)) if found is not None else None
        rows.append(TargetRow(profile, s, name == auto, time))
    return Listing(rows, auto, reason, found, note)


def _quantization(s: ExportSettings) -> str:
    return s.quant + (f"+{s.mixed}" if s.mixed != "none" and s.quant.startswith("int4") else "")


def _block(s: ExportSettings) -> str | int | None:
    """What the Linear weights are quantized in: INT4 blocks, INT8 channels (a profile's block_size sizes INT4
    only: `edge-export --target` keeps INT8 per channel), or nothing."""
    if s.quant.startswith("int4"):
        return s.int4_block
    return "channel" if s.quant == "int8" else None


def _kernel(row: TargetRow) -> str:
    s = row.settings
    if s.flavor == "trt":
        return "tensorrt"
    if s.kernel == "edge":
        return f"edge ({kernels.isa() or 'unpinned'})"
    if row.profile.matmul_kernel == "edge" and s.quant != "none":
        return "mlas (edge n/a here)"
    return "mlas"


def _seconds(x: float) -> str:
    return f"{x:.1f} s" if x < 120 else f"{x / 60:.1f} min"


def to_json(result: Listing) -> dict[str, Any]:
    reason = kernels.unavailable_reason()
    return {
        "auto": {"target": result.auto, "reason": result.auto_reason},
        "edge_kernels": {"available": reason is None, "isa": kernels.isa(), "reason": reason},
        "export_times": None
        if result.measurements is None
        else {
            "file": str(result.measurements.path),
            "cpu": result.measurements.cpu,
            "machine": result.measurements.machine,
            "measured_at": result.measurements.measured_at,
            "model": result.measurements.model,
        },
        "export_times_note": result.measurements_note,
        "targets": [
            {
                "name": r.profile.name,
                "description": r.profile.description,
                "auto": r.auto,
                "backend": r.profile.backend.name,
                "flavor": r.settings.flavor,
                "quantization": r.settings.quant,
                "mixed_precision": r.settings.mixed,
                "block": _block(r.settings),
                "table_bits": r.settings.table_bits,
                "kernel": {
                    "profile": r.profile.matmul_kernel,
                    "here": "tensorrt" if r.settings.flavor == "trt" else r.settings.kernel,
                },
                "cache": {"sinks": r.settings.sinks, "window": r.settings.window},
                "meters": list(r.profile.power.meters),
                "memory_budget_bytes": r.profile.memory_budget_bytes,
                "export_settings": settings_key(r.settings),
                "export_seconds_per_100m_params": None if r.export_time is None else round(r.export_time.per_100m, 2),
            }
            for r in result.rows
        ],
    }


def to_text(result: Listing) -> str:
    header = ["", "TARGET", "FLAVOR", "QUANTIZATION", "BLOCK", "KERNEL", "CACHE", "METERS", "MEMORY", "EXPORT/100M",
              "DESCRIPTION"]  # fmt: skip
    table = [header]
    for r in result.rows:
        s, time = r.settings, r.export_time
        block = _block(s)
        table.append([
            "*" if r.auto else "",
            r.profile.name,
            s.flavor,
            _quantization(s),
            "-" if block is None else str(block),
            _kernel(r),
            f"{s.sinks}+{s.window}",
            ",".join(r.profile.power.meters),
            f"{r.profile.memory_budget_bytes / 2**30:.1f} GiB",
            _seconds(time.per_100m) if time else "-" if result.measurements is None else "not measured",
            r.profile.description,
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]) for row in table]
    if result.auto is not None:
        lines.append(f"* --target auto picks {result.auto} here: {result.auto_reason}")
    else:
        lines.append(f"--target auto: {result.auto_reason}")
    reason = kernels.unavailable_reason()
    if reason is not None:
        lines.append(f"kernels: edge-runtime's ops do not run here ({reason}); profiles asking for them export with "
                     "ONNX Runtime's (mlas)")  # fmt: skip
    lines.append(f"cache: sinks+window tokens; export time per 100M parameters: {result.measurements_note}")
    return "\n".join(lines)
