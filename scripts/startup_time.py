"""Start-up time of the commands: `edge-run --help`, `edge-serve --help`, and a one-token reply from a bundle.

    python scripts/startup_time.py --bundle BUNDLE [--runs 10] [--write docs/benchmarks/startup.md]
    python scripts/startup_time.py --bundle BUNDLE --compare OLD_SITE     # an earlier commit alongside

Each figure is the wall time of a fresh process (this environment's console scripts), median and p90 over
`--runs`, the commands taken in turn so a shared machine's drift hits them alike, after one unmeasured run
of each (the page cache and the verified-file memo warm, as on a device that ran the bundle before). The
reply is `edge-run --bundle BUNDLE --prompt hi --max-tokens 1 --temperature 0`: imports, target detection,
bundle checks, the ONNX Runtime session, the tokenizer and one prefill.

Bytecode: an installed package has its modules compiled; where PYTHONDONTWRITEBYTECODE is set (it is in
some CI and container environments) every process would compile them again, so the children get a
private bytecode cache instead (PYTHONPYCACHEPREFIX in a temporary folder; the source tree is not written).

`--compare OLD_SITE` measures another version alongside, e.g. the last commit:
    git archive HEAD | tar -x -C /tmp/old-src
    pip install --no-deps --no-build-isolation --target /tmp/old-site /tmp/old-src
the same console scripts run with PYTHONPATH=OLD_SITE (its edge_runtime first on the path).

`--write PAGE` replaces PAGE with the figures, the date, the CPU (lscpu's Model name), the commit and
the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commands(bundle: Path) -> dict[str, list[str]]:
    bin_dir = Path(sys.executable).parent  # the console scripts of this environment
    run = str(bin_dir / "edge-run")
    reply = [run, "--bundle", str(bundle), "--prompt", "hi", "--max-tokens", "1", "--temperature", "0"]
    return {
        "edge-run --help": [run, "--help"],
        "edge-serve --help": [str(bin_dir / "edge-serve"), "--help"],
        "edge-run, 1-token reply": reply,
    }


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    import platform

    return platform.processor() or "unknown CPU"


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{head} with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else head


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    return elapsed


def p90(xs: list[float]) -> float:
    return sorted(xs)[math.ceil(0.9 * len(xs)) - 1]  # nearest rank


def measure(cmds: dict[str, list[str]], envs: dict[str, dict[str, str]], runs: int) -> dict[tuple[str, str], list]:
    jobs = [(name, label) for name in cmds for label in envs]
    for name, label in jobs:  # warm: page cache, bytecode, the bundle's verified-file memo
        timed(cmds[name], envs[label])
    times: dict[tuple[str, str], list[float]] = {job: [] for job in jobs}
    for i in range(runs):
        for name, label in jobs:
            times[name, label].append(timed(cmds[name], envs[label]))
        print(f"  run {i + 1}/{runs}", file=sys.stderr)
    return times


def table(times: dict[tuple[str, str], list[float]], labels: list[str]) -> list[str]:
    head = "| command | " + " | ".join(f"{lb} median | {lb} p90" if lb else "median | p90" for lb in labels) + " |"
    lines = [head, "| --- |" + " ---: | ---: |" * len(labels)]
    for name in dict.fromkeys(n for n, _ in times):
        cells = []
        for lb in labels:
            xs = times[name, lb]
            cells += [f"{statistics.median(xs):.2f} s", f"{p90(xs):.2f} s"]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True, help="a bundle directory (e.g. SmolLM2-135M int4)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--compare", type=Path, help="another version's install (pip install --target): 'before'")
    ap.add_argument("--write", type=Path, help="replace this Markdown page with the figures")
    a = ap.parse_args()
    if not (a.bundle / "manifest.json").is_file():
        raise SystemExit(f"{a.bundle} is not a bundle (no manifest.json)")
    cmds = commands(a.bundle.resolve())
    with tempfile.TemporaryDirectory(prefix="startup-pycache-") as pycache:
        env = dict(os.environ)
        if env.pop("PYTHONDONTWRITEBYTECODE", None):
            env["PYTHONPYCACHEPREFIX"] = pycache
        envs = {"": env}
        if a.compare is not None:
            old = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(a.compare), env.get("PYTHONPATH")]))}
            envs = {"before": old, "after": env}
        times = measure(cmds, envs, a.runs)
    cpu, rev = cpu_model(), commit()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows = table(times, list(envs))
    print(f"{cpu}, {cores} cores usable, {rev}, {a.runs} runs each")
    print("\n".join(rows))
    if a.write is not None:
        a.write.write_text(page(rows, cpu, cores, rev, a), encoding="utf-8")
        print(f"wrote {a.write}", file=sys.stderr)
    return 0


def describe(bundle: Path) -> str:
    m = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    o = m["provenance"].get("options", {})
    return (
        f"{m['model']['source_model_type']}, {m['model']['parameters'] / 1e6:.1f}M parameters in "
        f"{m['model']['num_layers']} layers, {m['graph']['weight_bytes'] / 1e6:.1f} MB of weights, "
        f"{o.get('flavor', m['graph']['flavor'])}/{o.get('quant', '?')} --kernel {o.get('kernel', '?')}"
    )


def page(rows: list[str], cpu: str, cores: int | None, rev: str, a: argparse.Namespace) -> str:
    bundle = a.bundle.name
    compare = " --compare OLD_SITE" if a.compare is not None else ""
    cmd = f"python scripts/startup_time.py --bundle {bundle} --runs {a.runs}{compare} --write {a.write}"
    when = datetime.date.today().isoformat()
    paragraphs = [
        "# Start-up time",
        f"How long a command takes from launch to exit, measured on {when} on {cpu} ({cores} cores usable, "
        f"shared with other work) at {rev}. Each figure is the wall time of a fresh process, median and p90 over "
        f"{a.runs} runs taken in turn after one unmeasured run of each; timings move between sessions on these "
        f"machines, so compare figures only within one run. `{cmd}` regenerates this page.",
        f"The reply is `edge-run --bundle {bundle} --prompt hi --max-tokens 1 --temperature 0` on `{bundle}` "
        f"({describe(a.bundle)}): Python and the imports (numpy, onnxruntime, tokenizers; not `onnx`: "
        "edge_runtime/onnx_graph.py reads the graph's ops), target detection, the bundle's sampled checks, the "
        "ONNX Runtime session, the tokenizer and one prefill. `--help` loads click and the option declarations.",
    ]
    if a.compare is not None:
        paragraphs.append(
            "`before` is another version installed beside this one (`--compare`; the script's docstring says "
            "how), measured in the same runs."
        )
    return "\n\n".join([*paragraphs, "\n".join(rows)]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
