"""MatMulQ4/Q8's prologues and epilogue (csrc/matmul_op.c): silu_mul, gelu_mul and rms_norm form a row's activations
before it is quantized, out_norm_epsilon normalizes the product's rows; each against the nodes it replaces and
against a numpy transcription of its rounding; the refusals; and the exporter's fold_norms (exporters/graph_folds.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_runtime import kernels

from .test_kernels import _session, needs_kernels
from .test_kernels_q8 import _op_weights, _weights


@needs_kernels
@pytest.mark.parametrize("op", [kernels.MATMUL_Q4, kernels.MATMUL_Q8])
@pytest.mark.parametrize("m", [1, 3, 13])
def test_silu_mul_attribute_is_silu_mul_then_the_product(op, m):
    """silu_mul=1: A is gate | up and the product is over silu(gate) * up, bit for bit the SiluMul node
    followed by the op (the same row function, then the same quantization)."""
    rng = np.random.default_rng(m)
    k, n = 192, 70
    b, s = _op_weights(rng, op, k, n)

    def model(fused: bool) -> bytes:
        nodes = [] if fused else [helper.make_node(kernels.SILU_MUL, ["x"], ["act"], domain=kernels.DOMAIN)]
        attrs = {"K": k, "N": n, **({"silu_mul": 1} if fused else {})}
        nodes.append(helper.make_node(op, ["x" if fused else "act", "B", "S"], ["y"], domain=kernels.DOMAIN, **attrs))
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", "W"])],  # so the op checks W
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "T", n])],
            [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "S")],
        )
        opsets = [helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1)]
        return helper.make_model(graph, opset_imports=opsets).SerializeToString()

    x = rng.standard_normal((1, m, 2 * k)).astype(np.float32)
    fused = _session(model(True)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(fused, _session(model(False)).run(None, {"x": x})[0])
    with pytest.raises(Exception, match=r"last dimension is not 2K \(silu_mul or gelu_mul\)"):
        _session(model(True)).run(None, {"x": x[..., :k]})


def gelu_mul_ref(x: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up for x = gate | up, operation for operation as csrc/silu_mul_avx2.c gelu_mul_row rounds
    it (an FMA as a float64 product and sum, exact for these operands, then one rounding)."""
    f, d = np.float32, np.float64
    k = x.shape[-1] // 2
    g, up = x[..., :k], x[..., k:]

    def fma(a, b, c):
        return (np.asarray(a, d) * np.asarray(b, d) + np.asarray(c, d)).astype(f)

    arg = (g * ((f(0.035677408136300125) * g).astype(f) * g + f(0.7978845608028654)).astype(f)).astype(f)
    arg = np.minimum(f(9), np.maximum(f(-9), arg))
    sq = (arg * arg).astype(f)
    p = fma(sq, f(-2.76076847742355e-16), f(2.00018790482477e-13))
    for c in (-8.60467152213735e-11, 5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
              4.89352455891786e-03):  # fmt: skip
        p = fma(p, sq, f(c))
    p = (p * arg).astype(f)
    q = fma(sq, f(1.19825839466702e-06), f(1.18534705686654e-04))
    for c in (2.26843463243900e-03, 4.89352518554385e-03):
        q = fma(q, sq, f(c))
    t = (p / q).astype(f)
    return (((f(0.5) * g).astype(f) * (t + f(1)).astype(f)).astype(f) * up).astype(f)


@needs_kernels
@pytest.mark.parametrize("op", [kernels.MATMUL_Q4, kernels.MATMUL_Q8])
@pytest.mark.parametrize("m", [1, 3, 13])
def test_gelu_mul_attribute_is_fastgelu_times_up_then_the_product(op, m):
    """gelu_mul=1: A is gate | up and the product is over gelu_tanh(gate) * up: bit for bit the op on
    gelu_mul_ref's activations, and on this CPU bit for bit FastGelu and Mul nodes before the op wherever ONNX
    Runtime's FastGelu rounds as gelu_mul_ref does (it did on every CPU measured), else within rounding."""
    rng = np.random.default_rng(m + 40)
    k, n = 192, 70
    b, s = _op_weights(rng, op, k, n)

    def model(kind: str) -> bytes:
        x_in = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", "W"])  # so the op checks W
        if kind == "fused":
            nodes = [helper.make_node(op, ["x", "B", "S"], ["y"], domain=kernels.DOMAIN, K=k, N=n, gelu_mul=1)]
        elif kind == "nodes":
            nodes = [
                helper.make_node("Split", ["x", "halves"], ["gate", "up"], axis=-1),
                helper.make_node("FastGelu", ["gate"], ["act"], domain="com.microsoft"),
                helper.make_node("Mul", ["act", "up"], ["prod"]),
                helper.make_node(op, ["prod", "B", "S"], ["y"], domain=kernels.DOMAIN, K=k, N=n),
            ]
        else:  # the activations given: the plain op
            nodes = [helper.make_node(op, ["x", "B", "S"], ["y"], domain=kernels.DOMAIN, K=k, N=n)]
        inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "S")]
        inits.append(numpy_helper.from_array(np.array([k, k], np.int64), "halves"))
        graph = helper.make_graph(nodes, "g", [x_in], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  inits)  # fmt: skip
        opsets = [helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1),
                  helper.make_opsetid("com.microsoft", 1)]  # fmt: skip
        return helper.make_model(graph, opset_imports=opsets).SerializeToString()

    x = np.concatenate([rng.standard_normal((1, m, k)) * 3, rng.standard_normal((1, m, k))], axis=-1)
    x = x.astype(np.float32)
    x[0, 0, :4] = [0.0, -12.0, 12.0, 1e-4]  # the clamp of the tanh's argument, both ends, and a tiny gate
    fused = _session(model("fused")).run(None, {"x": x})[0]
    np.testing.assert_array_equal(fused, _session(model("plain")).run(None, {"x": gelu_mul_ref(x)})[0])
    nodes = _session(model("nodes")).run(None, {"x": x})[0]
    node = helper.make_node("FastGelu", ["g"], ["a"], domain="com.microsoft")
    fg = helper.make_graph([node], "fg", [helper.make_tensor_value_info("g", TensorProto.FLOAT, None)],
                           [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)])  # fmt: skip
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    gate = np.ascontiguousarray(x[..., :k])
    ort_gelu = _session(helper.make_model(fg, opset_imports=opsets).SerializeToString()).run(None, {"g": gate})[0]
    ones = np.concatenate([gate, np.ones_like(gate)], axis=-1)
    if np.array_equal(ort_gelu, gelu_mul_ref(ones)):
        np.testing.assert_array_equal(fused, nodes)
    else:
        np.testing.assert_allclose(fused, nodes, rtol=1e-4, atol=1e-4)
    with pytest.raises(Exception, match=r"last dimension is not 2K \(silu_mul or gelu_mul\)"):
        _session(model("fused")).run(None, {"x": x[..., :k]})


@needs_kernels
@pytest.mark.parametrize("op", [kernels.MATMUL_Q4, kernels.MATMUL_Q8])
@pytest.mark.parametrize("with_skip", [True, False])
@pytest.mark.parametrize("m", [1, 9])
def test_rms_norm_attribute_is_the_norm_then_the_product(op, with_skip, m):
    """rms_norm=1: the product is over (Skip)SimplifiedLayerNormalization of A, and output 2 is A + skip.
    Against the norm node followed by the op: the sum bit for bit; the product to float noise, except
    where the norms' different summation order moves an activation across an int8 rounding boundary."""
    rng = np.random.default_rng(m)
    k, n, eps = 256, 96, 1e-5
    b, s = _op_weights(rng, op, k, n)
    gamma = (rng.random(k) + 0.5).astype(np.float32)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "S"), numpy_helper.from_array(gamma, "G")]
    feeds = ["x", "d"] if with_skip else ["x"]
    info = [helper.make_tensor_value_info(f, TensorProto.FLOAT, [1, "T", k]) for f in feeds]

    def model(fused: bool) -> bytes:
        if fused:
            ins = ["x", "B", "S", "d" if with_skip else "", "G"]
            outs = ["y", "", "sum"] if with_skip else ["y"]
            nodes = [helper.make_node(op, ins, outs, domain=kernels.DOMAIN, K=k, N=n, rms_norm=1, epsilon=eps)]
        elif with_skip:
            nodes = [
                helper.make_node("SkipSimplifiedLayerNormalization", ["x", "d", "G"], ["h", "", "", "sum"],
                                 domain="com.microsoft", epsilon=eps),
                helper.make_node(op, ["h", "B", "S"], ["y"], domain=kernels.DOMAIN, K=k, N=n),
            ]  # fmt: skip
        else:
            nodes = [
                helper.make_node("SimplifiedLayerNormalization", ["x", "G"], ["h"], axis=-1, epsilon=eps),
                helper.make_node(op, ["h", "B", "S"], ["y"], domain=kernels.DOMAIN, K=k, N=n),
            ]
        outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "sum")[: 1 + with_skip]]
        opsets = [
            helper.make_opsetid("", 21),
            helper.make_opsetid(kernels.DOMAIN, 1),
            helper.make_opsetid("com.microsoft", 1),
        ]
        graph = helper.make_graph(nodes, "g", info, outputs, inits)
        return helper.make_model(graph, opset_imports=opsets).SerializeToString()

    x = {f: (rng.standard_normal((1, m, k)) * 3).astype(np.float32) for f in feeds}
    fused, plain = _session(model(True)).run(None, x), _session(model(False)).run(None, x)
    if with_skip:
        np.testing.assert_array_equal(fused[1], x["x"] + x["d"])
        np.testing.assert_array_equal(plain[1], fused[1])
    err = np.abs(fused[0] - plain[0]).max(axis=-1) / np.abs(plain[0]).max()
    assert err.max() < 2e-2 and np.median(err) < 1e-5


def rms_norm_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """SimplifiedLayerNormalization over the last axis as csrc/rms_norm.h rounds it: squares by FMA in 8 lanes (a
    float64 product and sum, then one rounding), the lanes added as a tree, then (x * (1 / sqrt(mean + eps))) * w."""
    f = np.float32
    acc = np.zeros((*x.shape[:-1], 8), f)
    for e in range(0, x.shape[-1], 8):
        v = x[..., e : e + 8].astype(np.float64)
        acc = (v * v + acc).astype(f)
    while acc.shape[-1] > 1:
        h = acc.shape[-1] // 2
        acc = (acc[..., :h] + acc[..., h:]).astype(f)
    inv = (f(1) / np.sqrt(((acc[..., 0] / f(x.shape[-1])).astype(f) + f(eps)).astype(f))).astype(f)
    return ((x * inv[..., None]).astype(f) * w).astype(f)


@needs_kernels
@pytest.mark.parametrize("op", [kernels.MATMUL_Q4, kernels.MATMUL_Q8])
@pytest.mark.parametrize("m", [1, 5])
def test_out_norm_attribute_is_the_product_then_the_norm(op, m):
    """out_norm_epsilon with out_gamma (input 5): Y is the product normalized row by row, bit for bit rms_norm_ref
    of the plain op's output, and bit for bit a SimplifiedLayerNormalization node after the op wherever ONNX
    Runtime's norm rounds as rms_norm_ref does (it did on every CPU measured), else within rounding."""
    rng = np.random.default_rng(m + 70)
    k, n, eps = 128, 72, 1e-6
    b, s = _op_weights(rng, op, k, n)
    w = rng.normal(1.0, 0.3, n).astype(np.float32)

    def model(kind: str, outputs: tuple[str, ...] = ("y",)) -> bytes:
        if kind == "fused":
            node = helper.make_node(op, ["x", "B", "S", "", "", "W"], list(outputs), domain=kernels.DOMAIN, K=k, N=n,
                                    out_norm_epsilon=eps)  # fmt: skip
            nodes = [node]
        else:
            nodes = [helper.make_node(op, ["x", "B", "S"], ["p" if kind == "nodes" else "y"], domain=kernels.DOMAIN,
                                      K=k, N=n)]  # fmt: skip
            if kind == "nodes":
                nodes.append(helper.make_node("SimplifiedLayerNormalization", ["p", "W"], ["y"], axis=-1, epsilon=eps))
        inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "S"), numpy_helper.from_array(w, "W")]
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT if o == "y" else TensorProto.INT64, None)
                for o in outputs]  # fmt: skip
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", k])],
                                  outs, inits)  # fmt: skip
        opsets = [helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1)]
        return helper.make_model(graph, opset_imports=opsets).SerializeToString()

    x = (rng.standard_normal((1, m, k)) * 2).astype(np.float32)
    fused = _session(model("fused")).run(None, {"x": x})[0]
    plain = _session(model("plain")).run(None, {"x": x})[0]
    np.testing.assert_array_equal(fused, rms_norm_ref(plain, w, eps))
    nodes = _session(model("nodes")).run(None, {"x": x})[0]
    if np.array_equal(nodes, rms_norm_ref(plain, w, eps)):  # ONNX Runtime's norm rounds as ours on this CPU
        np.testing.assert_array_equal(fused, nodes)
    else:
        np.testing.assert_allclose(fused, nodes, rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match=r"out_norm_epsilon needs out_gamma \[N\] \(input 5\) and no argmax"):
        _session(model("fused", ("y", "am"))).run(None, {"x": x})


@needs_kernels
def test_rms_norm_attribute_needs_gamma_and_epsilon():
    rng = np.random.default_rng(3)
    b, s = _weights(rng, 128, 8)

    def run(attrs: dict, inputs: list[str]) -> None:
        node = helper.make_node(kernels.MATMUL_Q8, inputs, ["y"], domain=kernels.DOMAIN, K=128, N=8, **attrs)
        graph = helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "S"),
             numpy_helper.from_array(np.ones(64, np.float32), "G64")],
        )  # fmt: skip
        opsets = [helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1)]
        _session(helper.make_model(graph, opset_imports=opsets).SerializeToString()).run(
            None, {"x": np.ones((1, 128), np.float32)}
        )

    with pytest.raises(Exception, match="rms_norm needs its epsilon attribute"):
        run({"rms_norm": 1}, ["x", "B", "S"])
    with pytest.raises(Exception, match=r"rms_norm needs gamma \[K\]"):
        run({"rms_norm": 1, "epsilon": 1e-5}, ["x", "B", "S"])
    with pytest.raises(Exception, match=r"rms_norm needs gamma \[K\]"):
        run({"rms_norm": 1, "epsilon": 1e-5}, ["x", "B", "S", "", "G64"])
    with pytest.raises(Exception, match="at most one is 1"):
        run({"rms_norm": 1, "epsilon": 1e-5, "silu_mul": 1}, ["x", "B", "S"])
    with pytest.raises(Exception, match="at most one is 1"):
        run({"gelu_mul": 1, "silu_mul": 1}, ["x", "B", "S"])


@needs_kernels
def test_a_sum_output_without_rms_norm_is_refused():
    rng = np.random.default_rng(4)
    b, s = _weights(rng, 128, 8)
    node = helper.make_node(kernels.MATMUL_Q8, ["x", "B", "S"], ["y", "", "sum"], domain=kernels.DOMAIN, K=128, N=8)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "sum")],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "S")],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1)]
    with pytest.raises(Exception, match=r"MatMulQ8: a third output \(the sum\) needs rms_norm=1"):
        _session(helper.make_model(graph, opset_imports=opsets).SerializeToString()).run(
            None, {"x": np.ones((1, 128), np.float32)}
        )


def test_fold_norms_leaves_norms_it_cannot_fold():
    """Only a norm whose output feeds exactly one MatMulQ4/Q8 as A, and is no graph output, is folded."""
    from types import SimpleNamespace

    from edge_runtime.exporters.graph_folds import fold_norms

    def graph(extra_reader: bool = False, axis: int = -1) -> SimpleNamespace:
        norm = helper.make_node(
            "SkipSimplifiedLayerNormalization", ["x", "d", "g"], ["h", "m", "v", "s"], domain="com.microsoft",
            epsilon=1e-5,
        )  # fmt: skip
        if axis != -1:
            norm = helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["h"], axis=axis, epsilon=1e-5)
        mm = helper.make_node(kernels.MATMUL_Q4, ["h", "B", "S"], ["y"], domain=kernels.DOMAIN, K=64, N=8)
        nodes = [norm, mm] + ([helper.make_node("Relu", ["h"], ["r"])] if extra_reader else [])
        return SimpleNamespace(nodes=nodes)

    g = graph()
    fold_norms(g, outputs={"y"})
    (mm,) = g.nodes
    assert list(mm.input) == ["x", "B", "S", "d", "g"] and list(mm.output) == ["y", "", "s"]
    assert {a.name: (a.i or a.f) for a in mm.attribute}["rms_norm"] == 1
    for g, outputs in ((graph(extra_reader=True), {"y"}), (graph(), {"y", "h"}), (graph(axis=1), {"y"})):
        fold_norms(g, outputs=outputs)
        assert len(g.nodes) >= 2 and g.nodes[1].input[0] == "h"  # left as it was
