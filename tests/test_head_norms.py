"""Per-head RMS norms folded into the edge attention ops (their q_norm and k_norm inputs, Qwen3's and Gemma 3's
norms before RoPE): bit for bit what the six nodes exporters/blocks_ort.py `head_norms` emits before the op
compute (ONNX Runtime's SimplifiedLayerNormalization on each query and key head), for LinearAttention, for
RingAttention on a full ring and for RingAttention computing by fill; and refused in one line when half given."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from edge_runtime import kernels
from edge_runtime.ring import MASKED

from .test_kernels import _attention_graph, _session, needs_kernels
from .test_ring_attention import CASES, _feeds, _ring_graph

pytestmark = needs_kernels

RING_NORM_INPUT = 15  # RingAttention's q_norm (csrc/ring_attention_op.c); k_norm follows


def _with_norms(model: bytes, hq: int, hkv: int, d: int, eps: float, *, fused: bool, rng) -> bytes:
    """The one-node attention graph `model` with per-head norms on its qkv: as the op's own inputs (`fused`) or
    as head_norms' nodes before it. The same random weights either way (same `rng` state)."""
    m = onnx.load_from_string(model)
    g = m.graph
    node = g.node[0]
    wq, wk = (rng.normal(1.0, 0.3, d).astype(np.float32) for _ in range(2))
    g.initializer.extend([numpy_helper.from_array(wq, "q_norm_w"), numpy_helper.from_array(wk, "k_norm_w")])
    if fused:
        if node.op_type == kernels.RING_ATTENTION:
            node.input.extend([""] * (RING_NORM_INPUT - len(node.input)))
        node.input.extend(["q_norm_w", "k_norm_w"])
        node.attribute.append(helper.make_attribute("qk_norm_epsilon", eps))
        return m.SerializeToString()
    consts = {"heads": [0, 0, hq + 2 * hkv, d], "split": [hq, hkv, hkv], "flat": [0, 0, (hq + 2 * hkv) * d]}
    g.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items())
    sln = {"axis": -1, "epsilon": eps}
    nodes = [
        helper.make_node("Reshape", ["qkv", "heads"], ["x4"]),
        helper.make_node("Split", ["x4", "split"], ["hq", "hk", "hv"], axis=2),
        helper.make_node("SimplifiedLayerNormalization", ["hq", "q_norm_w"], ["qn"], **sln),
        helper.make_node("SimplifiedLayerNormalization", ["hk", "k_norm_w"], ["kn"], **sln),
        helper.make_node("Concat", ["qn", "kn", "hv"], ["x4n"], axis=2),
        helper.make_node("Reshape", ["x4n", "flat"], ["qkv_normed"]),
    ]
    node.input[0] = "qkv_normed"
    g.node.insert(0, nodes[-1])
    for n in reversed(nodes[:-1]):
        g.node.insert(0, n)
    return m.SerializeToString()


def rms_heads(qkv: np.ndarray, wq: np.ndarray, wk: np.ndarray, hq: int, hkv: int, eps: float) -> np.ndarray:
    """The ops' norm of each query and key head in numpy, operation for operation (csrc/ort_ops.c
    attn_head_norms): squares accumulated by FMA in 8 lanes (a float64 product is exact, then one rounding), the
    lanes summed as a tree (4 + 4, 2 + 2, 1 + 1), inv = 1 / sqrt(sum / D + eps), (x * inv) * w."""
    f = np.float32
    d = wq.shape[0]
    x = qkv.reshape(*qkv.shape[:-1], hq + 2 * hkv, d).copy()
    heads = x[..., : hq + hkv, :]
    acc = np.zeros((*heads.shape[:-1], 8), f)
    for e in range(0, d, 8):
        v = heads[..., e : e + 8].astype(np.float64)
        acc = (v * v + acc).astype(f)
    while acc.shape[-1] > 1:
        h = acc.shape[-1] // 2
        acc = (acc[..., :h] + acc[..., h:]).astype(f)
    mean = (acc[..., 0] / f(d)).astype(f)
    inv = (f(1) / np.sqrt((mean + f(eps)).astype(f))).astype(f)
    w = np.concatenate([np.broadcast_to(wq, (hq, d)), np.broadcast_to(wk, (hkv, d))])
    x[..., : hq + hkv, :] = ((heads * inv[..., None]).astype(f) * w).astype(f)
    return x.reshape(qkv.shape)


def _both(model: bytes, hq: int, hkv: int, d: int, feeds: dict[str, np.ndarray], eps: float = 1e-6) -> None:
    """The fused op is the plain op on rms_heads' qkv, bit for bit, and the norms changed the result (they ran);
    against head_norms' nodes (ONNX Runtime's SimplifiedLayerNormalization) it is bit for bit too wherever ONNX
    Runtime's norm on this CPU is rms_heads' arithmetic (it was on every CPU measured), else within float
    rounding."""
    seed = hq * 1000 + d
    nodes_model = _with_norms(model, hq, hkv, d, eps, fused=False, rng=np.random.default_rng(seed))
    fused = _session(_with_norms(model, hq, hkv, d, eps, fused=True, rng=np.random.default_rng(seed)))
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load_from_string(nodes_model).graph.initializer}
    wq, wk = weights["q_norm_w"], weights["k_norm_w"]
    got = fused.run(None, {k: v.copy() for k, v in feeds.items()})
    plain = _session(model)
    normed = {**{k: v.copy() for k, v in feeds.items()}, "qkv": rms_heads(feeds["qkv"], wq, wk, hq, hkv, eps)}
    for a, b in zip(got, plain.run(None, normed), strict=True):
        assert np.array_equal(a, b)
    assert not np.array_equal(plain.run(None, {k: v.copy() for k, v in feeds.items()})[0], got[0])
    nodes = _session(nodes_model)
    want = nodes.run(None, {k: v.copy() for k, v in feeds.items()})
    exact = _onnxruntime_norm_is_ours(feeds["qkv"], wq, wk, hq, hkv, eps)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b) if exact else np.allclose(a, b, rtol=1e-5, atol=1e-6)


def _onnxruntime_norm_is_ours(qkv, wq, wk, hq, hkv, eps) -> bool:
    """ONNX Runtime's SimplifiedLayerNormalization on these heads gives rms_heads' bits."""
    d = wq.shape[0]
    heads = qkv.reshape(-1, hq + 2 * hkv, d)
    out = []
    for w, x in ((wq, heads[:, :hq]), (wk, heads[:, hq : hq + hkv])):
        node = helper.make_node("SimplifiedLayerNormalization", ["x", "w"], ["y"], axis=-1, epsilon=eps)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])  # fmt: skip
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
        out.append(_session(m.SerializeToString()).run(None, {"x": np.ascontiguousarray(x)})[0])
    ours = rms_heads(qkv, wq, wk, hq, hkv, eps).reshape(-1, hq + 2 * hkv, d)
    return np.array_equal(out[0], ours[:, :hq]) and np.array_equal(out[1], ours[:, hq : hq + hkv])


def test_rms_heads_is_onnxruntimes_norm_on_this_cpu_or_within_rounding():
    """What the bit-for-bit claim rests on, on whatever CPU runs the suite: recorded, and close everywhere."""
    rng = np.random.default_rng(4)
    hq, hkv, d = 4, 1, 256
    qkv = (rng.standard_normal((1, 500, (hq + 2 * hkv) * d)) * rng.uniform(0.1, 10, (1, 500, 1))).astype(np.float32)
    wq, wk = (rng.normal(1.0, 0.3, d).astype(np.float32) for _ in range(2))
    if not _onnxruntime_norm_is_ours(qkv, wq, wk, hq, hkv, 1e-6):
        heads = qkv.reshape(500, hq + 2 * hkv, d)[:, : hq + hkv].astype(np.float64)
        w = np.concatenate([np.broadcast_to(wq, (hq, d)), np.broadcast_to(wk, (hkv, d))])
        exact = heads / np.sqrt((heads**2).mean(-1, keepdims=True) + 1e-6) * w
        ours = rms_heads(qkv, wq, wk, hq, hkv, 1e-6).reshape(500, hq + 2 * hkv, d)[:, : hq + hkv]
        assert np.abs(ours - exact).max() / np.abs(exact).max() < 1e-6


def _linear_feeds(rng, hq, hkv, d, cap, past, t, half) -> dict[str, np.ndarray]:
    # Query and key heads of scale 3: a norm that did not run, or ran on the wrong heads, shows.
    qkv = (3 * rng.standard_normal((1, t, (hq + 2 * hkv) * d))).astype(np.float32)
    pk, pv = (rng.standard_normal((1, hkv, cap, d)).astype(np.float32) for _ in range(2))
    angles = np.arange(cap)[:, None] * (10000.0 ** (-np.arange(half) / half))[None]
    return {"qkv": qkv, "pk": pk, "pv": pv, "seq": np.array([past + t - 1], np.int32),
            "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}  # fmt: skip


# (hq, hkv, d, capacity, past, T, rot_half): Gemma 3's decode shape, a GQA chunk, a chunk from an empty cache.
LINEAR = [(4, 1, 256, 300, 200, 1, 128), (9, 3, 64, 90, 30, 7, 32), (4, 2, 32, 64, 0, 9, 8)]


@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "past", "t", "half"), LINEAR)
def test_linear_attention_with_its_norms_is_the_nodes_bit_for_bit(hq, hkv, d, cap, past, t, half):
    feeds = _linear_feeds(np.random.default_rng(past + t), hq, hkv, d, cap, past, t, half)
    _both(_attention_graph(kernels.LINEAR_ATTENTION, hq, hkv, d), hq, hkv, d, feeds)


@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "sinks", "t", "half", "write"), CASES)
def test_ring_attention_with_its_norms_is_the_nodes_bit_for_bit(hq, hkv, d, cap, sinks, t, half, write):
    feeds = _feeds(np.random.default_rng(cap + t + 5), hq, hkv, d, cap, sinks, t, half, write)
    _both(_ring_graph(hq, hkv, d), hq, hkv, d, feeds)


@pytest.mark.parametrize("ring_full", [False, True])
def test_ring_attention_by_fill_with_its_norms_is_the_nodes_bit_for_bit(ring_full):
    """While ring_full is false the node hands its norms to LinearAttention's computation."""
    hq, hkv, d, cap, past, t, half = 4, 1, 32, 200, 140, 3, 8
    rng = np.random.default_rng(11)
    lin = _linear_feeds(rng, hq, hkv, d, cap, past, t, half)
    rows = slice(past, past + t)
    causal = np.arange(cap)[None, :] <= np.arange(past, past + t)[:, None]
    feeds = {"qkv": lin["qkv"], "pk": lin["pk"], "pv": lin["pv"], "write_index": np.array([past], np.int64)}
    feeds |= {n: lin["cos"][rows] for n in ("cos", "cos_sink")} | {n: lin["sin"][rows] for n in ("sin", "sin_sink")}
    feeds |= {"sink_rows": np.array([4], np.int64), "mask": np.where(causal, 0.0, MASKED).astype(np.float32)}
    feeds |= {"seq": lin["seq"], "cos_cache": lin["cos"], "sin_cache": lin["sin"], "ring_full": np.array(ring_full)}
    _both(_ring_graph(hq, hkv, d, by_fill=True), hq, hkv, d, feeds)


@pytest.mark.parametrize("op", [kernels.LINEAR_ATTENTION, kernels.RING_ATTENTION])
def test_half_the_norms_or_a_wrong_size_is_refused_in_one_line(op):
    hq, hkv, d = 4, 2, 16
    model = _attention_graph(op, hq, hkv, d) if op == kernels.LINEAR_ATTENTION else _ring_graph(hq, hkv, d)
    rng = np.random.default_rng(2)
    if op == kernels.LINEAR_ATTENTION:
        feeds = _linear_feeds(rng, hq, hkv, d, 40, 10, 1, 8)
    else:
        feeds = _feeds(rng, hq, hkv, d, 40, 4, 1, 8, 20)
    m = onnx.load_from_string(_with_norms(model, hq, hkv, d, 1e-6, fused=True, rng=rng))
    for inputs, init in ((lambda n: n[:-1], None), (lambda n: n, np.ones(d + 1, np.float32))):
        bad = onnx.ModelProto()
        bad.CopyFrom(m)
        node = bad.graph.node[0]
        kept = list(inputs(list(node.input)))
        del node.input[:]
        node.input.extend(kept)
        if init is not None:
            bad.graph.initializer[-1].CopyFrom(numpy_helper.from_array(init, "k_norm_w"))
        with pytest.raises(Exception, match="q_norm and k_norm come together, each float \\[D\\]") as err:
            _session(bad.SerializeToString()).run(None, feeds)
        assert len(str(err.value).strip().splitlines()) == 1  # ONNX Runtime's one line, ending in ours


def test_an_edge_export_folds_gemmas_norms_and_geglu_into_the_edge_ops(tmp_path):
    """Tiny Gemma 3 (global and local layers, q_norm and k_norm, GeGLU) exported for the edge kernels: no head-norm
    node left and every attention node takes the layer's two norms and the epsilon; no Split, FastGelu or Mul
    left in the MLPs, each down projection reading gate | up itself (gelu_mul); the norms after the output
    projections inside them (out_norm); and the export's own validation against the float64 reference passed
    (export raises otherwise)."""
    pytest.importorskip("torch")
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod

    from .tiny_models import save_tiny_checkpoint

    save_tiny_checkpoint("gemma3", tmp_path / "ckpt", intermediate_size=128)  # MatMulQ4 takes K = 128, not 96
    quant = QuantConfig(QuantMethod.INT4, kernel=MatMulKernel.EDGE)
    export(ExportOptions(checkpoint=tmp_path / "ckpt", out=tmp_path / "b", sinks=4, window=16, quant=quant))
    graph = onnx.load(tmp_path / "b" / "model.onnx", load_external_data=False).graph
    assert not [n.name for n in graph.node if "head_norm" in n.name or "q_norm" in n.name]
    attention = [n for n in graph.node if n.op_type == kernels.RING_ATTENTION]
    assert attention
    for n in attention:
        layer = n.name.split("/")[2]
        assert list(n.input[RING_NORM_INPUT:]) == [f"/model/{layer}/attn/{w}/weight" for w in ("q_norm", "k_norm")]
        assert [a.name for a in n.attribute if a.name == "qk_norm_epsilon"] == ["qk_norm_epsilon"]
    assert not [n.name for n in graph.node if "/mlp/" in n.name and n.op_type in ("Split", "FastGelu", "Mul")]
    downs = [n for n in graph.node if n.name.endswith("/down_proj/MatMulQ4")]
    assert len(downs) == len(attention)
    for n in downs:
        assert [a.i for a in n.attribute if a.name == "gelu_mul"] == [1]
        assert n.input[0].endswith("/mlp/gate_up_proj/MatMulQ4/output_0")
    # Gemma 3's norms after the attention's and the MLP's output projections: inside those products (out_norm)
    assert not [n.name for n in graph.node if "post_attention_norm" in n.name or "post_feedforward_norm" in n.name]
    outs = [n for n in graph.node if n.name.endswith(("/o_proj/MatMulQ4", "/down_proj/MatMulQ4"))]
    assert len(outs) == 2 * len(attention)
    for n in outs:
        assert [a.name for a in n.attribute if a.name == "out_norm_epsilon"] == ["out_norm_epsilon"]
        which = "post_attention_norm" if "o_proj" in n.name else "post_feedforward_norm"
        assert n.input[5] == f"/model/{n.name.split('/')[2]}/{which}/weight"
