"""LoadOptions.profile: ONNX Runtime's per-node profile, as scripts/profile_ops.py reads it."""

from __future__ import annotations

import json

from edge_runtime.engine import LoadOptions, load


def test_ort_profile_option_writes_per_node_timings(tied_bundle, tmp_path):
    """LoadOptions.profile turns on ONNX Runtime's profiler (scripts/profile_ops.py reads its events)."""
    engine = load(tied_bundle, LoadOptions(threads=1, profile=tmp_path / "p"))
    engine.decode(int(engine.prefill([1, 2, 3]).argmax()))
    path = engine.backend.end_profiling()
    assert path is not None and path.parent == tmp_path and path.name.startswith("p")
    events = json.loads(path.read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    assert len(runs) == 2  # the prompt chunk and one decode step
    ops = {e["args"]["op_name"] for e in events if e.get("cat") == "Node" and "op_name" in e.get("args", {})}
    assert {"If", "GroupQueryAttention", "MatMul"} <= ops  # subgraph nodes are profiled too
    assert load(tied_bundle).backend.end_profiling() is None  # off by default
