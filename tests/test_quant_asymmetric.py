"""Asymmetric INT4 blocks (a zero point per block): the grid, GPTQ on it, MatMulNBits' zero_points layout
against ONNX Runtime's own reading, whole graphs against the float64 reference, and the refusals."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_runtime.errors import ExportError
from edge_runtime.exporters import ReferenceModel, load_checkpoint
from edge_runtime.exporters.calibrate import capture_linear_inputs, load_calibration
from edge_runtime.exporters.decoder import Flavor, Precision, build_decoder
from edge_runtime.exporters.quant import MatMulKernel, MixedPlan, QuantConfig, QuantMethod, gptq, quantize_rtn
from edge_runtime.exporters.quant_graph import pack_nbits, pack_zero_points
from edge_runtime.exporters.quant_model import quantize_model
from edge_runtime.exporters.quant_pipeline import check_options
from edge_runtime.exporters.validate import TOLERANCE, validation_grid

from .tiny_models import _TEXT, save_tiny_checkpoint


def test_asymmetric_grid_spans_the_block_and_keeps_zero_exact():
    rng = np.random.default_rng(0)
    w = rng.uniform(0.0, 1.0, (16, 128))  # one-sided blocks: symmetric INT4 wastes its negative levels
    w[3] -= 0.6  # and a row straddling zero
    w[:, ::32] = 0.0
    asym, sym = quantize_rtn(w, 4, 32, asymmetric=True), quantize_rtn(w, 4, 32)
    assert asym.zeros.shape == asym.scales.shape and asym.zeros.dtype == np.int8
    assert asym.codes.min() >= -8 and asym.codes.max() <= 7 and asym.zeros.min() >= -8 and asym.zeros.max() <= 7
    assert (asym.scales > 0).all() and (asym.scales.astype(np.float16).astype(np.float32) == asym.scales).all()
    deq = asym.dequantize()
    assert (deq[:, ::32] == 0.0).all()  # 0.0 is a level: its code is the block's zero
    step = np.repeat(asym.scales, 32, axis=1)
    assert (np.abs(deq - w) <= step / 2 + 1e-7).all()  # nothing clipped
    err_a, err_s = np.linalg.norm(deq - w), np.linalg.norm(sym.dequantize() - w)
    print(f"weight error: symmetric {err_s:.4f}, asymmetric {err_a:.4f}")
    assert err_a < 0.6 * err_s
    assert asym.storage_bytes() == sym.storage_bytes() + asym.zeros.size // 2


def test_asymmetric_gptq_lowers_output_error_and_static_groups_keep_rtn_grid():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((512, 128)) * np.exp(rng.standard_normal(128))
    x[:, 1:] += 0.7 * x[:, :-1]
    w = rng.standard_normal((96, 128)) + 0.3
    rtn = quantize_rtn(w, 4, 32, asymmetric=True)
    opt = gptq(w, x.T @ x, 4, 32, act_order=True, asymmetric=True)
    assert np.array_equal(opt.scales, rtn.scales) and np.array_equal(opt.zeros, rtn.zeros)
    exact = x @ w.T
    errs = [np.linalg.norm(x @ q.dequantize().T - exact) / np.linalg.norm(exact) for q in (rtn, opt)]
    print(f"output error asymmetric RTN {errs[0]:.4f}, GPTQ {errs[1]:.4f}")
    assert errs[1] < 0.8 * errs[0]
    in_order = gptq(w, x.T @ x, 4, 32, asymmetric=True)  # grids from the updated weights
    assert in_order.zeros is not None and in_order.codes.min() >= -8 and in_order.codes.max() <= 7


@pytest.mark.parametrize("k", [128, 96], ids=["even-blocks", "odd-blocks"])
def test_zero_points_are_read_by_matmulnbits_as_written(k):
    """One MatMulNBits node (fp32 compute) with our B, scales and zero_points gives x @ dequantize().T:
    the nibble order and the odd block count's padding are ONNX Runtime's."""
    rng = np.random.default_rng(4)
    n = 24
    w = rng.standard_normal((n, k)) + rng.uniform(-1, 1, (n, 1))
    qm = quantize_rtn(w, 4, 32, asymmetric=True)
    b, scales, blk = pack_nbits(qm, "w")
    zp = pack_zero_points(qm)
    assert zp.shape == (n, (k // 32 + 1) // 2)
    inits = [numpy_helper.from_array(a, nm) for a, nm in ((b, "B"), (scales, "S"), (zp, "Z"))]
    node = helper.make_node(
        "MatMulNBits", ["X", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=k, N=n, bits=4, block_size=blk
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [5, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [5, n])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((5, k)).astype(np.float32)
    got = sess.run(None, {"X": x})[0]
    want = x.astype(np.float64) @ qm.dequantize().T.astype(np.float64)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("asym")
    save_tiny_checkpoint("llama-untied", d, intermediate_size=128, attention_bias=True, mlp_bias=True)
    (d / "calibration.txt").write_text(_TEXT)
    ck = load_checkpoint(d)
    return ck, capture_linear_inputs(ck.args, ck.weights, load_calibration(ck))


@pytest.mark.parametrize(
    "method,mixed",
    [(QuantMethod.INT4, MixedPlan.NONE), (QuantMethod.INT4_GPTQ, MixedPlan.SENSITIVITY)],
    ids=["rtn", "gptq-mixed"],
)
def test_asymmetric_graph_matches_reference_with_the_same_dequantized_weights(tiny, method, mixed):
    """MatMulNBits with zero_points (fp32 compute) against the float64 reference on the same weights; with
    --mixed the INT8 groups stay symmetric per channel beside the asymmetric INT4 ones."""
    ck, acts = tiny
    config = QuantConfig(method, 32, accuracy_level=0, asymmetric=True, mixed=mixed, mixed_bits=5.0)
    qm = quantize_model(ck.args, ck.weights, ck.arch.weights, config, acts)
    int4 = [t for t in qm.tensors.values() if t.bits == 4]
    assert int4 and all(t.zeros is not None for t in int4)
    assert all(t.zeros is None for t in qm.tensors.values() if t.bits == 8)
    assert "asymmetric" in qm.record["scheme"]
    built = build_decoder(ck.args, qm.weights, Flavor.ORT, Precision.FP32, quantized=qm)
    nodes = [nd for nd in built.model.graph.node if nd.op_type == "MatMulNBits"]
    assert any(len(nd.input) == 4 for nd in nodes)  # zero_points wired where the codes are asymmetric
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(built.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    kv = [lw.num_kv_heads(ck.args.head_dim) for lw in qm.weights.layers]
    cases = validation_grid(
        sess, ReferenceModel(ck.args, qm.weights), flavor=Flavor.ORT, dtype=built.activation_dtype, kv_heads=kv
    )
    err = max(c.max_rel_err for c in cases)
    print(f"asymmetric {method.value} {mixed.value}: max rel err {err:.2e}")
    assert err <= TOLERANCE["fp32"]


def test_asymmetric_refusals_are_one_line_export_errors():
    with pytest.raises(ExportError, match="asymmetric INT4 blocks need --flavor ort"):
        check_options(QuantConfig(QuantMethod.INT4, 64, asymmetric=True), trt=True)
    with pytest.raises(ExportError, match="asymmetric INT4 needs --kernel mlas"):
        QuantConfig(QuantMethod.INT4, 32, asymmetric=True, kernel=MatMulKernel.EDGE)
    with pytest.raises(ExportError, match="asymmetric blocks apply to INT4 Linears; --quant int8 has none"):
        QuantConfig(QuantMethod.INT8, asymmetric=True)
