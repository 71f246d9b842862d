"""What the If around an edge graph's layer stack costs a decode step: the bundle against copies of it with one branch
inlined, side by side in one process (not run by CI).

    python scripts/if_cost.py BUNDLE [--prompt 64] [--gen 128] [--rounds 8] [--work /tmp/if-cost]

An `--kernel edge` graph exported before RingAttention switched by fill, or one whose heads RingAttention does not
take, runs every layer inside one If on `ring_full` (exporters/decoder.py: the ring path in `then`, LinearAttention
in `else`); graphs without an If are refused with a message. This writes two copies of BUNDLE under --work: `else`
(the If replaced by its else branch's nodes: LinearAttention at every fill, right only while the ring is linear)
and `then` (the then branch, `ring_full` dropped from the graph and the manifest, so the runtime keeps
RingAttention's inputs current at every step), then checks that each gives the bundle's logits bit for bit on the
prompt and 40 decode steps, and times `--gen` decode steps after a `--prompt`-token prefill, every model in turn
each round. Prints each one's median step and its per-round ratio to the bundle. Keep `--prompt` + `--gen` below
the bundle's ring (sinks + window) for the `else` copy to stay right.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import onnx


def inline(bundle: Path, out: Path, side: str) -> None:
    """`bundle` copied to `out` with its If replaced by the `side` branch's nodes."""
    from edge_runtime.manifest import with_digest

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(bundle, out)
    manifest = json.loads((out / "manifest.json").read_text())
    path = out / manifest["graph"]["file"]
    model = onnx.load(str(path), load_external_data=False)
    nodes = []
    for node in model.graph.node:
        if node.op_type != "If":
            nodes.append(node)
            continue
        branch = next(a.g for a in node.attribute if a.name == f"{side}_branch")
        rename = {o.name: n for o, n in zip(branch.output, node.output, strict=True)}
        for inner in branch.node:
            inner.output[:] = [rename.get(o, o) for o in inner.output]
            inner.input[:] = [rename.get(i, i) for i in inner.input]
            nodes.append(inner)
        model.graph.initializer.extend(branch.initializer)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if side == "then":  # RingAttention at every fill: the runtime must keep its inputs current (no ring_full)
        kept = [i for i in model.graph.input if i.name != "ring_full"]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        manifest["graph"]["inputs"].pop("ring_full", None)
        (out / "manifest.json").write_text(json.dumps(with_digest(manifest), indent=1))
    onnx.save(model, str(path))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/if-cost"))
    a = ap.parse_args()
    from edge_runtime.bench.environment import cpu_line
    from edge_runtime.engine import LoadOptions, load

    graph = json.loads((a.bundle / "manifest.json").read_text())["graph"]["file"]
    if not any(n.op_type == "If" for n in onnx.load(str(a.bundle / graph), load_external_data=False).graph.node):
        raise SystemExit(f"{a.bundle}: its graph has no If around the layers (nothing to measure)")
    paths = {"bundle": a.bundle}
    for side in ("else", "then"):
        paths[side] = a.work / side
        inline(a.bundle, paths[side], side)
    # the copies' files no longer match the manifest's hashes: read them unchecked
    engines = {n: load(p, LoadOptions(threads=a.threads, verify=False)) for n, p in paths.items()}
    ids = list(range(5, 5 + a.prompt))
    ref = engines["bundle"]
    want = [ref.prefill(ids).copy(), *(ref.decode(7 + t).copy() for t in range(40))]
    for name, engine in engines.items():
        engine.reset()  # the bundle's own engine ran the reference
        got = [engine.prefill(ids).copy(), *(engine.decode(7 + t).copy() for t in range(40))]
        same = all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))
        print(f"{name}: logits {'equal to the bundle bit for bit' if same else 'DIFFER from the bundle'}")
    steps: dict[str, list[float]] = {n: [] for n in engines}
    for _ in range(a.rounds):
        for name, engine in engines.items():
            engine.reset()
            engine.prefill(ids)
            ts = []
            for _ in range(a.gen):
                t = time.perf_counter()
                engine.decode(7)
                ts.append(time.perf_counter() - t)
            steps[name].append(statistics.median(ts))
    print(f"cpu: {cpu_line()}")
    print(f"{a.rounds} rounds, prompt {a.prompt}, {a.gen} decode steps, {a.threads} threads")
    for name in engines:
        ratios = [x / y for x, y in zip(steps[name], steps["bundle"], strict=True)]
        print(f"{name}: {statistics.median(steps[name]) * 1e3:.2f} ms/step; step / bundle's: median "
              f"{statistics.median(ratios):.3f} ({' '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
