"""Export memory, time and size at real model shapes, ours beside llama.cpp's converter + quantizer.

    python scripts/make_shape_checkpoints.py --out /tmp/edge-shapes --shape smollm2-135m --shape llama-3.2-1b
    python scripts/export_scale.py --shapes /tmp/edge-shapes --shape smollm2-135m --shape llama-3.2-1b \\
        --quant int4 --quant int8 [--kernel edge] [--llama-cpp LLAMA_CPP_SRC] --work /tmp/export-scale [--json out.json]

Each export runs alone under `/usr/bin/time -v` (peak RSS is the process's maximum resident set, wall
the elapsed time); the bundle's size is the sum of its files. With --llama-cpp (a llama.cpp source tree
with `build/bin/llama-quantize` built), the same checkpoint goes through `convert_hf_to_gguf.py --outtype
bf16` once and `llama-quantize` to Q4_0 (beside our int4) and Q8_0 (beside int8), each step timed the same
way; llama.cpp's figure is the larger peak of the two steps and the sum of their times, since a pipeline
runs one after the other.

The shape checkpoints carry the demo model's byte-level BPE tokenizer, whose pre-tokenizer llama.cpp's
converter does not recognise by hash (it refuses unknown ones): the converter runs with that lookup
answering "gpt-2", which changes only a string in the GGUF's metadata, not the work or memory of the
conversion. Rows print as they finish, so a long run shows progress; the machine's CPU heads the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

GGUF_TYPE = {"int4": "Q4_0", "int8": "Q8_0"}  # llama.cpp's closest form to each of our precisions
_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
_WALL = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)")

# Runs llama.cpp's converter with its pre-tokenizer lookup answering "gpt-2" (module docstring).
_CONVERT_SHIM = """
import runpy, sys
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
script = sys.argv[1] + "/convert_hf_to_gguf.py"
sys.argv = [script, *sys.argv[2:]]
runpy.run_path(script, run_name="__main__")
"""


@dataclass(frozen=True)
class Timed:
    peak_rss_mib: float
    wall_s: float


@dataclass(frozen=True)
class Row:
    shape: str
    quant: str
    ours: Timed
    bundle_mb: float
    llama_cpp: Timed | None = None
    llama_cpp_type: str | None = None
    gguf_mb: float | None = None


def _seconds(clock: str) -> float:
    parts = [float(p) for p in clock.split(":")]
    return sum(p * 60**i for i, p in enumerate(reversed(parts)))


def timed(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Timed:
    """Run `cmd` under /usr/bin/time -v, its output to `log`; exit with the log's tail when it fails."""
    with log.open("w") as f:
        run = subprocess.run(["/usr/bin/time", "-v", *cmd], stdout=f, stderr=subprocess.STDOUT, env=env)
    rc = run.returncode
    text = log.read_text(errors="replace")
    rss, wall = _RSS.search(text), _WALL.search(text)
    if rc != 0 or rss is None or wall is None:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {rc}); its log {log} ends:\n{text[-2000:]}")
    return Timed(round(int(rss.group(1)) / 1024, 1), round(_seconds(wall.group(1)), 1))


def size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return round(sum(p.stat().st_size for p in files) / 1e6, 1)


def ours(ckpt: Path, quant: str, kernel: str | None, out: Path, log: Path) -> tuple[Timed, float]:
    cli = Path(sys.executable).with_name("edge-export")  # this environment's, activated or not
    cmd = [str(cli) if cli.exists() else "edge-export", str(ckpt), "-o", str(out), "--quant", quant, "--overwrite"]
    t = timed([*cmd, *(["--kernel", kernel] if kernel else [])], log)
    return t, size_mb(out)


def llama_cpp(src: Path, ckpt: Path, gguf_type: str, work: Path, cache: dict[Path, Timed]) -> tuple[Timed, float]:
    """Convert once per checkpoint (bf16), then quantize; the pair's peak RSS and summed time."""
    bf16 = work / f"{ckpt.name}-bf16.gguf"
    if ckpt not in cache:
        cmd = [sys.executable, "-c", _CONVERT_SHIM, str(src), str(ckpt), "--outfile", str(bf16), "--outtype", "bf16"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(src / "gguf-py")])}
        cache[ckpt] = timed(cmd, work / f"{ckpt.name}-convert.log", env)
    out = work / f"{ckpt.name}-{gguf_type}.gguf"
    quantize = src / "build" / "bin" / "llama-quantize"
    q = timed([str(quantize), str(bf16), str(out), gguf_type], work / f"{ckpt.name}-{gguf_type}.log")
    conv = cache[ckpt]
    return Timed(max(conv.peak_rss_mib, q.peak_rss_mib), round(conv.wall_s + q.wall_s, 1)), size_mb(out)


def _clock(s: float) -> str:
    m, sec = divmod(round(s), 60)
    return f"{m}:{sec:02d}"


def markdown(rows: list[Row], cpu: str) -> str:
    lines = [
        f"CPU: {cpu}",
        "",
        "| shape | quant | ours: peak RSS | wall | bundle | llama.cpp (convert, quantize): peak RSS | wall | GGUF |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ll = r.llama_cpp
        theirs = (
            f"{ll.peak_rss_mib:,.0f} MiB ({r.llama_cpp_type}) | {_clock(ll.wall_s)} | {r.gguf_mb:,.1f} MB"
            if ll
            else "- | - | -"
        )
        lines.append(
            f"| {r.shape} | {r.quant} | {r.ours.peak_rss_mib:,.0f} MiB | {_clock(r.ours.wall_s)} | "
            f"{r.bundle_mb:,.1f} MB | {theirs} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", type=Path, required=True, help="make_shape_checkpoints.py's --out")
    ap.add_argument("--shape", action="append", required=True, help="a directory under --shapes")
    ap.add_argument("--quant", action="append", choices=sorted(GGUF_TYPE), required=True)
    ap.add_argument("--kernel", choices=["mlas", "edge"], help="edge-export's --kernel (its default when omitted)")
    ap.add_argument("--llama-cpp", type=Path, help="llama.cpp source tree with build/bin/llama-quantize")
    ap.add_argument("--work", type=Path, help="where bundles, GGUFs and logs go (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the bundles and GGUFs (logs are always kept)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    from edge_runtime.bench.environment import cpu_model

    if not Path("/usr/bin/time").exists():
        raise SystemExit("needs /usr/bin/time (GNU time, for -v); install the `time` package")
    ckpts = [a.shapes / s for s in a.shape]
    missing = [str(c) for c in ckpts if not (c / "config.json").exists()]
    if missing:
        raise SystemExit(f"no checkpoint at {', '.join(missing)}; make them with scripts/make_shape_checkpoints.py")
    if a.llama_cpp and not (a.llama_cpp / "build" / "bin" / "llama-quantize").exists():
        raise SystemExit(f"{a.llama_cpp} has no build/bin/llama-quantize; build llama.cpp there first")
    work = a.work or Path(tempfile.mkdtemp(prefix="export-scale-"))
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"cannot create --work {work}: {e.strerror or e}") from None
    cpu = cpu_model(default="unknown CPU") + f", {os.cpu_count()} logical CPUs"
    rows: list[Row] = []
    converted: dict[Path, Timed] = {}
    for ckpt in ckpts:
        for quant in a.quant:
            out = work / f"{ckpt.name}-{quant}"
            t, mb = ours(ckpt, quant, a.kernel, out, work / f"{ckpt.name}-{quant}.log")
            row = Row(ckpt.name, quant, t, mb)
            if a.llama_cpp:
                lt, gmb = llama_cpp(a.llama_cpp, ckpt, GGUF_TYPE[quant], work, converted)
                row = Row(ckpt.name, quant, t, mb, lt, GGUF_TYPE[quant], gmb)
            rows.append(row)
            print(json.dumps(asdict(row)), flush=True)
            if not a.keep:
                shutil.rmtree(out, ignore_errors=True)
                (work / f"{ckpt.name}-{GGUF_TYPE[quant]}.gguf").unlink(missing_ok=True)
        if not a.keep:
            (work / f"{ckpt.name}-bf16.gguf").unlink(missing_ok=True)
    table = markdown(rows, cpu)
    print(table)
    if a.json:
        a.json.write_text(json.dumps({"cpu": cpu, "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
