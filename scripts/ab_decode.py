"""Decode step time of bundles and onnxruntime-genai folders, side by side in one process.

    python scripts/ab_decode.py BUNDLE [BUNDLE ...] [--genai FOLDER] [--window N] [--rounds 8] [--batch 1 4]

Loads every model once, then for `--rounds` rounds runs each in turn: a `--prompt`-token prefill, then
`--gen` single-token decode steps. Rounds interleave the models, so a shared machine's drift hits all of
them alike. Prints each model's median step time and its per-round ratio to the reference (the genai
folder if given, else the last bundle), and each bundle's KV cache dtype and bytes. `--window` sizes our
ring: a small one (e.g. 60 with the default 128-token prompt) keeps it full, measuring the steady state of
an unbounded stream rather than the fill. `--prompt` is the context depth the decode steps run at: a
prompt of at least sinks + window tokens (2048 with --window 2044) decodes at a full ring of that size.
Compare graphs of different runtime versions by running this at each commit against the same genai folder.
`--batch 1 4` measures each bundle's steps over 1 and over 4 caches (Model.decode_batch: one call decoding a
token of each, as edge-serve --parallel batches its streams; each cache prefilled with the prompt) in the same
rounds, and prints each batch's step time against the bundle's first batch size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", type=Path, nargs="+")
    ap.add_argument("--genai", type=Path, help="an onnxruntime-genai model folder (the reference)")
    ap.add_argument("--window", type=int, help="our ring window [the bundle's]")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, nargs="+", default=[1], help="caches decoded per step [1]")
    a = ap.parse_args()
    from edge_runtime.engine import LoadOptions, load

    caches = max(a.batch)
    engines = {str(b): load(b, LoadOptions(threads=a.threads, window=a.window, caches=caches)) for b in a.bundles}
    if caches > 1:
        return batched(engines, a)
    genai = None
    if a.genai:
        import onnxruntime_genai as og

        config = og.Config(str(a.genai))
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": a.threads}}}}))
        genai = (og, og.Model(config))
    ids = list(range(5, 5 + a.prompt))
    names = [*engines, *([str(a.genai)] if genai else [])]
    steps: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(a.rounds):
        for name, engine in engines.items():
            engine.reset()
            engine.prefill(ids)
            t = time.perf_counter()
            for _ in range(a.gen):
                engine.decode(7)
            steps[name].append((time.perf_counter() - t) / a.gen)
        if genai:
            og, model = genai
            params = og.GeneratorParams(model)
            total = a.prompt + a.gen + 1
            params.set_search_options(do_sample=False, max_length=total, min_length=total)
            generator = og.Generator(model, params)
            generator.append_tokens(np.asarray(ids, np.int32))
            generator.generate_next_token()
            t = time.perf_counter()
            for _ in range(a.gen):
                generator.generate_next_token()
            steps[str(a.genai)].append((time.perf_counter() - t) / a.gen)
            del generator
    ref = names[-1]
    from edge_runtime.bench.environment import cpu_line

    print(f"cpu: {cpu_line()}")
    print(f"{a.rounds} rounds, prompt {a.prompt}, {a.gen} decode steps, window {a.window or 'bundle default'}, "
          f"{a.threads} threads")  # fmt: skip
    for name in names:
        ratios = [x / y for x, y in zip(steps[name], steps[ref], strict=True)]
        e = engines.get(name)
        kv = f" [KV {e.pool.keys[0].dtype}, {e.pool.kv_nbytes() / 1e6:.1f} MB, {e.geometry.capacity} rows]" if e else ""
        step = statistics.median(steps[name])
        print(f"{name}{kv}: {step * 1e3:.2f} ms/step ({1 / step:.1f} tok/s); step time / reference: median "
              f"{statistics.median(ratios):.3f} ({' '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
    return 0


def batched(engines: dict, a: argparse.Namespace) -> int:
    """Steps over `a.batch` caches, every size of every bundle in each round."""
    ids = list(range(5, 5 + a.prompt))
    steps: dict[tuple[str, int], list[float]] = {(n, b): [] for n in engines for b in a.batch}
    for _ in range(a.rounds):
        for name, engine in engines.items():
            model = engine.model
            for b in a.batch:
                for cache in model.caches[:b]:
                    cache.reset()
                    model.prefill(cache, ids)
                t = time.perf_counter()
                for _ in range(a.gen):
                    model.decode_batch(model.caches[:b], [7] * b)
                steps[name, b].append((time.perf_counter() - t) / a.gen)
    from edge_runtime.bench.environment import cpu_line

    print(f"cpu: {cpu_line()}")
    print(f"{a.rounds} rounds, prompt {a.prompt} in each cache, {a.gen} steps, window {a.window or 'bundle default'}, "
          f"{a.threads} threads")  # fmt: skip
    for name, engine in engines.items():
        kv = engine.cache.pool.keys[0]
        print(f"{name} [KV {kv.dtype}]")
        first = a.batch[0]
        for b in a.batch:
            ratios = [x / y for x, y in zip(steps[name, b], steps[name, first], strict=True)]
            step = statistics.median(steps[name, b])
            print(f"  {b} caches: {step * 1e3:.2f} ms/step ({b / step:.1f} tok/s); step / {first}-cache step: median "
                  f"{statistics.median(ratios):.3f} ({' '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    from edge_runtime.errors import EdgeRuntimeError

    try:
        raise SystemExit(main())
    except EdgeRuntimeError as e:  # a bad bundle path or geometry: one line, not a traceback
        raise SystemExit(f"error: {e}") from None
