"""Start-up: what running a bundle imports, and the ONNX graph reader that keeps `onnx` off that path.

Loading a bundle and generating (the Python API, edge-run, edge-bench, edge-serve's build) must not import
`onnx` (half a second or more of ml_dtypes before the first token); `--help` of every command loads neither
onnxruntime nor numpy. edge_runtime/onnx_graph.py reads the graph's ops and initializer types from the
protobuf wire format: it must answer as `onnx` does on every kind of bundle, and refuse garbage in one line
without looping or allocating by a claimed length. scripts/startup_time.py measures the times.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from edge_runtime import kernels
from edge_runtime.errors import BundleError
from edge_runtime.onnx_graph import MAX_DEPTH, Graph, graph_ops, read_graph

needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"{kernels.unavailable_reason()}")

# What a run must not load, and what --help must not load besides.
RUN_FORBIDDEN = ("onnx", "ml_dtypes")
HELP_FORBIDDEN = (*RUN_FORBIDDEN, "onnxruntime", "numpy", "jinja2", "tokenizers")


# name here -> conftest.DemoBundles kind: the graph forms an export writes
_KINDS = {
    "fp32": "fp32",
    "int4-matmulnbits": "int4-mlas",
    "int8-matmulnbits": "int8-mlas",
    "trt-fp16": "trt-fp16",
    "trt-int4": "trt-int4",
}
if kernels.available():  # --kernel edge exports are refused where the ops cannot run
    _KINDS |= {"edge-int4": "int4-edge", "edge-int8": "int8-edge"}


@pytest.fixture(scope="module")
def bundles(demo_bundles) -> dict[str, Path]:
    """The demo model exported in every graph form (shared with the other modules that want them all)."""
    return {name: demo_bundles[kind] for name, kind in _KINDS.items()}


# -- the reader against onnx ------------------------------------------------------------------------------


def _onnx_answer(model: onnx.ModelProto) -> tuple[set[tuple[str, str]], dict[str, int], list[tuple[str, ...]]]:
    """What the runtime used to take from onnx: every node's (domain, op_type) through GRAPH attributes, the
    main graph's initializer types and its nodes' inputs."""
    ops: set[tuple[str, str]] = set()
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        for node in g.node:
            ops.add((node.domain, node.op_type))
            graphs.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
    types = {i.name: i.data_type for i in model.graph.initializer}
    return ops, types, [tuple(n.input) for n in model.graph.node]


def _reader_answer(graph: Graph) -> tuple[set[tuple[str, str]], dict[str, int], list[tuple[str, ...]]]:
    return graph_ops(graph), graph.initializer_types, [n.inputs for n in graph.nodes]


def test_the_readers_field_numbers_and_values_are_onnx_protos():
    from edge_runtime import onnx_graph as g

    fields = {
        (onnx.ModelProto, "graph"): g.MODEL_GRAPH,
        (onnx.GraphProto, "node"): g.GRAPH_NODE,
        (onnx.GraphProto, "initializer"): g.GRAPH_INITIALIZER,
        (onnx.NodeProto, "input"): g.NODE_INPUT,
        (onnx.NodeProto, "op_type"): g.NODE_OP_TYPE,
        (onnx.NodeProto, "attribute"): g.NODE_ATTRIBUTE,
        (onnx.NodeProto, "domain"): g.NODE_DOMAIN,
        (onnx.AttributeProto, "g"): g.ATTRIBUTE_G,
        (onnx.AttributeProto, "type"): g.ATTRIBUTE_TYPE,
        (onnx.TensorProto, "data_type"): g.TENSOR_DATA_TYPE,
        (onnx.TensorProto, "name"): g.TENSOR_NAME,
    }
    for (message, name), number in fields.items():
        assert message.DESCRIPTOR.fields_by_name[name].number == number, (message.__name__, name)
    assert g.ATTRIBUTE_GRAPH == onnx.AttributeProto.GRAPH
    assert set(onnx.AttributeProto.AttributeType.values()) == set(g.ATTRIBUTE_TYPES)
    assert (g.INT4, g.INT8, g.UINT8) == (TensorProto.INT4, TensorProto.INT8, TensorProto.UINT8)


def test_the_reader_answers_as_onnx_on_every_bundle_kind(bundles):
    for name, path in bundles.items():
        model = onnx.load(str(path / "model.onnx"), load_external_data=False)
        want = _onnx_answer(model)
        assert _reader_answer(read_graph(path / "model.onnx")) == want, name
        assert want[0], name  # a graph with nodes: the comparison compared something


def test_the_bundle_kinds_hold_the_ops_the_backend_looks_for(bundles):
    """kernel_ops and graph_weight_types, the two callers, on the graphs where their answer matters."""
    from edge_runtime.backends.trt_engine import graph_weight_types

    assert graph_weight_types(bundles["trt-fp16"] / "model.onnx") == set()
    assert graph_weight_types(bundles["trt-int4"] / "model.onnx") == {"int4", "int8"}
    assert ("com.microsoft", "MatMulNBits") in graph_ops(read_graph(bundles["int4-matmulnbits"] / "model.onnx"))
    if "edge-int4" in bundles:
        ops = graph_ops(read_graph(bundles["edge-int4"] / "model.onnx"))
        assert {(kernels.DOMAIN, kernels.MATMUL_Q4), (kernels.DOMAIN, kernels.RING_ATTENTION)} <= ops


@needs_kernels
def test_kernel_ops_of_a_loaded_engine_are_the_graphs_edge_ops(bundles):
    from edge_runtime.engine import load

    for name in ("edge-int4", "edge-int8", "int4-matmulnbits"):
        model = onnx.load(str(bundles[name] / "model.onnx"), load_external_data=False)
        want = {op for domain, op in _onnx_answer(model)[0] if domain == kernels.DOMAIN}
        assert load(bundles[name]).backend.kernel_ops() == want, name


def _nested_model(depth: int, *, graphs_attribute: bool = False) -> onnx.ModelProto:
    """A model whose If nodes nest `depth` subgraphs, an edge op at the bottom (and optionally a GRAPHS
    attribute, which neither walk follows)."""
    inner = helper.make_graph(
        [helper.make_node(kernels.SILU_MUL, ["x"], ["y"], domain=kernels.DOMAIN)],
        "inner",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    empty = helper.make_graph([], "empty", [], [])
    for level in range(depth):  # the else branches empty: the file grows linearly with the depth
        node = helper.make_node("If", ["c"], [f"y{level}"], then_branch=inner, else_branch=empty)
        if graphs_attribute:
            node.attribute.append(helper.make_attribute("bodies", [inner]))
        inner = helper.make_graph(
            [helper.make_node("Relu", ["a"], ["b"]), node],
            f"g{level}",
            [],
            [helper.make_tensor_value_info(f"y{level}", TensorProto.FLOAT, [1])],
            initializer=[helper.make_tensor(f"w{level}", TensorProto.INT8, [2], [1, 2])],
        )
    return helper.make_model(inner)


def test_the_reader_follows_subgraphs_and_merges_repeated_fields_as_protobuf_does(tmp_path):
    model = _nested_model(3, graphs_attribute=True)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    assert _reader_answer(read_graph(path)) == _onnx_answer(model)
    assert (kernels.DOMAIN, kernels.SILU_MUL) in graph_ops(read_graph(path))
    # Two serialized messages back to back are one message with both merged: graph fields concatenate.
    other = helper.make_model(
        helper.make_graph([helper.make_node("Neg", ["p"], ["q"], domain="")], "other", [], []),
    )
    path.write_bytes(model.SerializeToString() + other.SerializeToString())
    merged = onnx.load(str(path), load_external_data=False)
    assert len(merged.graph.node) == 3
    assert _reader_answer(read_graph(path)) == _onnx_answer(merged)


def test_an_empty_file_is_an_empty_model(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"")
    assert read_graph(path) == Graph((), {})


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x3a\xff\xff\xff\xff\x0f", "claims"),  # graph: 4 GiB claimed, none present
        (b"\x3a\x05\x0a\x80", "claims"),  # a node's length past its graph's end
        (b"\x3a", "past the end"),  # a length cut off
        (b"\x08" + b"\xff" * 11, "past 10 bytes"),  # an endless varint
        (b"\x3b\x00", "wire type 3"),  # a group
        (b"\x00\x00", "field number 0"),
        (b"\x3a\x04\x0a\x02\x22\x05", "claims"),  # op_type: 5 bytes claimed, none left in its node
        (b"\x3a\x05\x0a\x03\x22\x01\xff", "not UTF-8"),  # op_type
        (b"\x0d\x00\x00", "past the end"),  # a fixed32 cut off
    ],
)
def test_garbage_is_one_bundle_error_line(tmp_path, data, why):
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    with pytest.raises(BundleError, match=why) as e:
        read_graph(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_subgraphs_nest_a_bounded_depth(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(_nested_model(MAX_DEPTH).SerializeToString())
    assert (kernels.DOMAIN, kernels.SILU_MUL) in graph_ops(read_graph(path))
    path.write_bytes(_nested_model(MAX_DEPTH + 1).SerializeToString())
    with pytest.raises(BundleError, match="nest more than"):
        read_graph(path)


def test_truncated_and_corrupted_models_are_read_as_onnx_reads_them_or_refused(tmp_path):
    """Every prefix of a small model, and seeded byte flips: the reader answers as onnx does where both
    read the bytes, and otherwise raises BundleError (never another exception)."""
    data = _nested_model(2, graphs_attribute=True).SerializeToString()
    rng = random.Random(0)
    variants = [data[:n] for n in range(len(data))]
    for _ in range(300):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        variants.append(bytes(b))
    path = tmp_path / "m.onnx"
    agreed = 0
    for v in variants:
        path.write_bytes(v)
        try:
            got = _reader_answer(read_graph(path))
        except BundleError:
            continue
        try:
            model = onnx.ModelProto()
            model.ParseFromString(v)
            want = _onnx_answer(model)
        except Exception:  # onnx refuses bytes the reader skips (fields it never reads): no answer to compare
            continue
        assert got == want
        agreed += 1
    assert agreed >= 50  # most prefixes cut the one graph field short; the flips leave many readable


def test_the_builtin_profiles_read_alike_through_either_yaml_parser():
    """Built-in profiles go through libyaml's parser where PyYAML has it (targets/loader.py): the same data."""
    import yaml

    from edge_runtime.targets.loader import _BUILTIN_LOADER, BUILTIN_DIR

    for path in sorted(BUILTIN_DIR.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        assert yaml.load(text, Loader=_BUILTIN_LOADER) == yaml.safe_load(text), path.name


# -- what a run imports -------------------------------------------------------------------------------------


def _python(code: str, *, timeout: float = 300) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON line last."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


_LOADED = """
import json, sys
def loaded(names):
    return sorted(m for m in sys.modules if m.split(".")[0] in names)
"""


@pytest.fixture(scope="module")
def demo_bundle(bundles):
    return bundles["edge-int8"] if "edge-int8" in bundles else bundles["int8-matmulnbits"]


def test_the_python_api_loads_and_generates_without_onnx(demo_bundle):
    out = _python(
        _LOADED
        + f"""
import edge_runtime
engine = edge_runtime.load({str(demo_bundle)!r})
tok = edge_runtime.Tokenizer.for_engine(engine)
result = edge_runtime.generate(engine, tok, "ROMEO.", edge_runtime.GenerationConfig(max_tokens=4))
engine.exact_rows  # the graph walk (kernel_ops) and the exactness probe
print(json.dumps({{"text": result.text, "loaded": loaded({RUN_FORBIDDEN!r})}}))
"""
    )
    assert out["text"] and out["loaded"] == []


def test_edge_run_and_edge_bench_run_a_bundle_without_onnx(demo_bundle, tmp_path):
    """edge-run with prompt-lookup speculation (the graph walk and the exactness probe run at start-up), and
    a short edge-bench run, each in a fresh interpreter."""
    runs = {
        "edge_runtime.cli.run": ["--bundle", str(demo_bundle), "--target", "x86", "--prompt", "ROMEO.",
                                 "--max-tokens", "3", "--speculative", "lookup", "--json"],
        "edge_runtime.cli.bench": ["run", str(demo_bundle), "--target", "x86", "--prompt-tokens", "8",
                                   "--gen-tokens", "2", "--trials", "1", "--warmup", "0",
                                   "--json-out", str(tmp_path / "report.json")],
    }  # fmt: skip
    for module, args in runs.items():
        out = _python(
            _LOADED
            + f"""
from {module} import main
try:
    main({args!r})
except SystemExit as e:
    code = e.code
print(json.dumps({{"code": code, "loaded": loaded({RUN_FORBIDDEN!r})}}))
"""
        )
        assert out == {"code": 0, "loaded": []}, module


def test_edge_serve_builds_its_server_without_onnx(demo_bundle):
    pytest.importorskip("starlette")
    out = _python(
        _LOADED
        + f"""
from pathlib import Path
from edge_runtime.serve.cli import ServeOptions, _build
opts = ServeOptions(bundle=Path({str(demo_bundle)!r}), model=None, target="x86", slots=1, queue_size=1,
                    max_tokens=8, api_key=None, model_id=None, sinks=None, window=None, threads=None, energy=False)
state, closers = _build(opts)
print(json.dumps({{"loaded": loaded({RUN_FORBIDDEN!r})}}))
sys.stdout.flush()
import os
os._exit(0)  # the scheduler's thread is not this check's to stop
"""
    )
    assert out["loaded"] == []


@pytest.mark.parametrize(
    "module",
    ["edge_runtime.cli.run", "edge_runtime.serve.cli", "edge_runtime.cli.bench", "edge_runtime.cli.cache"],
)
def test_help_loads_neither_onnxruntime_nor_numpy(module):
    out = _python(
        _LOADED
        + f"""
import io, contextlib
from {module} import main
with contextlib.redirect_stdout(io.StringIO()) as text:
    try:
        main(["--help"])
    except SystemExit as e:
        code = e.code
print(json.dumps({{"code": code, "usage": "Usage:" in text.getvalue(), "loaded": loaded({HELP_FORBIDDEN!r})}}))
"""
    )
    assert out == {"code": 0, "usage": True, "loaded": []}


def test_edge_export_help_loads_no_onnx_runtime_pieces():
    """edge-export's --quant choices come from the exporters (numpy); the runtime and onnx stay unloaded."""
    out = _python(
        _LOADED
        + """
import io, contextlib
from edge_runtime.cli.export import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(["--help"])
    except SystemExit as e:
        code = e.code
print(json.dumps({"code": code, "loaded": loaded(("onnx", "ml_dtypes", "onnxruntime", "torch"))}))
"""
    )
    assert out == {"code": 0, "loaded": []}


def test_the_startup_script_writes_its_page(demo_bundle, tmp_path):
    """scripts/startup_time.py on a bundle, one run each: the page names the CPU, the commit and the command
    that regenerates it, and replaces what was there."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "startup_time.py"
    out = tmp_path / "startup.md"
    out.write_text("stale\n", encoding="utf-8")
    r = subprocess.run(
        [sys.executable, str(script), "--bundle", str(demo_bundle), "--runs", "1", "--write", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Start-up time\n") and "stale" not in text
    assert f"--bundle {demo_bundle.name} --runs 1 --write {out}" in text
    for name in ("`edge-run --help`", "`edge-serve --help`", "`edge-run, 1-token reply`"):
        assert name in text
    assert " cores usable" in text and "| median | p90 |" in text
