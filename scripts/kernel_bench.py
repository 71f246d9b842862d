"""Which ONNX Runtime quantized-matmul kernel is fastest here, at decode (M=1) and prefill (M=prompt) sizes.

    python scripts/kernel_bench.py [--hidden 576] [--intermediate 1536] [--layers 30] [--prompt 128]
                                   [--rounds 3] [--threads 2] [--formats nbits4,q4edge]
    python scripts/kernel_bench.py --shape 576x1536x30:1,128 --shape 2048x8192x4:1 [--write PAGE]

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
Only ratios between rows of one run mean anything on a shared machine: the ratio table sets each edge
kernel beside its ONNX Runtime counterpart (and its other implementations), each ratio the median time
of one case over the other's, with the lowest and highest ratio of a single round.

`--shape HIDDENxINTERMEDIATExLAYERS:M[,M...]` (repeatable) measures several shapes in one run, each at its
own M values (without it: --hidden, --intermediate and --layers at M = 1 and --prompt). `--write PAGE`
also writes the tables as a dated Markdown page naming the CPU, vCPUs, load average, commit, ONNX
Runtime's version and the command that regenerates it (the page is replaced, not appended).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
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


# What the page and the ratio table call each format.
NAMES = {
    "fp32": "fp32 MatMul",
    "nbits4": "MatMulNBits 4-bit",
    "q4edge": "edge MatMulQ4",
    "nbits8": "MatMulNBits 8-bit",
    "q8edge": "edge MatMulQ8",
    "dyn8": "DynamicQuantizeMatMul",
}
COUNTERPART = {"q4edge": "nbits4", "q8edge": "nbits8"}  # ONNX Runtime's op on the same weights' layout
SHARED_LOAD = 0.5  # a 1-minute load average at or above this before the run: other work shares the CPU
KNOWN_SHAPES = {(576, 1536): "SmolLM2-135M", (2048, 8192): "Llama-3.2-1B"}  # (hidden, intermediate)


def shape_arg(text: str) -> tuple[int, int, int, tuple[int, ...]]:
    """`HIDDENxINTERMEDIATExLAYERS:M[,M...]`, e.g. 576x1536x30:1,128."""
    try:
        dims, ms = text.split(":")
        hidden, inter, layers = (int(v) for v in dims.split("x"))
        rows = tuple(int(m) for m in ms.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HIDDENxINTERMEDIATExLAYERS:M[,M...]") from None
    if min(hidden, inter, layers, *rows) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every size must be at least 1")
    return hidden, inter, layers, rows


def measure(a: argparse.Namespace, formats: list[str], cases: list, shape: tuple) -> dict:
    """One shape: the graphs built, every (case, M) timed in fresh processes, `--rounds` times."""
    hidden, inter, layers, rows = shape
    n_matmul = 2 * layers
    with tempfile.TemporaryDirectory() as tmp:
        paths = {f: build(f, hidden, inter, layers, Path(tmp)) for f in formats}
        times: dict[tuple[str, int], list[float]] = {}
        for r in range(a.rounds):
            for m in rows:
                for label, f, threads, spin, isa in cases if r % 2 == 0 else reversed(cases):
                    cmd = [sys.executable, __file__, "--threads", str(threads), *([] if spin else ["--no-spin"])]
                    cmd += ["--child", str(paths[f]), str(m)]
                    env = {**os.environ, "EDGE_KERNELS_ISA": isa} if isa else None
                    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
                    times.setdefault((label, m), []).append(json.loads(out) / n_matmul)
        weight_bytes = {f: sum(p.stat().st_size for p in Path(tmp).glob(f"{f}.onnx*")) for f in formats}
    return {"shape": shape, "times": times, "weight_bytes": weight_bytes}


def shape_title(shape: tuple) -> str:
    hidden, inter, layers, _ = shape
    model = KNOWN_SHAPES.get((hidden, inter))
    return (f"{model + ' MLP shapes' if model else 'MLP shapes'}: {2 * layers} MatMuls, "
            f"[{hidden}, {inter}] and [{inter}, {hidden}]")  # fmt: skip


def tables(result: dict, cases: list, pairs: list[tuple[str, str]]) -> list[str]:
    """The ratio table (side by side in this run), then each case's median time per matmul."""
    hidden, inter, layers, rows = result["shape"]
    times, n_matmul = result["times"], 2 * layers

    def ratio(fast: str, slow: str, m: int) -> str:  # slow's time over fast's: above 1, `fast` is faster
        a, b = times[(fast, m)], times[(slow, m)]
        cell = f"{statistics.median(b) / statistics.median(a):.2f}x"
        per_round = [y / x for x, y in zip(a, b, strict=True)]
        return cell + (f" ({min(per_round):.2f}-{max(per_round):.2f})" if len(per_round) > 1 else "")

    out = ["| case | beside | " + " | ".join(f"M={m}" for m in rows) + " |"]
    out.append("| --- | --- |" + " ---: |" * len(rows))
    out += [f"| {fast} | {slow} | " + " | ".join(ratio(fast, slow, m) for m in rows) + " |" for fast, slow in pairs]
    heads = [f"M={m} us | " + ("GB/s of weights" if m == 1 else "GFLOP/s") for m in rows]
    out += ["", "| case | " + " | ".join(heads) + " |"]
    out.append("| --- |" + " ---: | ---: |" * len(rows))
    for label, f, *_ in cases:
        cells = []
        for m in rows:
            t = statistics.median(times[(label, m)])
            rate = result["weight_bytes"][f] / n_matmul / t / 1e9 if m == 1 else 2 * m * hidden * inter / t / 1e9
            cells.append(f"{t * 1e6:.1f} | {rate:.1f}" if m == 1 else f"{t * 1e6:.0f} | {rate:.0f}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument(
        "--shape",
        type=shape_arg,
        action="append",
        metavar="HxIxL:M[,M...]",
        help="a shape and its M values, e.g. 576x1536x30:1,128 (repeatable; replaces the four above)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--formats", help="comma-separated subset of: " + ", ".join(FORMATS) + " (default: all)")
    ap.add_argument("--write", type=Path, metavar="PAGE", help="also write the tables as a Markdown page (replaced)")
    ap.add_argument("--no-spin", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "M"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.threads, not a.no_spin)))
        return 0
    from edge_runtime import kernels

    wanted = a.formats.split(",") if a.formats else list(FORMATS)
    if unknown := set(wanted) - set(FORMATS):
        ap.error(f"unknown --formats {sorted(unknown)}; choose from {', '.join(FORMATS)}")
    formats = [f for f in FORMATS if f in wanted and (f not in EDGE_FORMATS or kernels.available())]
    # (label, format, intra-op threads, spinning workers, EDGE_KERNELS_ISA or None for the default)
    names = {f: NAMES[f] + (f" ({kernels.isa()})" if f in EDGE_FORMATS else "") for f in formats}
    cases = [(names[f], f, a.threads, True, None) for f in formats]
    comparisons = []  # (case, beside): the ratio of the two's times, taken side by side
    for f in EDGE_FORMATS:  # the other implementations this CPU runs beside the default one
        if f in formats:
            at = next(i for i, c in enumerate(cases) if c[1] == f)
            others = [isa for isa in kernels.runnable() if isa != kernels.isa()]
            cases[at + 1 : at + 1] = [(f"{NAMES[f]} ({isa})", f, a.threads, True, isa) for isa in others]
            edge = [c[0] for c in cases if c[1] == f]
            if COUNTERPART[f] in formats:
                comparisons += [(label, NAMES[COUNTERPART[f]]) for label in edge]
            comparisons += [(edge[0], label) for label in edge[1:]]
    if {"nbits4", "fp32"} <= set(formats):
        comparisons.append((NAMES["nbits4"], NAMES["fp32"]))
    if {"dyn8", "nbits8"} <= set(formats):
        comparisons.append((NAMES["dyn8"], NAMES["nbits8"]))
    if not a.formats:
        cases += [(f"{NAMES['nbits4']}, 1 thread", "nbits4", 1, True, None)]
        cases += [(f"{NAMES['nbits4']}, workers sleep", "nbits4", a.threads, False, None)]
        comparisons += [(NAMES["nbits4"], c[0]) for c in cases[-2:]]
    shapes = a.shape or [(a.hidden, a.intermediate, a.layers, (1, a.prompt))]
    load_before, t0 = os.getloadavg(), time.monotonic()
    results = [measure(a, formats, cases, shape) for shape in shapes]
    seconds, load_after = time.monotonic() - t0, os.getloadavg()
    from edge_runtime.bench.environment import cpu_line

    print(f"cpu: {cpu_line()}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; {seconds:.0f} s")
    for result in results:
        print(f"\n{shape_title(result['shape'])}; {a.threads} threads unless noted, {a.rounds} rounds "
              "(ratio: the second case's median time over the first's; medians per matmul)\n")  # fmt: skip
        print("\n".join(tables(result, cases, comparisons)))
    if a.write is not None:
        write_page(a, results, cases, comparisons, load_before, load_after, seconds)
    return 0


def provenance() -> tuple[str, str, str]:
    """The commit (noting uncommitted changes), ONNX Runtime's version, and this machine's CPU line."""
    from importlib import metadata

    from edge_runtime.bench.environment import cpu_line

    git = ["git", "-C", str(Path(__file__).resolve().parent)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
    commit = (commit or "unknown") + (" + uncommitted changes" if dirty else "")
    l3 = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")  # e.g. "491520K"
    size = l3.read_text().strip() if l3.is_file() else ""
    cache = f", L3 {int(size[:-1]) // 1024} MiB as the OS reports it" if size.endswith("K") else ""
    cpu = f"{cpu_line()}, {os.cpu_count()} vCPUs{cache}"
    return commit, metadata.version("onnxruntime"), cpu


def load_sentence(before: tuple, after: tuple) -> str:
    """Load averages around the run, and whether other work shared the machine."""
    vcpus = os.cpu_count() or 1
    shared = "shared with other work" if before[0] >= SHARED_LOAD else "otherwise idle"
    return (f"The machine was {shared}: load average (1, 5, 15 min) {', '.join(f'{v:.2f}' for v in before)} before "
            f"the run and {', '.join(f'{v:.2f}' for v in after)} after it (the run's own processes included), "
            f"on {vcpus} vCPUs.")  # fmt: skip


def write_page(a, results, cases, comparisons, load_before, load_after, seconds) -> None:
    from datetime import datetime, timezone

    from edge_runtime.atomic_write import write_file

    commit, ort_version, cpu = provenance()
    command = shlex.join(["python", "scripts/kernel_bench.py", *sys.argv[1:]])
    sections = []
    for result in results:
        sections += ["", f"## {shape_title(result['shape'])}", "", *tables(result, cases, comparisons)]
    text = "\n".join(
        [
            "# Edge kernels beside ONNX Runtime's",
            "",
            f"Measured {datetime.now(timezone.utc):%Y-%m-%d} on {cpu}; commit {commit}, ONNX Runtime "
            f"{ort_version}, {a.threads} intra-op threads unless a row says otherwise, {a.rounds} rounds in "
            f"{seconds / 60:.1f} minutes. {load_sentence(load_before, load_after)}"
            + (
                " Other work on the same vCPUs delays a multi-threaded session's workers most: rows that differ "
                "in thread count or spinning compare least well in such a run."
                if load_before[0] >= SHARED_LOAD and a.threads > 1
                else ""
            ),
            "",
            f"Regenerate: `{command}` (this replaces the page).",
            "",
            "Each graph is a chain of MatMuls alternating [hidden, intermediate] and [intermediate, hidden] (a "
            "model's MLP matrices, random weights), quantized by ONNX Runtime's own tools: MatMulNBits at block 32, "
            "symmetric, accuracy level 4 (int8 compute); edge MatMulQ4 on the same 4-bit codes with the scales in "
            "fp16, as exports write them; edge MatMulQ8 on per-channel int8 codes (the exporter's rounding) beside "
            "8-bit MatMulNBits at block 32. Each case and M is timed in a fresh process, the cases' order reversed "
            "every other round; times are medians per matmul. An edge row names the implementation that ran: the one "
            "this CPU picks by default, then each other one it can run (pinned with `EDGE_KERNELS_ISA`); AMX takes "
            "calls of 17 rows or more and runs the VNNI code below that, so at M=1 the `amx` and `avx512vnni` rows "
            "run the same code.",
            "",
            "Ratios are the `beside` case's median time over the `case`'s (above 1: `case` is faster), measured "
            "side by side in this run; in brackets the lowest and highest ratio within one round. Compare ratios, "
            "not absolute times, between runs and CPUs. How the kernels work: "
            "[guides/kernels.md](../guides/kernels.md).",
            *sections,
            "",
        ]
    )
    write_file(a.write, [text.encode("utf-8")])
    print(f"# wrote {a.write}")


if __name__ == "__main__":
    raise SystemExit(main())
