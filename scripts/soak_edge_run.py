"""Soak: 1,000,000 tokens through `edge-run` (streaming, small window) in constant memory.

    python scripts/soak_edge_run.py [--tokens 1000000] [--window 64] [--bundle DIR] [--limit-mb 2]

Without --bundle, exports the demo model at INT4 into a temporary bundle, its EOS removed from the
config so the stream never ends early. Runs `edge-run --bundle B --max-tokens N --window W` as a child
(sampling at temperature 0.8 / top-p 0.95, seed 1: the text keeps changing), reads and discards its
stdout, and samples its resident set size (/proc/PID/status VmRSS) twice a second. Reports the RSS
once warm (--warm-s after the first output), the highest RSS seen after that, their difference (the
growth), the child's peak RSS (ru_maxrss, load included), the wall time and the tokens/s. Exit code 1
if edge-run failed or the growth reached --limit-mb.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--warm-s", type=float, default=20.0, help="seconds of output before the baseline RSS")
    ap.add_argument("--limit-mb", type=float, default=2.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bundle = a.bundle or endless_demo_bundle(Path(tmp))
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
                if rss is not None and first is not None and now - first >= a.warm_s:
                    if warm is None:
                        warm = rss
                    highest = max(highest, rss)
            if not chunk:
                time.sleep(0.02)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        err = p.stderr.read().decode(errors="replace").strip() if p.stderr else ""
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0 or warm is None:
        print(f"edge-run exited {rc} (warm baseline {'taken' if warm else 'never taken'}): {err[-500:]}")
        return 1
    growth = (highest - warm) / 1e6
    print(
        f"{a.tokens} tokens (window {a.window}), {out_bytes / 1e6:.1f} MB of text, wall {wall:.0f} s "
        f"({a.tokens / wall:.0f} tok/s incl. load)\n"
        f"RSS warm ({a.warm_s:.0f} s in): {warm / 1e6:.2f} MB, highest after: {highest / 1e6:.2f} MB, "
        f"growth {growth:+.2f} MB (limit {a.limit_mb} MB); peak RSS incl. load (ru_maxrss): "
        f"{usage.ru_maxrss * 1024 / 1e6:.2f} MB"
    )
    return 1 if growth >= a.limit_mb else 0


if __name__ == "__main__":
    raise SystemExit(main())
