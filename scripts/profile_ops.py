"""Per-operator time of a decode step (or, with --prefill, of the prompt's run), ours and (optionally)
onnxruntime-genai's, from ONNX Runtime's profiler.

    python scripts/profile_ops.py BUNDLE_DIR [--genai GENAI_DIR] [--prompt-tokens 128] [--gen-tokens 128]
                                  [--prefill]

Runs one generation per side with ONNX Runtime's per-node profiling on (2 threads, greedy, EOS ignored;
our ring sized to the request), then sums each operator type's kernel time over the decode steps and
prints it per step, with nodes per step and time per node. The profiler adds a few microseconds to every
node, so small nodes look dearer than they are; compare the two sides, and node counts, rather than
reading absolute figures. Profiles are written under --out (default: a temporary folder, deleted).
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

import numpy as np


def ours(bundle: Path, out: Path, prompt: list[int], gen: int, threads: int) -> Path:
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.manifest import Manifest

    sinks = Manifest.read(bundle / "manifest.json").cache.sinks
    opts = LoadOptions(threads=threads, window=len(prompt) + gen - sinks, profile=out / "ours")
    engine = load(bundle, opts)
    logits = engine.prefill(prompt)
    for _ in range(gen - 1):
        logits = engine.decode(int(np.argmax(logits)))
    path = engine.backend.end_profiling()
    assert path is not None
    return path


def theirs(folder: Path, out: Path, prompt: list[int], gen: int, threads: int) -> Path:
    import onnxruntime_genai as og

    options = {"intra_op_num_threads": threads, "enable_profiling": str(out / "theirs")}
    config = og.Config(str(folder))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + gen, min_length=len(prompt) + gen)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(prompt, dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    del generator, model  # the profile is written when the session closes
    return max(out.glob("theirs*.json"), key=lambda p: p.stat().st_mtime)


def per_op(profile: Path, steps: int) -> tuple[float, dict[str, tuple[float, float]]]:
    """(model_run us per step, {op: (kernel us per step, nodes per step)}) over the last `steps` runs."""
    events = json.loads(profile.read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"][-steps:]
    start, end = runs[0]["ts"], runs[-1]["ts"] + runs[-1]["dur"]
    time: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and start <= e["ts"] <= end:
            op = e["args"].get("op_name", "?")
            time[op] += e["dur"]
            count[op] += 1
    n = len(runs)
    return sum(r["dur"] for r in runs) / n, {op: (t / n, count[op] / n) for op, t in time.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--genai", type=Path, help="an onnxruntime-genai model folder to profile alongside")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, help="keep the profiles here")
    ap.add_argument("--prefill", action="store_true", help="profile the prompt's run (one token generated)")
    a = ap.parse_args()
    prompt = [5 + i % 1000 for i in range(a.prompt_tokens)]
    if a.prefill:
        a.gen_tokens, steps, what = 1, 1, "prefill"  # the one run is the prompt's
    else:
        steps, what = a.gen_tokens - 8, "decode step"  # decode steps only, clear of the prompt's runs
    with tempfile.TemporaryDirectory() as tmp:
        out = a.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        sides = {"edge-runtime": ours(a.bundle, out, prompt, a.gen_tokens, a.threads)}
        if a.genai:
            sides["onnxruntime-genai"] = theirs(a.genai, out, prompt, a.gen_tokens, a.threads)
        results = {side: per_op(path, steps) for side, path in sides.items()}
    for side, (run_us, ops) in results.items():
        total = sum(t for t, _ in ops.values())
        nodes = sum(n for _, n in ops.values())
        print(f"\n{side}: model_run {run_us:.0f} us per {what}; kernels {total:.0f} us in {nodes:.0f} nodes\n")
        print(f"| op | us per {what} | nodes per {what} | us per node |")
        print("| --- | ---: | ---: | ---: |")
        for op, (t, n) in sorted(ops.items(), key=lambda kv: -kv[1][0]):
            print(f"| {op} | {t:.0f} | {n:.1f} | {t / n:.1f} |")
    return 0


if __name__ == "__main__":
    from edge_runtime.errors import EdgeRuntimeError

    try:
        raise SystemExit(main())
    except EdgeRuntimeError as e:  # a bad bundle path or geometry: one line, not a traceback
        raise SystemExit(f"error: {e}") from None
