"""Export time per target profile on this machine, for `edge-export targets`' EXPORT/100M column.

    python scripts/bench_export_time.py [--model PATH|demo] [--target NAME ...] [--out FILE] [--write PAGE]
    python scripts/bench_export_time.py --render FILE --write docs/benchmarks/export-time.md

Exports the checkpoint (a Hugging Face directory, a .gguf file, or demo; default demo) once for each distinct
export setting among the built-in profiles (flavor, quantization, block, kernel, table bits, mixed-precision
plan, as `edge-export --target NAME` applies them on this machine: profiles that share them are measured once),
each as its own `edge-export` process timed by the wall clock, and writes the times, the bundles' parameter
counts, this machine's CPU and the date to FILE (default: export-times.json in edge-runtime's cache directory,
where `edge-export targets` looks). Each bundle is deleted after it is measured. `--write PAGE` also writes
the figures as a dated Markdown page naming the CPU and commit (replaced, not appended); `--render FILE` writes
that page from an earlier measurements file without exporting again.

The demo model (5M parameters) is mostly fixed costs: its figures scaled to 100M parameters say little. Measure
with the model you mean to deploy, or one of its size (scripts/make_shape_checkpoints.py makes checkpoints of real
shapes): GPTQ, AWQ and the sensitivity plan calibrate, which takes minutes on a 1B model.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from edge_runtime import kernels
from edge_runtime.atomic_write import write_file
from edge_runtime.models import resolve_checkpoint
from edge_runtime.targets import known_targets, load_target, read_facts
from edge_runtime.targets.listing import MEASUREMENTS_FORMAT, here_settings, measurements_path, settings_key

# `edge-export` as this interpreter runs it (the console script may belong to another environment).
_EXPORT = [sys.executable, "-c", "from edge_runtime.cli.export import main; main()"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo", help="checkpoint directory, .gguf file, or demo [default: demo]")
    ap.add_argument("--target", action="append", help="measure only these profiles' settings (repeatable)")
    ap.add_argument("--out", type=Path, default=None, help=f"measurements file [default: {measurements_path()}]")
    ap.add_argument("--write", type=Path, default=None, help="also write the figures as a Markdown page here")
    ap.add_argument("--render", type=Path, default=None, help="write --write's page from this measurements file")
    args = ap.parse_args()
    if args.render is not None:
        if args.write is None:
            ap.error("--render needs --write PAGE")
        write_page(json.loads(args.render.read_text(encoding="utf-8")), args.write)
        return 0
    model = resolve_checkpoint(args.model)
    names = args.target or list(known_targets())
    groups: dict[str, list[str]] = {}  # settings key -> the profiles that share it
    for name in names:
        groups.setdefault(settings_key(here_settings(load_target(name))), []).append(name)
    facts = read_facts()
    cpu = facts.cpu_model or platform.processor() or "unknown CPU"
    print(f"# {cpu}, {facts.logical_cpus} logical CPUs, edge kernels: {kernels.isa() or 'unavailable'}")
    print(f"# {model}: {len(groups)} export settings among {', '.join(names)}")
    exports, failed = {}, []
    with tempfile.TemporaryDirectory(prefix="edge-export-time-") as tmp:
        for i, (key, profiles) in enumerate(groups.items()):
            out = Path(tmp) / f"b{i}"
            cmd = [*_EXPORT, str(model), "-o", str(out), "--target", profiles[0]]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:  # said, and the other settings still measured
                print(f"{key}: export failed: {proc.stderr.strip().splitlines()[-1]}", file=sys.stderr)
                failed.append(key)
                continue
            manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
            parameters = manifest["model"]["parameters"]
            exports[key] = {
                "targets": profiles,
                "seconds": round(wall, 2),
                "export_seconds": manifest["provenance"].get("export_seconds"),  # in-process, without start-up
                "parameters": parameters,
                "seconds_per_100m_params": round(wall * 1e8 / parameters, 2),
            }
            print(f"{key:55s} {wall:8.1f} s  {wall * 1e8 / parameters:8.1f} s/100M  ({', '.join(profiles)})")
            shutil.rmtree(out)  # a 1B model's bundles add up
    data = {
        "format": MEASUREMENTS_FORMAT,
        "cpu": cpu,
        "logical_cpus": facts.logical_cpus,
        "machine": platform.machine(),
        "edge_kernels": kernels.isa(),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": str(args.model),
        "exports": exports,
    }
    out_file = args.out or measurements_path()
    out_file.parent.mkdir(parents=True, exist_ok=True)
    write_file(out_file, [(json.dumps(data, indent=2) + "\n").encode("utf-8")])
    print(f"# wrote {out_file}")
    if args.write is not None:
        write_page(data, args.write)
    return 1 if failed else 0


def write_page(data: dict, page: Path) -> None:
    """The measurements as a dated page: CPU, commit, the command that regenerates it, one row per setting."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = [
        f"| {', '.join(e['targets'])} | `{key}` | {e['seconds']:.0f} | {e['parameters'] / 1e6:.1f}M | "
        f"{e['seconds_per_100m_params'] / 60:.1f} |"
        for key, e in data["exports"].items()
    ]
    text = "\n".join(
        [
            "# Export time per target profile",
            "",
            f"Measured {data['measured_at'][:10]} on {data['cpu']} ({data['logical_cpus']} logical CPUs, "
            f"{data['machine']}, edge kernels: {data['edge_kernels'] or 'unavailable'}), commit {commit or 'unknown'}, "
            f"model `{Path(data['model']).name}`. One `edge-export MODEL -o OUT --target NAME` process per distinct "
            "export setting, wall clock, validation included; profiles with the same settings share a row.",
            "",
            "Regenerate: `python scripts/bench_export_time.py --model MODEL --write docs/benchmarks/export-time.md` "
            "(this replaces the page). `edge-export targets` shows the figures measured on the machine it runs on.",
            "",
            "| targets | settings | seconds | parameters | minutes per 100M parameters |",
            "| --- | --- | --- | --- | --- |",
            *rows,
            "",
        ]
    )
    write_file(page, [text.encode("utf-8")])
    print(f"# wrote {page}")


if __name__ == "__main__":
    raise SystemExit(main())
