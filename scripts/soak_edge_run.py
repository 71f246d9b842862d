"""Soak: 1,000,000 tokens through `edge-run` (streaming, small window) in constant memory.

    python scripts/soak_edge_run.py [--tokens 1000000] [--window 64] [--bundle DIR] [--limit-mb 2] [--write PAGE]

Without --bundle, exports the demo model at INT4 into a temporary bundle, its EOS removed from the
config so the stream never ends early. Runs `edge-run --bundle B --max-tokens N --window W` as a child
(sampling at temperature 0.8 / top-p 0.95, seed 1: the text keeps changing), reads and discards its
stdout, and samples its resident set size (/proc/PID/status VmRSS) twice a second. Reports the RSS
once warm (--warm-s after the first output), the highest RSS seen after that, their difference (the
growth), the child's peak RSS (ru_maxrss, load included), the wall time and the tokens/s, and over the
samples from the first output on: the first, the last, the highest and the slope (least squares over
the samples after warm-up, per 100,000 tokens, the tokens counted by the bytes of text streamed so far).
Exit code 1 if edge-run failed or the growth reached --limit-mb.

`--write PAGE` also writes the figures as a dated Markdown page (replaced, not appended) naming the CPU,
vCPUs, load average, commit, ONNX Runtime's version and the command that regenerates it, with RSS at ten
points of the run and a short table of the bad-input classes that docs/bad-inputs.md lists.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edge_runtime.onnx_graph import graph_ops, read_graph


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def endless_demo_bundle(tmp: Path) -> Path:
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import QuantConfig, QuantMethod
    from edge_runtime.models import DEMO_CHECKPOINT

    ck = Path(shutil.copytree(DEMO_CHECKPOINT, tmp / "ck"))
    for name in ("config.json", "generation_config.json"):
        if (ck / name).is_file():
            cfg = json.loads((ck / name).read_text())
            cfg["eos_token_id"] = None
            (ck / name).write_text(json.dumps(cfg))
    out = tmp / "bundle"
    export(ExportOptions(checkpoint=ck, out=out, quant=QuantConfig(QuantMethod.INT4)))
    return out


# The bad-input classes of docs/bad-inputs.md, grouped; that page has each class, its cases and its tests.
BAD_INPUTS = [
    (
        "checkpoints, GGUF files, manifests, session snapshots, files and text named on the command line",
        "refused in one line naming the problem, before any work; nothing written, no file's bytes echoed",
        "`test_bad_inputs_checkpoint.py`, `test_bad_inputs_gguf.py`, `test_bad_inputs_manifest.py`, "
        "`test_bad_inputs_snapshot.py`, `test_bad_inputs_files.py`",
    ),
    (
        "the disk and the OS: a full disk, a read-only file system, outputs that are devices, FIFOs or links, "
        "two exports to one output",
        "one line; nothing lost or half-written; exactly one export wins",
        "`test_bad_inputs.py`, `test_bad_inputs_fs.py`, `test_bad_inputs_outputs.py`",
    ),
    (
        "signals and Ctrl-C during an export or a run",
        "partial directories removed, the exit status says the signal; `edge-run` prints the partial output",
        "`test_bad_inputs.py`, `test_bad_inputs_runtime.py`",
    ),
    (
        "a bundle corrupted after its first load, NaN or Inf output, bad sampling settings",
        "one line on stderr and a non-zero exit",
        "`test_bad_inputs_corruption.py`",
    ),
    (
        "chat templates that loop or build huge values, constraints no output can satisfy",
        "bounded; one line from `edge-run` and `edge-export`, an OpenAI error object from `edge-serve`",
        "`test_bad_inputs_template.py`, `test_bad_inputs_structured.py`",
    ),
    (
        "`edge-serve` client mistakes, requests still waiting at shutdown",
        "400s with OpenAI's error object; a JSON 503 at shutdown",
        "`test_bad_inputs_serve.py`",
    ),
]


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (0 for fewer than two distinct x)."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / max(n, 1), sum(y for _, y in points) / max(n, 1)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def about(tokens: float) -> str:
    """An estimated token count, to the hundred."""
    return f"{round(tokens, -2):,.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--warm-s", type=float, default=20.0, help="seconds of output before the baseline RSS")
    ap.add_argument("--limit-mb", type=float, default=2.0)
    ap.add_argument("--write", type=Path, metavar="PAGE", help="also write the figures as a Markdown page (replaced)")
    a = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        bundle = a.bundle or endless_demo_bundle(Path(tmp))
        manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
        ops = graph_ops(read_graph(bundle / manifest["graph"]["file"]))  # which kernels the stream runs
        cmd = [sys.executable, "-m", "edge_runtime.cli.run", "--bundle", str(bundle), "--target", "x86"]
        cmd += ["--max-tokens", str(a.tokens), "--window", str(a.window), "--prompt", "ROMEO."]
        # Sampled, so the text keeps changing (greedy settles into a loop, or on a special token that
        # prints nothing) and the sampler's work rows are exercised too.
        cmd += ["--temperature", "0.8", "--top-p", "0.95", "--seed", "1"]
        cmd += ["--threads", str(a.threads)] if a.threads else []
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        assert p.stdout is not None
        os.set_blocking(p.stdout.fileno(), False)
        out_bytes, first, warm, highest, next_sample = 0, None, None, 0, 0.0
        samples: list[tuple[float, int, int]] = []  # (seconds after the first output, bytes so far, RSS)
        while True:
            try:
                chunk = p.stdout.read(1 << 16)
            except BlockingIOError:
                chunk = None
            if chunk == b"":
                break
            if chunk:
                out_bytes += len(chunk)
                first = first or time.monotonic()
            now = time.monotonic()
            if now >= next_sample:
                next_sample = now + 0.5
                rss = rss_bytes(p.pid)
                if rss is not None and first is not None:
                    samples.append((now - first, out_bytes, rss))
                    if now - first >= a.warm_s:
                        if warm is None:
                            warm = rss
                        highest = max(highest, rss)
            if not chunk:
                time.sleep(0.02)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        err = p.stderr.read().decode(errors="replace").strip() if p.stderr else ""
    load_after = os.getloadavg()
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0 or warm is None:
        print(f"edge-run exited {rc} (warm baseline {'taken' if warm else 'never taken'}): {err[-500:]}")
        return 1
    growth = (highest - warm) / 1e6
    tokens_at = a.tokens / out_bytes  # tokens per byte of text: a sample's bytes so far, in tokens
    after_warm = [(b * tokens_at, rss / 1e6) for t, b, rss in samples if t >= a.warm_s]
    per_100k = slope(after_warm) * 100_000
    steps = [(t1, y1 - y0) for (_, y0), (t1, y1) in itertools.pairwise(after_warm) if y1 != y0]
    figures = {
        "first": samples[0][2] / 1e6,
        "warm": warm / 1e6,
        "highest": highest / 1e6,
        "last": samples[-1][2] / 1e6,
        "growth": growth,
        "slope_per_100k": per_100k,
        "peak": usage.ru_maxrss * 1024 / 1e6,
        "wall": wall,
        "text_mb": out_bytes / 1e6,
        "warm_tokens": next(b for t, b, _ in samples if t >= a.warm_s) * tokens_at,
        "n_after_warm": len(after_warm),
        "steps": steps,  # (tokens, MB) where RSS changed after warm-up
        "ops": ops,
    }
    print(
        f"{a.tokens} tokens (window {a.window}), {out_bytes / 1e6:.1f} MB of text, wall {wall:.0f} s "
        f"({a.tokens / wall:.0f} tok/s incl. load)\n"
        f"RSS warm ({a.warm_s:.0f} s in): {warm / 1e6:.2f} MB, highest after: {highest / 1e6:.2f} MB, "
        f"growth {growth:+.2f} MB (limit {a.limit_mb} MB); peak RSS incl. load (ru_maxrss): "
        f"{usage.ru_maxrss * 1024 / 1e6:.2f} MB\n"
        f"RSS at the first output {figures['first']:.2f} MB, at the last sample {figures['last']:.2f} MB; slope "
        f"after warm-up {per_100k:+.3f} MB per 100,000 tokens ({len(after_warm)} samples; RSS changes: {len(steps)})"
    )
    if a.write is not None:
        write_page(a, manifest, figures, samples, tokens_at, load_before, load_after)
    return 1 if growth >= a.limit_mb else 0


def provenance() -> tuple[str, str, str]:
    """The commit (noting uncommitted changes), ONNX Runtime's version, and this machine's CPU line."""
    from importlib import metadata

    from edge_runtime.bench.environment import cpu_line

    git = ["git", "-C", str(Path(__file__).resolve().parent)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
    commit = (commit or "unknown") + (" + uncommitted changes" if dirty else "")
    return commit, metadata.version("onnxruntime"), f"{cpu_line()}, {os.cpu_count()} vCPUs"


def write_page(a, manifest: dict, figures: dict, samples: list, tokens_at: float, load_before, load_after) -> None:
    import shlex
    from datetime import datetime, timezone

    from edge_runtime import kernels
    from edge_runtime.atomic_write import write_file

    commit, ort_version, cpu = provenance()
    shared = "shared with other work" if load_before[0] >= 0.5 else "otherwise idle"
    loads = [", ".join(f"{v:.2f}" for v in load) for load in (load_before, load_after)]
    command = shlex.join(["python", "scripts/soak_edge_run.py", *sys.argv[1:]])
    f = figures
    model = (
        f"{manifest['model']['arch']}, {manifest['model']['parameters'] / 1e6:.1f}M parameters, "
        f"{manifest['graph']['weight_dtype']} weights"
    )
    bundle = (
        f"`{a.bundle}` ({model})"
        if a.bundle
        else f"the demo model (`models/checkpoints/shakespeare-llama-5m`; {model}) exported at INT4 with its EOS "
        "removed, so the stream never ends early"
    )
    products = sorted({op for _, op in f["ops"] if op in ("MatMulNBits", kernels.MATMUL_Q4, kernels.MATMUL_Q8)})
    edge = sorted(op for domain, op in f["ops"] if domain == kernels.DOMAIN)
    ran = (
        f"edge ops {', '.join(edge)} ({kernels.isa()} implementation)"
        if edge
        else "no edge ops (a `--kernel mlas` bundle, the export default)"
    )
    steps = ", ".join(f"{mb:+.2f} MB at about {about(tok)} tokens" for tok, mb in f["steps"][:5])
    steps = f"{len(f['steps'])}" + (f": {steps}" if steps else "") + (", ..." if len(f["steps"]) > 5 else "")
    verdict = "within" if f["growth"] < a.limit_mb else "over"
    picks = sorted({round(i * (len(samples) - 1) / 9) for i in range(10)})  # ten points, first and last included
    rows = [f"| {t:.0f} | {about(b * tokens_at)} | {rss / 1e6:.2f} |" for t, b, rss in (samples[i] for i in picks)]
    bad = [f"| {what} | {now} | {tests} |" for what, now, tests in BAD_INPUTS]
    text = "\n".join(
        [
            "# Robustness: constant memory and bad inputs",
            "",
            f"Measured {datetime.now(timezone.utc):%Y-%m-%d} on {cpu}; commit {commit}, ONNX Runtime {ort_version}. "
            f"The machine was {shared}: load average (1, 5, 15 min) {loads[0]} before the run and {loads[1]} after "
            f"it (the run's own process included), on {os.cpu_count()} vCPUs.",
            "",
            f"Regenerate: `{command}` (this replaces the page).",
            "",
            "## Constant memory over a long generation",
            "",
            f"`edge-run` streamed {a.tokens:,} sampled tokens (temperature 0.8, top-p 0.95, seed 1: the text keeps "
            f"changing) through a window of {a.window} recent tokens, from {bundle}; its products run on "
            f"{', '.join(products) or 'no quantized matmul'}, with {ran}. "
            "The script reads and discards its output and samples its resident set size (`VmRSS`) twice a second; "
            f"the baseline is the first sample {a.warm_s:.0f} s after the first output. Token counts between the "
            "first and the last are estimated from the bytes of text streamed so far.",
            "",
            "| measure | value |",
            "| --- | ---: |",
            f"| RSS at the first output | {f['first']:.2f} MB |",
            f"| RSS once warm ({a.warm_s:.0f} s in, about {about(f['warm_tokens'])} tokens) | {f['warm']:.2f} MB |",
            f"| highest RSS after that | {f['highest']:.2f} MB |",
            f"| RSS at the last sample | {f['last']:.2f} MB |",
            f"| growth (highest after warm-up less the warm baseline) | {f['growth']:+.2f} MB, {verdict} the "
            f"{a.limit_mb:g} MB limit |",
            f"| slope after warm-up (least squares, {f['n_after_warm']} samples) | {f['slope_per_100k']:+.3f} MB "
            "per 100,000 tokens |",
            f"| changes of RSS after warm-up | {steps} |",
            f"| peak RSS, loading included (`ru_maxrss`) | {f['peak']:.2f} MB |",
            f"| wall time, loading included | {f['wall']:.0f} s ({a.tokens / f['wall']:,.0f} tokens/s on the CPU "
            f"above, {f['text_mb']:.1f} MB of text) |",
            "",
            "RSS along the run:",
            "",
            "| seconds after the first output | tokens (about) | RSS MB |",
            "| ---: | ---: | ---: |",
            *rows,
            "",
            "## Bad inputs and faults",
            "",
            "Every input a user or a client controls gets a bound, a check before work and a one-line error. "
            "[bad-inputs.md](../bad-inputs.md) lists each class, its cases and what happens now; each case is a "
            "regression test in `tests/test_bad_inputs*.py` (exit code, one stderr line, what is left on disk).",
            "",
            "| inputs and faults | what happens | tests (`tests/`) |",
            "| --- | --- | --- |",
            *bad,
            "",
        ]
    )
    write_file(a.write, [text.encode("utf-8")])
    print(f"# wrote {a.write}")


if __name__ == "__main__":
    raise SystemExit(main())
