"""The quantized-matmul floor of a decode step: every MatMulNBits (and edge-runtime MatMulQ4/Q8) node of
each graph, fed one right-sized token, nothing else; timed side by side in one process ("show
the arithmetic").

    python scripts/matmul_floor.py OURS/model.onnx THEIRS/model.onnx [--rounds 15] [--runs 20]

Both graphs run on the same ONNX Runtime kernels, so a decode step can be no faster than its graph's
MatMulNBits alone: if ours is F_ours and theirs runs a whole step in T_theirs, ours can be at most
T_theirs / F_ours times faster, whatever else it fuses. Prints each floor and its ratio to the last
graph's, medians of paired rounds (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from edge_runtime import kernels

FLOOR_OPS = ("MatMulNBits", kernels.MATMUL_Q4, kernels.MATMUL_Q8)


def _floor_nodes(graph: onnx.GraphProto, seen: set[str]) -> list[onnx.NodeProto]:
    """Every quantized-matmul node, If branches included (edge bundles exported before RingAttention switched by
    fill hold the layers in a decoder-wide If); each weight counted once, as a step runs one branch."""
    nodes = []
    for n in graph.node:
        if n.op_type in FLOOR_OPS and n.input[1] not in seen:
            seen.add(n.input[1])
            nodes.append(n)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                nodes += _floor_nodes(a.g, seen)
    return nodes


def floor_session(path: str, threads: int) -> tuple[ort.InferenceSession, dict[str, np.ndarray], int]:
    """A session of `path`'s quantized-matmul nodes only, each reading a [1, 1, K] input of its K."""
    model = onnx.load(path)
    nodes = _floor_nodes(model.graph, set())
    inits = {i.name: i for i in model.graph.initializer}

    def k_of(node: onnx.NodeProto) -> int:
        return next(a.i for a in node.attribute if a.name == "K")

    ks = sorted({k_of(n) for n in nodes})
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, 1, k]) for k in ks]
    new_nodes, outputs, used = [], [], []
    for i, n in enumerate(nodes):
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        del copy.input[:], copy.output[:]
        copy.input.extend([f"x{k_of(n)}", *n.input[1:]])
        copy.output.append(f"y{i}")
        new_nodes.append(copy)
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
        used += list(n.input[1:])
    weights = [inits[u] for u in dict.fromkeys(used) if u in inits]
    graph = helper.make_graph(new_nodes, "matmul_floor", inputs, outputs, weights)
    floor = helper.make_model(graph, opset_imports=list(model.opset_import))
    floor.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    kernels.register(so)
    session = ort.InferenceSession(floor.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {f"x{k}": rng.standard_normal((1, 1, k)).astype(np.float32) for k in ks}
    return session, feeds, len(nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="model.onnx files; ratios are to the last one")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--runs", type=int, default=20, help="steps per round")
    args = ap.parse_args()
    missing = [m for m in args.models if not Path(m).is_file()]
    if missing:
        raise SystemExit(f"not a file: {', '.join(missing)} (give each bundle's model.onnx)")
    sessions = {m: floor_session(m, args.threads) for m in args.models}
    for s, feeds, _ in sessions.values():  # warm-up: pre-packing, arena growth
        for _ in range(10):
            s.run(None, feeds)
    times: dict[str, list[float]] = {m: [] for m in sessions}
    for _ in range(args.rounds):
        for m, (s, feeds, _) in sessions.items():
            t0 = time.perf_counter()
            for _ in range(args.runs):
                s.run(None, feeds)
            times[m].append((time.perf_counter() - t0) / args.runs)
    ref = args.models[-1]
    from edge_runtime.bench.environment import cpu_line

    print(f"cpu: {cpu_line()}")
    for m, (_, _, n) in sessions.items():
        ratio = statistics.median(a / b for a, b in zip(times[m], times[ref], strict=True))
        floor = statistics.median(times[m]) * 1e3
        print(f"{m}: {n} quantized matmuls, floor {floor:.2f} ms per step, {ratio:.3f}x the last")


if __name__ == "__main__":
    main()
