"""Which ONNX Runtime quantized-matmul kernel is fastest here, at decode (M=1) and prefill (M=prompt) sizes.

    python scripts/kernel_bench.py [--hidden 576] [--intermediate 1536] [--layers 30] [--prompt 128]
                                   [--rounds 3] [--threads 2] [--formats nbits4,q4edge]

Builds one graph per weight format: a chain of 2 x `--layers` MatMuls alternating [hidden, intermediate]
and [intermediate, hidden] (the MLP matrices of the model shape; random weights), quantized with
onnxruntime's own tools:
  fp32        MatMul
  nbits4      MatMulNBits 4-bit, block 32, symmetric, accuracy_level 4 (int8 compute): our int4 layers
  q4edge      edge-runtime's MatMulQ4 on nbits4's very codes, scales in fp16 as exports write them
              (--kernel edge; where its library is built), and again on each other implementation
              the CPU runs (EDGE_KERNELS_ISA=avx2, avx512vnni, amx)
  nbits8      MatMulNBits 8-bit, block 32, accuracy_level 4 (our int8 layers with --kernel mlas, which
              repeat the per-channel scale over blocks of 64 or 128)
  q8edge      edge-runtime's MatMulQ8 on per-channel int8 codes (our int8 layers with --kernel edge), and
              again on each other implementation the CPU runs
  dyn8        DynamicQuantizeMatMul (quantize_dynamic, per-channel int8 weights): the activation gets one
              uint8 scale per tensor per run, so one outlier token coarsens every row of a prompt
and two session-option variants of nbits4 (one intra-op thread; workers that sleep instead of spin;
left out when --formats names a subset).
Each (case, M) is timed in its own fresh process (ONNX Runtime's spinning workers of one session would
slow another's), formats alternating, `--rounds` times; medians per matmul and weight bandwidth at M=1.
Only ratios between rows of one run mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FORMATS = ("fp32", "nbits4", "q4edge", "nbits8", "q8edge", "dyn8")
EDGE_FORMATS = ("q4edge", "q8edge")


def build(fmt: str, hidden: int, inter: int, layers: int, out: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(2 * layers):
        k, n = (hidden, inter) if i % 2 == 0 else (inter, hidden)
        inits.append(numpy_helper.from_array((rng.standard_normal((k, n)) * 0.02).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"], name=f"/mlp.{i}/MatMul"))
        x = f"y{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", hidden])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["M", hidden])],
        inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    path = out / f"{fmt}.onnx"
    if fmt == "fp32":
        onnx.save(model, path)
    elif fmt.startswith("nbits") or fmt == "q4edge":
        try:
            from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
        except ModuleNotFoundError as e:  # ONNX Runtime >= 1.22's quantization tool imports onnx_ir
            raise SystemExit(f"kernel_bench.py: {e} (ONNX Runtime's quantizer needs it: pip install onnx-ir)") from e

        bits = 4 if fmt == "q4edge" else int(fmt[5:])
        q = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=True, accuracy_level=4, bits=bits)
        q.process()
        quantized = q.model.model
        if fmt == "q4edge":  # the same codes; MatMulQ4 takes only K and N, and fp16 scales
            from edge_runtime import kernels

            for init in quantized.graph.initializer:
                if init.name.endswith("_scales"):
                    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
            for node in quantized.graph.node:
                if node.op_type == "MatMulNBits":
                    keep = {a.name: a.i for a in node.attribute if a.name in ("K", "N")}
                    node.op_type, node.domain = kernels.MATMUL_Q4, kernels.DOMAIN
                    del node.attribute[:]
                    node.attribute.extend(helper.make_attribute(k, v) for k, v in keep.items())
            quantized.opset_import.append(helper.make_opsetid(kernels.DOMAIN, 1))
        onnx.save(quantized, path)
    elif fmt == "q8edge":  # the exporter's own INT8 rounding, one scale per output channel
        from edge_runtime import kernels
        from edge_runtime.exporters.quant import quantize_rtn

        for node in model.graph.node:
            w = next(i for i in model.graph.initializer if i.name == node.input[1])
            k, n = w.dims
            qm = quantize_rtn(numpy_helper.to_array(w).T, 8)  # [n, k]
            b = (qm.codes.astype(np.int16) + 128).astype(np.uint8)
            model.graph.initializer.remove(w)
            model.graph.initializer.extend(
                [
                    numpy_helper.from_array(b, f"{w.name}_q8"),
                    numpy_helper.from_array(qm.scales[:, 0].astype(np.float32), f"{w.name}_s"),
                ]
            )
            node.op_type, node.domain = kernels.MATMUL_Q8, kernels.DOMAIN
            node.input[1:] = [f"{w.name}_q8", f"{w.name}_s"]
            node.attribute.extend([helper.make_attribute("K", k), helper.make_attribute("N", n)])
        model.opset_import.append(helper.make_opsetid(kernels.DOMAIN, 1))
        onnx.save(model, path)
    else:
        import logging

        from onnxruntime.quantization import QuantType, quantize_dynamic

        logging.getLogger().setLevel(logging.WARNING)  # one INFO line per tensor otherwise

        onnx.save(model, out / "float.onnx")
        quantize_dynamic(out / "float.onnx", path, weight_type=QuantType.QInt8, per_channel=True)
    return path


def child(path: str, m: int, threads: int, spin: bool) -> float:
    """Median seconds per run of the chain at M=m, in this (fresh) process."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    from edge_runtime import kernels

    kernels.register(so)
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((m, int(sess.get_inputs()[0].shape[1]))).astype(np.float32)
    reps = 20 if m == 1 else 3
    for _ in range(reps):
        sess.run(None, {"x": x})
    samples = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(reps):
            sess.run(None, {"x": x})
        samples.append((time.perf_counter() - t) / reps)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--formats", help="comma-separated subset of: " + ", ".join(FORMATS) + " (default: all)")
    ap.add_argument("--no-spin", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "M"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.threads, not a.no_spin)))
        return 0
    n_matmul = 2 * a.layers
    from edge_runtime import kernels

    wanted = a.formats.split(",") if a.formats else list(FORMATS)
    if unknown := set(wanted) - set(FORMATS):
        ap.error(f"unknown --formats {sorted(unknown)}; choose from {', '.join(FORMATS)}")
    formats = [f for f in FORMATS if f in wanted and (f not in EDGE_FORMATS or kernels.available())]
    # (label, format, intra-op threads, spinning workers, EDGE_KERNELS_ISA or None for the default)
    cases = [(f, f, a.threads, True, None) for f in formats]
    for f in EDGE_FORMATS:  # the other implementations this CPU runs beside the default one
        if f in formats:
            at = next(i for i, c in enumerate(cases) if c[1] == f)
            others = [isa for isa in kernels.runnable() if isa != kernels.isa()]
            cases[at + 1 : at + 1] = [(f"{f}, {isa} kernel", f, a.threads, True, isa) for isa in others]
    if not a.formats:
        cases += [("nbits4, 1 thread", "nbits4", 1, True, None)]
        cases += [("nbits4, no spinning", "nbits4", a.threads, False, None)]
    with tempfile.TemporaryDirectory() as tmp:
        paths = {f: build(f, a.hidden, a.intermediate, a.layers, Path(tmp)) for f in formats}
        times: dict[tuple[str, int], list[float]] = {}
        for r in range(a.rounds):
            for m in (1, a.prompt):
                for label, f, threads, spin, isa in cases if r % 2 == 0 else reversed(cases):
                    cmd = [sys.executable, __file__, "--threads", str(threads), *([] if spin else ["--no-spin"])]
                    cmd += ["--child", str(paths[f]), str(m)]
                    env = {**os.environ, "EDGE_KERNELS_ISA": isa} if isa else None
                    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
                    times.setdefault((label, m), []).append(json.loads(out) / n_matmul)
        weight_bytes = {f: sum(p.stat().st_size for p in Path(tmp).glob(f"{f}.onnx*")) for f in formats}
    from edge_runtime.bench.environment import cpu_line

    print(f"cpu: {cpu_line()}")
    print(f"{n_matmul} MatMuls of [{a.hidden}, {a.intermediate}] / [{a.intermediate}, {a.hidden}], "
          f"{a.threads} threads unless noted, {a.rounds} rounds (medians per matmul)\n")  # fmt: skip
    print(f"| case | M=1 us | M=1 GB/s of weights | M={a.prompt} us | M={a.prompt} GFLOP/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    flops = 2 * a.prompt * a.hidden * a.intermediate
    for label, f, *_ in cases:
        t1, tp = statistics.median(times[(label, 1)]), statistics.median(times[(label, a.prompt)])
        gbs = weight_bytes[f] / n_matmul / t1 / 1e9
        print(f"| {label} | {t1 * 1e6:.1f} | {gbs:.1f} | {tp * 1e6:.0f} | {flops / tp / 1e9:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
