"""Exported graphs against the float64 references: every architecture, both flavors, both precisions,
under capacity (= dense attention) and past it (= StreamingLLM), positions offset to 1e7 included."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from edge_runtime.exporters import DenseKVCache, ReferenceModel, load_checkpoint
from edge_runtime.exporters.decoder import Flavor, Precision, build_decoder
from edge_runtime.exporters.reference import StreamingReference
from edge_runtime.exporters.trt_ops import TRT_10_3_OPS
from edge_runtime.exporters.validate import TOLERANCE, NumpyGraphRunner, rel_err, validation_grid
from edge_runtime.ring import RingGeometry, RingState

from .tiny_models import TINY_CONFIGS, save_tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name in TINY_CONFIGS:
        d = tmp_path_factory.mktemp(name)
        save_tiny_checkpoint(name, d)
        out[name] = load_checkpoint(d)
    return out


def session_for(ckpt, flavor, precision):
    built = build_decoder(ckpt.args, ckpt.weights, flavor, precision)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return built, ort.InferenceSession(built.model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def runner(ckpt, flavor, geometry, offset=0, precision=Precision.FP32):
    built, sess = session_for(ckpt, flavor, precision)
    kv = [lw.num_kv_heads(ckpt.args.head_dim) for lw in ckpt.weights.layers]
    ref = ReferenceModel(ckpt.args, ckpt.weights)
    return ref, NumpyGraphRunner(
        sess,
        flavor=flavor,
        dtype=built.activation_dtype,
        kv_heads=kv,
        head_dim=ckpt.args.head_dim,
        inv_freq=ref.inv_freq,
        geometry=geometry,
        position_offset=offset,
    )


@pytest.mark.parametrize("precision", list(Precision), ids=lambda p: p.value)
@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_validation_grid_within_tolerance(checkpoints, name, flavor, precision):
    ckpt = checkpoints[name]
    built, sess = session_for(ckpt, flavor, precision)
    kv = [lw.num_kv_heads(ckpt.args.head_dim) for lw in ckpt.weights.layers]
    cases = validation_grid(
        sess,
        ReferenceModel(ckpt.args, ckpt.weights),
        flavor=flavor,
        dtype=built.activation_dtype,
        kv_heads=kv,
        sliding_window=ckpt.args.sliding_window,
    )
    worst = max(c.max_rel_err for c in cases)
    print(f"{name} {flavor.value} {precision.value}: " + ", ".join(f"{c.max_rel_err:.1e}" for c in cases))
    assert worst <= TOLERANCE[precision.value]


@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
def test_under_capacity_ring_equals_dense_attention(checkpoints, flavor):
    ckpt = checkpoints["llama-untied"]
    ref, run = runner(ckpt, flavor, RingGeometry(sinks=4, window=60))
    ids = np.random.default_rng(5).integers(0, ckpt.args.vocab_size, 40)
    dense = DenseKVCache()
    expected = [ref.forward(ids[:9], dense)] + [ref.forward(ids[t : t + 1], dense) for t in range(9, 40)]
    got = [run.feed(ids[:9].tolist())] + [run.feed([int(t)]) for t in ids[9:]]
    assert rel_err(np.concatenate(got), np.concatenate(expected)) <= 1e-5


def _stream_errors(ckpt, flavor, geometry, offset, steps=90, prompt=0):
    """Per-step relative errors of the graph vs the StreamingLLM transcription."""
    ref, run = runner(ckpt, flavor, geometry, offset)
    stream = StreamingReference(ref, geometry.sinks, geometry.window)
    ids = np.random.default_rng(6).integers(0, ckpt.args.vocab_size, steps)
    errs = []
    if prompt:
        got = run.feed(ids[:prompt].tolist())
        want = np.stack([stream.step(int(t)) for t in ids[:prompt]])
        errs += [rel_err(got[i : i + 1], want[i : i + 1]) for i in range(prompt)]
    for t in ids[prompt:]:
        errs.append(rel_err(run.feed([int(t)]), stream.step(int(t))[None]))
    return np.array(errs)


@pytest.mark.parametrize("offset", [0, 10_000_000], ids=["pos0", "pos1e7"])
@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
def test_beyond_capacity_matches_streamingllm_every_step(checkpoints, flavor, offset):
    geometry = RingGeometry(sinks=4, window=16)  # capacity 20; 90 steps = 4+ wraps of the ring
    errs = _stream_errors(checkpoints["qwen2"], flavor, geometry, offset)
    assert errs.max() <= 1e-5, f"worst step {errs.argmax()}: {errs.max():.2e}"


@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
def test_prompt_of_three_capacities_chunked_prefill(checkpoints, flavor):
    geometry = RingGeometry(sinks=4, window=16, slack=7)  # chunks of <= 8 tokens once past capacity
    errs = _stream_errors(checkpoints["llama-tied"], flavor, geometry, 10_000_000, steps=3 * 27 + 10, prompt=3 * 27)
    assert errs.max() <= 1e-5


def test_float32_angles_would_fail_the_position_test(checkpoints, monkeypatch):
    """The 1e7 test must catch an implementation that computes RoPE angles in float32."""

    def angles_fp32(self, positions, dtype):
        a = positions.astype(np.float32)[:, None] * self.inv_freq.astype(np.float32)[None, :]
        return np.cos(a).astype(dtype), np.sin(a).astype(dtype)

    monkeypatch.setattr(RingState, "_angles", angles_fp32)
    errs = _stream_errors(checkpoints["qwen2"], Flavor.ORT, RingGeometry(4, 16), 10_000_000, steps=30)
    assert errs.max() > 1e-3


@pytest.mark.parametrize("precision", list(Precision), ids=lambda p: p.value)
def test_trt_flavor_uses_only_tensorrt_10_3_ops(checkpoints, precision):
    for name in ("llama-linear-rope-bias", "qwen2", "qwen3-bias", "gemma3"):
        model = build_decoder(checkpoints[name].args, checkpoints[name].weights, Flavor.TRT, precision).model
        ops = {n.op_type for n in model.graph.node}
        assert {n.domain for n in model.graph.node} <= {""}
        assert ops <= TRT_10_3_OPS, f"not parsed by TensorRT 10.3: {sorted(ops - TRT_10_3_OPS)}"
        assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [21]


def test_ort_flavor_attends_with_gqa_until_the_ring_is_full_then_scatters_in_place(checkpoints):
    """Each layer's If writes its graph outputs present_* (bound to the past_* buffers): else-branch one
    GroupQueryAttention on the packed qkv, then-branch TensorScatter into the heads-first buffer."""
    ckpt = checkpoints["llama-tied"]
    assert ckpt.args.head_dim % 16 == 0
    model = build_decoder(ckpt.args, ckpt.weights, Flavor.ORT, Precision.FP32).model
    assert {"ring_full", "seqlens_k", "total_sequence_length", "cos_cache"} <= {i.name for i in model.graph.input}
    ifs = [n for n in model.graph.node if n.op_type == "If"]
    assert len(ifs) == ckpt.args.num_layers and all(n.input[0] == "ring_full" for n in ifs)
    outputs = {o.name for o in model.graph.output}
    for i, node in enumerate(ifs):
        assert node.name == f"/model/layers.{i}/attn/ring_full/If"
        assert list(node.output[1:]) == [f"present_key.{i}", f"present_value.{i}"] and set(node.output[1:]) <= outputs
        branches = {a.name: a.g for a in node.attribute}
        (gqa,) = [n for n in branches["else_branch"].node if n.op_type == "GroupQueryAttention"]
        assert list(gqa.input[3:5]) == [f"past_key.{i}", f"past_value.{i}"]
        scatters = [n for n in branches["then_branch"].node if n.op_type == "TensorScatter"]
        assert [n.input[0] for n in scatters] == [f"past_key.{i}", f"past_value.{i}"]
        assert all(a.i == 2 for n in scatters for a in n.attribute if a.name == "axis")


def test_ort_models_gqa_refuses_take_the_general_path_scattering_into_the_outputs(checkpoints):
    """GroupQueryAttention refuses head sizes that are not multiples of 16: such models get the general
    path at every fill, with each TensorScatter writing its graph output directly (in place)."""
    from edge_runtime.exporters.blocks_ort import gqa_can_run

    ckpt = next(c for c in checkpoints.values() if not gqa_can_run(c.args.head_dim, c.args.rotary_dim))
    model = build_decoder(ckpt.args, ckpt.weights, Flavor.ORT, Precision.FP32).model
    assert not [n for n in model.graph.node if n.op_type in ("If", "GroupQueryAttention")]
    gqa_inputs = {"ring_full", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"}
    assert not gqa_inputs & {i.name for i in model.graph.input}  # no input that no node reads
    scatters = [n for n in model.graph.node if n.op_type == "TensorScatter"]
    assert len(scatters) == 2 * ckpt.args.num_layers
    outputs = {o.name for o in model.graph.output}
    for n in scatters:
        assert n.output[0] in outputs and n.input[0].replace("past_", "present_") == n.output[0]


@pytest.mark.parametrize(
    "heads,uses_gqa",
    [(None, False), ((2, 1, 32), True)],
    ids=["head16-rotary8-general", "head32-rotary16-gqa"],
)
def test_partial_rotary_exports_exactly_on_either_path(tmp_path, heads, uses_gqa):
    """partial_rotary_factor 0.5: GroupQueryAttention takes rotary halves that are multiples of 8 (head
    32 -> 8), else (head 16 -> 4) the general path runs at every fill; export validates both, the ring
    past several wraps included."""
    import json

    import onnx

    from edge_runtime.exporters.export import ExportOptions, export

    ckpt = tmp_path / "ckpt"
    save_tiny_checkpoint("llama-tied", ckpt)
    cfg = json.loads((ckpt / "config.json").read_text()) | {"partial_rotary_factor": 0.5}
    if heads:  # same weight shapes, larger heads: 2 x 32 query rows, 1 x 32 KV rows
        cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"] = heads
    (ckpt / "config.json").write_text(json.dumps(cfg))
    manifest = export(ExportOptions(checkpoint=ckpt, out=tmp_path / "b", window=100))
    assert manifest.validation.max_rel_err <= 1e-4
    ops = {n.op_type for n in onnx.load(str(tmp_path / "b" / "model.onnx"), load_external_data=False).graph.node}
    assert ("If" in ops) == uses_gqa  # GroupQueryAttention lives inside the per-layer If
    assert ("TensorScatter" in ops) == (not uses_gqa)  # top level only without it
