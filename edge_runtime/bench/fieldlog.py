"""The field log: one JSON line per measured run, appended durably, and its summary.

Each record is written with one write, then flush + fsync, so a crash loses at most the run in
flight; a record cut short by a crash stays a broken last line, which `read_log` reports and skips
(and the next append starts on a fresh line rather than gluing onto it).
"""

from __future__ import annotations

import json
import os
import stat
import statistics
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edge_runtime.bounded_read import read_bounded
from edge_runtime.errors import EdgeRuntimeError

from .figures import ENERGY_PREFIX, MAIN_FIGURES, get

RECORD_VERSION = 1


def new_run_id() -> str:
    """Groups the records of one invocation (edge-bench writes one per trial)."""
    return uuid.uuid4().hex[:12]


def make_record(
    tool: str,
    *,
    environment: Mapping[str, Any],
    target: str,
    bundle: Mapping[str, Any],
    settings: Mapping[str, Any],
    measurement: Mapping[str, Any] | None,
    figures: Mapping[str, Any],
    run_id: str,
    trial: int | None = None,
) -> dict[str, Any]:
    return {
        "record_version": RECORD_VERSION,
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "tool": tool,
        "run_id": run_id,
        "trial": trial,
        "device": environment.get("device"),
        "target": target,
        "bundle_sha256": bundle["sha256"],
        "bundle": dict(bundle),
        "environment": dict(environment),
        "settings": dict(settings),
        "measurement": None if measurement is None else dict(measurement),
        "figures": dict(figures),
    }


def _fsync_dir(directory: Path) -> None:
    # A new file's directory entry is durable only once the directory itself is synced.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the record itself is synced
    finally:
        os.close(fd)


def append_record(path: str | Path, record: Mapping[str, Any]) -> None:
    """Append `record` as one line and fsync it before returning."""
    path = Path(path)
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    created = not path.exists()
    try:
        with path.open("ab") as f:
            if f.tell() > 0:
                with path.open("rb") as r:
                    r.seek(-1, os.SEEK_END)
                    if r.read(1) != b"\n":
                        f.write(b"\n")  # the previous record was cut short: keep it on its own line
            f.write(line)
            f.flush()
            if stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # a device (/dev/null) refuses fsync: nothing to keep
                os.fsync(f.fileno())
    except OSError as exc:
        raise EdgeRuntimeError(
            f"cannot append to field log '{path}': {exc.strerror or exc}; pass a writable --log path"
        ) from exc
    if created:
        _fsync_dir(path.parent.resolve())


@dataclass
class LogContents:
    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: list[tuple[int, str]] = field(default_factory=list)  # (1-based line, why), not the tail
    truncated_tail: int | None = None  # bytes of a last record cut short (no newline, not JSON)


# A record is about a kilobyte: a year of a run a minute is ~500 MB. A larger log is refused rather than read
# whole (rotate it), and a FIFO or /dev/zero is not read at all.
MAX_LOG_BYTES = 1 << 30


def read_log(path: str | Path) -> LogContents:
    path = Path(path)
    try:
        data = read_bounded(path, MAX_LOG_BYTES, "field log")
    except EdgeRuntimeError as exc:
        raise EdgeRuntimeError(f"{exc}; pass a file written with --log") from None
    out = LogContents(path)
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            if not isinstance(record, dict) or "record_version" not in record:
                raise ValueError("not a field-log record")
        except ValueError as exc:
            if number == len(lines):  # no newline after it: the write was cut short
                out.truncated_tail = len(raw)
            else:
                out.bad_lines.append((number, str(exc)[:80]))
            continue
        out.records.append(record)
    return out


def summarize(contents: LogContents) -> list[dict[str, Any]]:
    """Per (target, bundle sha256): run count, time span, boundaries, and median/min/max of each main figure."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in contents.records:
        groups.setdefault((str(r.get("target")), str(r.get("bundle_sha256"))), []).append(r)
    out = []
    for (target, sha), records in groups.items():
        sources = {get(r, "measurement.source") for r in records} - {None}
        figures = {}
        for path, _label, _unit, _better in MAIN_FIGURES:
            values = [v for r in records if isinstance(v := get(r.get("figures", {}), path), (int, float))]
            if values:
                figures[path] = {
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                    "n": len(values),
                }
        out.append(
            {
                "target": target,
                "bundle_sha256": sha,
                "bundle": get(records[-1], "bundle.path"),
                "count": len(records),
                "first": records[0].get("time"),
                "last": records[-1].get("time"),
                "devices": sorted({str(r.get("device")) for r in records}),
                "boundaries": sorted({str(get(r, "measurement.boundary")) for r in records}),
                "estimate": "estimate" in sources,
                "figures": figures,
            }
        )
    return out


def format_summary(contents: LogContents, groups: list[dict[str, Any]]) -> str:
    lines = [f"field log {contents.path}: {len(contents.records)} records in {len(groups)} target/bundle group(s)"]
    if contents.truncated_tail is not None:
        lines.append(
            f"note: last line truncated ({contents.truncated_tail} bytes, a run cut short by a crash); ignored"
        )
    lines += [f"warning: line {n} is not a record ({why}); skipped" for n, why in contents.bad_lines]
    for g in groups:
        tag = " (estimate)" if g["estimate"] else ""
        lines += [
            "",
            f"target {g['target']} | bundle {g['bundle_sha256'][:16]}... ({g['bundle']}) | {g['count']} runs, "
            f"{g['first']} .. {g['last']}",
            f"  device {', '.join(g['devices'])} | power boundary {', '.join(g['boundaries'])}{tag}",
            f"  {'figure':<44} {'median':>11} {'min':>11} {'max':>11} {'n':>4}",
        ]
        for path, label, unit, _better in MAIN_FIGURES:
            f = g["figures"].get(path)
            if f is None:
                continue
            name = f"{label} ({unit})" + (tag if path.startswith(ENERGY_PREFIX) else "")
            lines.append(f"  {name:<44} {f['median']:>11.4g} {f['min']:>11.4g} {f['max']:>11.4g} {f['n']:>4}")
    return "\n".join(lines)
