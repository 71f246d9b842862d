"""exporters/external_data.py: one data file, large tensors at 2 MiB offsets, gaps left as holes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_runtime.bundle import stored_bytes
from edge_runtime.exporters.external_data import (
    HUGE_PAGE,
    PAGE,
    ExternalDataWriter,
    alignment,
    save_with_external_data,
)
from edge_runtime.exporters.memory_plan import return_freed_memory


def _model(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    arrays = {
        "w_big": rng.standard_normal((64, 10240)).astype(np.float32),  # 2.5 MiB: a 2 MiB offset
        "w_mid": rng.standard_normal((64, 40)).astype(np.float32),  # 10 KiB: a page
        "w_big2": rng.standard_normal((10240, 64)).astype(np.float32),
        "tiny": np.ones(40, np.float32),  # under the threshold: stays inside the graph
        "in_branch": rng.standard_normal((64, 64)).astype(np.float32),  # a subgraph's own initializer
    }
    branch = lambda name, init: helper.make_graph(  # noqa: E731
        [helper.make_node("MatMul", ["x", init] if init else ["x", "w_eye"], [name])],
        name, [], [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(arrays[init], init)] if init else [],
    )  # fmt: skip
    nodes = [
        helper.make_node("If", ["c"], ["xb"], then_branch=branch("t", "in_branch"), else_branch=branch("e", None)),
        helper.make_node("MatMul", ["xb", "w_big"], ["h"]),
        helper.make_node("MatMul", ["h", "w_big2"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w_mid"], ["h3"]),
        helper.make_node("Add", ["h3", "tiny"], ["y"]),
    ]
    inits = [numpy_helper.from_array(arrays[n], n) for n in ("w_big", "w_mid", "w_big2", "tiny")]
    inits.append(numpy_helper.from_array(np.eye(64, dtype=np.float32), "w_eye"))
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 40])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), arrays


def _then(model: onnx.ModelProto) -> onnx.GraphProto:
    return next(a.g for a in model.graph.node[0].attribute if a.name == "then_branch")


def test_large_tensors_sit_at_2mib_offsets_and_the_graph_runs_as_before(tmp_path):
    rng = np.random.default_rng(0)
    model, arrays = _model(rng)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    save_with_external_data(model, tmp_path / "m.onnx", "m.data")
    assert not any(t.HasField("raw_data") and len(t.raw_data) >= 1024 for t in model.graph.initializer)

    saved = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    inner = _then(saved).initializer
    placed = {}
    for t in [*saved.graph.initializer, *inner]:
        info = {e.key: e.value for e in t.external_data}
        if info:
            placed[t.name] = (int(info["offset"]), int(info["length"]))
    assert set(placed) == {"w_big", "w_mid", "w_big2", "in_branch", "w_eye"}  # not "tiny"
    for offset, length in placed.values():
        assert offset % alignment(length) == 0
    assert placed["w_big"][0] % HUGE_PAGE == 0 and placed["w_big2"][0] % HUGE_PAGE == 0 and placed["w_big2"][0] > 0
    assert alignment(placed["w_mid"][1]) == PAGE
    data = tmp_path / "m.data"
    assert data.stat().st_size == max(o + n for o, n in placed.values())
    assert stored_bytes(data) <= data.stat().st_size  # the gaps are holes where the file system has them

    full = onnx.load(str(tmp_path / "m.onnx"))
    tensors = [*full.graph.initializer, *_then(full).initializer]
    loaded = {t.name: numpy_helper.to_array(t) for t in tensors}
    for name, arr in arrays.items():
        np.testing.assert_array_equal(loaded[name], arr)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 64)).astype(np.float32)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        np.testing.assert_array_equal(session.run(None, feeds)[0], reference.run(None, feeds)[0])


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_placed_tensors_leave_their_bytes_behind(tmp_path):
    """Clearing a TensorProto's raw_data frees nothing (protobuf keeps the bytes in the message's
    arena), so a graph builder holding what it placed held every weight it wrote. The references `place`
    returns must hold none of them."""
    return_freed_memory()
    count, size = 8, 32 << 20
    before = _rss_bytes()
    kept = []
    with ExternalDataWriter(tmp_path / "w.data") as writer:
        for i in range(count):
            ref = writer.place(numpy_helper.from_array(np.full(size, i, np.uint8), f"w{i}"))
            assert ref.data_location == TensorProto.EXTERNAL and not ref.HasField("raw_data")
            assert next((e.key, e.value) for e in ref.external_data) == ("location", "w.data")
            kept.append(ref)
    assert _rss_bytes() - before < count * size // 4  # 256 MB written; the references hold kilobytes
    data = (tmp_path / "w.data").read_bytes()
    offsets = [int(dict((e.key, e.value) for e in r.external_data)["offset"]) for r in kept]
    assert [data[o] for o in offsets] == list(range(count)) and all(o % HUGE_PAGE == 0 for o in offsets)
