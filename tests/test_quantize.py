"""Quantized exports: each format's graph against the float64 reference run with the same dequantized
weights, `trt` against `ort` on the same integer weights, the quantizers themselves, bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import numpy_helper
from onnxruntime.capi._pybind_state import quantize_matmul_4bits

from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import ExportError
from edge_runtime.exporters import ReferenceModel, input_stats, load_checkpoint, quant
from edge_runtime.exporters.calibrate import InputStats, capture_linear_inputs, load_calibration
from edge_runtime.exporters.decoder import Flavor, Precision, build_decoder
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.quant import QuantConfig, QuantMethod, gptq, gptq_rows, quantize_rtn
from edge_runtime.exporters.quant_awq import awq_layer, search_scales
from edge_runtime.exporters.quant_graph import pack_nbits
from edge_runtime.exporters.quant_model import quantize_model
from edge_runtime.exporters.quant_pipeline import check_options
from edge_runtime.exporters.trt_ops import TRT_10_3_OPS
from edge_runtime.exporters.validate import (
    INT8_ACTIVATION_TOLERANCE,
    TOLERANCE,
    NumpyGraphRunner,
    rel_err,
    validation_grid,
)
from edge_runtime.ring import RingGeometry

from .tiny_models import _TEXT, save_tiny_checkpoint

CALIB_TEXT = _TEXT  # ~340 tokens: enough for the tiny models, fast in float64


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Tiny checkpoints with widths blocks 32 and 64 divide (H 64, I 128): untied with every Linear
    biased (q/k/v/o and MLP: the bias paths of every format and of AWQ's folding), and tied."""
    out = {}
    for name, extra in (("llama-untied", {"attention_bias": True, "mlp_bias": True}), ("llama-tied", {})):
        d = tmp_path_factory.mktemp(name)
        save_tiny_checkpoint(name, d, intermediate_size=128, **extra)
        (d / "calibration.txt").write_text(CALIB_TEXT)
        out[name] = load_checkpoint(d)
    return out


@pytest.fixture(scope="module")
def acts(ckpts):
    ck = ckpts["llama-untied"]
    return capture_linear_inputs(ck.args, ck.weights, load_calibration(ck))


def _session(model: onnx.ModelProto, flavor: Flavor) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if flavor is Flavor.TRT:  # no int8-activation fusion of DequantizeLinear -> MatMul: compute as TensorRT does
        so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _grid(ck, qm, flavor, precision=Precision.FP32):
    built = build_decoder(ck.args, qm.weights, flavor, precision, quantized=qm)
    kv = [lw.num_kv_heads(ck.args.head_dim) for lw in qm.weights.layers]
    cases = validation_grid(
        _session(built.model, flavor),
        ReferenceModel(ck.args, qm.weights),
        flavor=flavor,
        dtype=built.activation_dtype,
        kv_heads=kv,
        sliding_window=ck.args.sliding_window,
    )
    return built, max(c.max_rel_err for c in cases)


# -- the quantizers ----------------------------------------------------------------------------


@pytest.mark.parametrize("bits,block", [(4, 32), (4, 128), (8, None)])
def test_rtn_grid_positive_fp16_scales_and_half_step_error(bits, block):
    w = np.random.default_rng(0).standard_normal((48, 256)).astype(np.float32)
    w[3, 5] = 40.0  # an outlier makes its block's scale large; other blocks are unaffected
    qm = quantize_rtn(w, bits, block)
    qmax = 2 ** (bits - 1) - 1
    assert qm.codes.min() >= -qmax - 1 and qm.codes.max() <= qmax
    assert (qm.scales > 0).all() and (qm.scales.astype(np.float16).astype(np.float32) == qm.scales).all()
    blk = qm.block
    step = np.repeat(qm.scales, blk, axis=1)
    assert (np.abs(qm.dequantize() - w) <= step / 2 + 1e-7).all()  # nothing clipped: the grid covers each block
    assert qm.scales.shape == (48, 256 // blk)


def test_rtn_equals_onnxruntime_mlas_where_the_negative_side_dominates():
    """Where a block's most negative value has the largest magnitude, MLAS's symmetric rule
    (scale = value / -8) and ours coincide: same scales, same codes."""
    rng = np.random.default_rng(1)
    n, k, blk = 16, 64, 32
    w = rng.uniform(-0.9, 0.85, (n, k)).astype(np.float32)
    w[:, ::blk] = -1.0  # most negative value first in every block: scale 1/8 exactly (fp16-representable)
    ours = quantize_rtn(w, 4, blk)
    packed = np.zeros((n, k // blk, blk // 2), np.uint8)
    scales = np.zeros(n * k // blk, np.float32)
    zp = np.zeros(n * k // blk, np.uint8)
    quantize_matmul_4bits(packed, np.ascontiguousarray(w.T), scales, zp, blk, n, k, True)
    theirs = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(n, k).astype(np.int16) - 8
    assert np.array_equal(scales.reshape(n, -1), ours.scales)
    assert np.array_equal(theirs, ours.codes)
    b, s, _ = pack_nbits(ours, "w")
    assert np.array_equal(b, packed) and np.array_equal(s, scales.reshape(n, -1))


@pytest.mark.parametrize("act_order", [False, True], ids=["input-order", "act-order"])
def test_gptq_lowers_output_error_against_rtn(act_order):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((512, 128)) * np.exp(rng.standard_normal(128))  # uneven channel magnitudes
    x[:, 1:] += 0.7 * x[:, :-1]  # correlated channels: what GPTQ's error feedback exploits
    w = rng.standard_normal((96, 128))
    exact = x @ w.T
    rtn = quantize_rtn(w, 4, 32).dequantize()
    opt = gptq(w, x.T @ x, 4, 32, act_order=act_order)
    if act_order:  # static groups: every scale is the RTN scale of the original block
        assert np.array_equal(opt.scales, quantize_rtn(w, 4, 32).scales)
    out_err = [np.linalg.norm(x @ q.T - exact) / np.linalg.norm(exact) for q in (rtn, opt.dequantize())]
    print(f"output error RTN {out_err[0]:.4f}, GPTQ {out_err[1]:.4f}")
    assert out_err[1] < 0.8 * out_err[0]
    assert opt.codes.min() >= -8 and opt.codes.max() <= 7 and (opt.scales > 0).all()


@pytest.mark.parametrize("act_order", [False, True], ids=["input-order", "act-order"])
@pytest.mark.parametrize("asymmetric", [False, True], ids=["symmetric", "asymmetric"])
def test_gptq_of_stacked_weights_is_each_weights_own(act_order, asymmetric, monkeypatch):
    """q, k and v (gate and up) read the same inputs, so the exporter quantizes them as one stack: each
    part must be exactly what GPTQ gives that weight alone (rows are independent given H), a dead input
    channel included, and so must the stack walked a slice of rows at a time (quant.GPTQ_ROWS)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((400, 96)) * np.exp(rng.standard_normal(96))
    x[:, 5] = 0.0  # never active: zeroed in every part
    ws = [rng.standard_normal((n, 96)) * 0.1 for n in (48, 16, 16)]
    together = gptq_rows(ws, x.T @ x, 4, 32, 0.01, act_order=act_order, asymmetric=asymmetric)
    monkeypatch.setattr(quant, "GPTQ_ROWS", 20)  # slices that cut across the parts
    sliced = gptq_rows(ws, x.T @ x, 4, 32, 0.01, act_order=act_order, asymmetric=asymmetric)
    for a, b in zip(together, sliced, strict=True):
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
        assert (a.zeros is None and b.zeros is None) or np.array_equal(a.zeros, b.zeros)
    monkeypatch.undo()
    for w, got in zip(ws, together, strict=True):
        alone = gptq(w, x.T @ x, 4, 32, 0.01, act_order=act_order, asymmetric=asymmetric)
        assert got.shape == w.shape and np.array_equal(got.codes, alone.codes)
        assert np.array_equal(got.scales, alone.scales)
        assert (got.zeros is None) == (not asymmetric) and np.array_equal(got.dequantize(), alone.dequantize())
        assert np.array_equal(got.dequantize()[:, 5], np.zeros(len(w)))


def test_the_gram_matrix_is_exact_across_its_row_buffer(monkeypatch):
    """X^T X is taken a buffer of rows at a time: sequences that straddle the buffer's end, and a read in
    the middle, give the Gram matrix of all rows added."""
    monkeypatch.setattr(input_stats, "GRAM_ROWS", 64)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 24)).astype(np.float32)
    stats = InputStats.empty(24)
    stats.add(x[:50])
    stats.add(x[50:180])  # fills the buffer twice, leaves 52 rows waiting
    x64 = x.astype(np.float64)
    assert _close(stats.gram, x64[:180].T @ x64[:180])
    stats.add(x[180:])
    stats.release()
    assert stats.rows == 300 and _close(stats.gram, x64.T @ x64) and stats._pending is None


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return float(np.abs(a - b).max()) <= 1e-5 * float(np.abs(b).max())  # float32 products, float64 sums


def test_input_statistics_are_what_the_rows_give():
    """Calibration keeps X^T X and sum |X| per Linear group, added a sequence at a time: the same
    Gram matrix, output error and scaled statistics as the rows themselves."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((300, 64)) * np.exp(rng.standard_normal(64))
    stats = InputStats.empty(64)
    for part in np.array_split(x, 3):
        stats.add(part)
    x32 = x.astype(np.float32).astype(np.float64)  # the statistics are of float32 rows
    assert stats.rows == 300 and _close(stats.gram, x32.T @ x32)
    assert _close(stats.mean_abs, np.abs(x32).mean(axis=0)) and _close(stats.column_norms, np.linalg.norm(x32, axis=0))
    w = rng.standard_normal((32, 64))
    q = quantize_rtn(w, 4, 32).dequantize()
    direct = np.linalg.norm(x32 @ (q - w).T) / np.linalg.norm(x32 @ w.T)
    assert stats.output_error(q, w) == pytest.approx(direct, rel=1e-4)
    s = np.exp(rng.standard_normal(64))
    scaled = stats.divided(s)
    assert _close(scaled.gram, (x32 / s).T @ (x32 / s)) and _close(scaled.mean_abs, np.abs(x32 / s).mean(axis=0))


def test_sink_rows_count_once_per_later_token_and_steer_gptq():
    """Each sequence's first row (the attention sink, read by every later query) enters sink_gram
    T - 1 times. GPTQ fed X^T X alone fits the bulk of the rows and leaves a sink lying off their
    directions with a larger error than RTN's; the sink-weighted Hessian keeps it below RTN's."""
    rng = np.random.default_rng(5)
    k, seqs, t = 64, 8, 100
    basis = np.linalg.qr(rng.standard_normal((k, k)))[0]
    bulk = rng.standard_normal((seqs, t, k)) * np.r_[np.ones(48), np.full(16, 0.05)]  # 48 busy directions
    bulk[:, 0] = rng.standard_normal((seqs, k)) * np.r_[np.full(48, 0.05), np.ones(16)]  # sinks: the other 16
    x = bulk @ basis.T
    stats = InputStats.empty(k)
    for seq in x:
        stats.add(seq)
    first = x[:, 0].astype(np.float32).astype(np.float64)
    assert np.allclose(stats.sink_gram, (t - 1) * first.T @ first) and stats.sink_weighted(0) is stats.gram
    w = rng.standard_normal((32, k))

    def sink_err(q: np.ndarray) -> float:
        return float(np.linalg.norm(first @ (q - w).T) / np.linalg.norm(first @ w.T))

    rtn = sink_err(quantize_rtn(w, 4, 32).dequantize())
    plain = sink_err(gptq(w, stats.gram, 4, 32).dequantize())
    weighted = sink_err(gptq(w, stats.sink_weighted(1.0), 4, 32).dequantize())
    print(f"sink rows' output error: RTN {rtn:.4f}, GPTQ on X^T X {plain:.4f}, sink-weighted {weighted:.4f}")
    assert weighted < rtn < plain


def test_awq_sink_weight_enters_the_scale_search_loss():
    """The sink-weighted search minimises the loss on X^T X + w * sink_gram: its choice is no worse there
    than the plain search's, and weight 0 is the plain search (the same alpha and scales)."""
    rng = np.random.default_rng(7)
    k, seqs, t = 64, 6, 80
    stats = InputStats.empty(k)
    for _ in range(seqs):
        seq = rng.standard_normal((t, k)) * np.exp(rng.standard_normal(k))  # uneven channels: alpha matters
        seq[0] = 20 * rng.standard_normal(k) * np.r_[np.zeros(48), np.ones(16)]  # sinks on 16 channels
        stats.add(seq)
    ws = [rng.standard_normal((32, k))]
    plain, zero = search_scales(stats, ws, 32), search_scales(stats, ws, 32, sink_weight=0.0)
    weighted = search_scales(stats, ws, 32, sink_weight=1.0)
    assert plain.alpha == zero.alpha and np.array_equal(plain.scales, zero.scales)
    g = stats.sink_weighted(1.0)

    def loss(s):
        d = ws[0] - quantize_rtn(ws[0] * s, 4, 32).dequantize() / s
        return float(((d @ g) * d).sum())

    print(f"alpha plain {plain.alpha}, sink-weighted {weighted.alpha}")
    assert loss(weighted.scales) <= loss(plain.scales)


def test_awq_then_gptq_rounds_the_scaled_weights(ckpts, acts):
    """int4-awq-gptq: AWQ's scales folded first (the record has both stages), GPTQ's codes then lower the
    calibration output error of AWQ's round-to-nearest on the same scaled weights."""
    ck = ckpts["llama-untied"]

    def quantized(method):
        return quantize_model(ck.args, ck.weights, ck.arch.weights, QuantConfig(method, block=32), acts)

    awq, both = quantized(QuantMethod.INT4_AWQ), quantized(QuantMethod.INT4_AWQ_GPTQ)
    assert "awq" in both.record and "gptq" in both.record and "gptq" not in awq.record
    assert [r["alpha"] for r in awq.record["awq"]["layer 0"].values()] == [
        r["alpha"] for r in both.record["awq"]["layer 0"].values()
    ]

    def mean_out_err(qm):
        return np.mean([v["rel_out_err"] for v in qm.record["per_tensor"].values() if "rel_out_err" in v])

    print(f"mean Linear output error: AWQ {mean_out_err(awq):.4f}, AWQ + GPTQ {mean_out_err(both):.4f}")
    assert mean_out_err(both) < mean_out_err(awq)


def test_awq_scaling_is_folded_exactly(ckpts, acts):
    """Before rounding, the scaled model is the same function (norms, v rows and up rows absorb 1/s)."""
    ck = ckpts["llama-untied"]
    layers, record = [], {}
    for i, lw in enumerate(ck.weights.layers):
        scaled_layer, _, record[i] = awq_layer(ck.args, i, lw, acts.layer(i), block=32)
        layers.append(scaled_layer)
    scaled = replace(ck.weights, layers=layers)
    assert any(r["alpha"] > 0 for layer in record.values() for r in layer.values())
    assert all(r["loss_vs_rtn"] <= 1.0 for layer in record.values() for r in layer.values())
    ids = np.random.default_rng(3).integers(0, ck.args.vocab_size, 40)
    want = ReferenceModel(ck.args, ck.weights).forward(ids)
    got = ReferenceModel(ck.args, scaled).forward(ids)
    assert rel_err(got, want) < 1e-5  # float32 storage of the scaled weights


def test_calibrated_methods_beat_rtn_on_calibration_inputs(ckpts, acts):
    ck = ckpts["llama-untied"]

    def mean_out_err(method):
        qm = quantize_model(ck.args, ck.weights, ck.arch.weights, QuantConfig(method, block=32), acts)
        return np.mean([v["rel_out_err"] for v in qm.record["per_tensor"].values() if "rel_out_err" in v])

    rtn, awq, gq = (mean_out_err(m) for m in (QuantMethod.INT4, QuantMethod.INT4_AWQ, QuantMethod.INT4_GPTQ))
    print(f"mean Linear output error: RTN {rtn:.4f}, AWQ {awq:.4f}, GPTQ {gq:.4f}")
    assert gq < rtn and awq < rtn


def test_gptq_record_says_how_it_quantized(ckpts, acts):
    ck = ckpts["llama-untied"]
    qm = quantize_model(ck.args, ck.weights, ck.arch.weights, QuantConfig(QuantMethod.INT4_GPTQ, block=32), acts)
    g = qm.record["gptq"]
    # damping 0.01; 0.1 is the sensitivity plan's (tests/test_mixed_precision.py)
    assert (g["act_order"], g["static_groups"], g["damp"], g["sink_weight"]) == (True, True, 0.01, 1.0)
    for name, q in qm.tensors.items():  # static groups: the scales are RTN's of the original blocks
        if q.bits == 4:
            w = ck.weights.layers[int(name.split(".")[2])]
            f = name.split(".")[-2].split("_")[0]  # q_proj -> q, gate_proj -> gate
            assert np.array_equal(q.scales, quantize_rtn(getattr(w, f), 4, 32).scales), name


# -- graphs against the reference ------------------------------------------------------------------

ORT, TRT = Flavor.ORT, Flavor.TRT
FORMATS = [  # the trt flavor writes every INT4 method the same way: codes differ, not the graph
    ("llama-untied", QuantMethod.INT8, 32, ORT),
    ("llama-untied", QuantMethod.INT8, 32, TRT),
    ("llama-untied", QuantMethod.INT4, 32, ORT),
    ("llama-untied", QuantMethod.INT4_AWQ, 64, ORT),
    ("llama-untied", QuantMethod.INT4_GPTQ, 64, ORT),
    ("llama-untied", QuantMethod.INT4_AWQ_GPTQ, 32, ORT),
    ("llama-tied", QuantMethod.INT4, 64, ORT),  # one table for GatherBlockQuantized and the LM head
    ("llama-tied", QuantMethod.INT4_GPTQ, 64, TRT),
    ("llama-untied", QuantMethod.INT4, 64, TRT),
]


@pytest.mark.parametrize("name,method,block,flavor", FORMATS, ids=lambda v: getattr(v, "value", str(v)))
def test_graph_matches_reference_with_the_same_dequantized_weights(ckpts, acts, name, method, block, flavor):
    """accuracy_level 0 (fp32 compute) in `ort`; TensorRT-style dequantize + MatMul in `trt`."""
    ck = ckpts[name]
    calib = acts if method.needs_calibration else None
    if method.needs_calibration and name != "llama-untied":
        calib = capture_linear_inputs(ck.args, ck.weights, load_calibration(ck))
    qm = quantize_model(ck.args, ck.weights, ck.arch.weights, QuantConfig(method, block, accuracy_level=0), calib)
    built, err = _grid(ck, qm, flavor)
    print(f"{name} {method.value} b{block} {flavor.value}: max rel err {err:.2e}")
    assert err <= TOLERANCE["fp32"]
    ops = {n.op_type for n in built.model.graph.node}
    assert ("MatMulNBits" in ops) == (flavor is Flavor.ORT) and ("DequantizeLinear" in ops) == (flavor is Flavor.TRT)


@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
def test_fp_embeddings_keep_the_table_in_float(ckpts, flavor):
    ck = ckpts["llama-tied"]
    config = QuantConfig(QuantMethod.INT8, fp_embeddings=True, accuracy_level=0)
    qm = quantize_model(ck.args, ck.weights, ck.arch.weights, config)
    assert qm.lookup(qm.weights.embed) is None and qm.weights.lm_head is qm.weights.embed
    assert np.array_equal(qm.weights.embed, ck.weights.embed) and ck.arch.weights.embed not in qm.tensors
    built, err = _grid(ck, qm, flavor)
    assert err <= TOLERANCE["fp32"]
    ops = [n.op_type for n in built.model.graph.node]
    assert "Gather" in ops and "Gemm" in ops and "GatherBlockQuantized" not in ops
    table = next(i for i in built.model.graph.initializer if i.name == "/model/embed_tokens/weight")
    assert table.data_type == onnx.TensorProto.FLOAT


@pytest.mark.parametrize("name", ["llama-tied", "llama-untied"])
def test_int4_table_is_gathered_and_read_as_int4_blocks(ckpts, name):
    """--table-bits 4: the embedding (and a separate LM head) in INT4 blocks; GatherBlockQuantized and
    MatMulNBits read them exactly as the dequantized reference does."""
    ck = ckpts[name]
    config = QuantConfig(QuantMethod.INT4, 32, table_bits=4, accuracy_level=0)
    qm = quantize_model(ck.args, ck.weights, ck.arch.weights, config)
    tables = [ck.arch.weights.embed] + ([] if name == "llama-tied" else [ck.arch.weights.lm_head])
    for t in tables:
        assert (qm.tensors[t].bits, qm.tensors[t].block) == (4, 32)
    assert qm.record["embeddings"] == "int4 block 32"
    built, err = _grid(ck, qm, Flavor.ORT)
    assert err <= TOLERANCE["fp32"]
    gather = next(n for n in built.model.graph.node if n.op_type == "GatherBlockQuantized")
    assert onnx.helper.get_attribute_value(next(a for a in gather.attribute if a.name == "bits")) == 4
    heads = [n for n in built.model.graph.node if n.name.startswith("/lm_head") and n.op_type == "MatMulNBits"]
    assert [onnx.helper.get_attribute_value(a) for n in heads for a in n.attribute if a.name == "bits"] == [4]


def test_int4_table_is_refused_for_trt():
    with pytest.raises(ExportError, match="--table-bits 4 needs --flavor ort"):
        check_options(QuantConfig(QuantMethod.INT4, 64, table_bits=4), trt=True)
    with pytest.raises(ExportError, match="must be 4 or 8"):
        QuantConfig(QuantMethod.INT4, 32, table_bits=2)


def test_trt_fp16_quantized_graph_within_fp16_tolerance(ckpts):
    ck = ckpts["llama-tied"]
    qm = quantize_model(ck.args, ck.weights, ck.arch.weights, QuantConfig(QuantMethod.INT4, 64))
    built, err = _grid(ck, qm, Flavor.TRT, Precision.FP16)
    assert err <= TOLERANCE["fp16"]
    scales = [i for i in built.model.graph.initializer if i.name.endswith("/scales")]
    assert scales and all(i.data_type == onnx.TensorProto.FLOAT16 for i in scales)  # DQ outputs fp16


def test_ort_graph_with_int8_activations_within_documented_tolerance(ckpts):
    ck = ckpts["llama-untied"]
    qm = quantize_model(ck.args, ck.weights, ck.arch.weights, QuantConfig(QuantMethod.INT4, 32))
    built, err = _grid(ck, qm, Flavor.ORT)
    print(f"accuracy_level 4: max rel err {err:.2e}")
    assert err <= INT8_ACTIVATION_TOLERANCE
    nbits = [n for n in built.model.graph.node if n.op_type == "MatMulNBits"]
    # q/k/v and gate/up are stacked into one MatMulNBits each: qkv, o, gate_up, down per layer, + LM head
    assert len(nbits) == 4 * ck.args.num_layers + 1
    for n in nbits:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert attrs["accuracy_level"] == 4 and len(n.input) == 3  # no zero points: symmetric
        assert attrs["bits"] == (8 if n.name.startswith("/lm_head") else 4)


@pytest.mark.parametrize("level", [0, 4])
def test_trt_flavor_gives_the_same_logits_as_ort_flavor(ckpts, level):
    """The same integer weights through both flavors, both on ONNX Runtime CPU. At accuracy level 0
    the two graphs differ only in op order (<= 1e-5). At level 4 (the defaults: MatMulNBits in
    `ort`, and ORT fusing `trt`'s DequantizeLinear -> MatMul into the same kernel) only the LM head
    differs (MatMulNBits vs a dequantized Gemm), by int8 activation rounding."""
    ck = ckpts["llama-tied"]
    qm = quantize_model(ck.args, ck.weights, ck.arch.weights, QuantConfig(QuantMethod.INT4, 64, accuracy_level=level))
    logits = {}
    for flavor in Flavor:
        built = build_decoder(ck.args, qm.weights, flavor, Precision.FP32, quantized=qm)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", str(level))
        sess = ort.InferenceSession(built.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        run = NumpyGraphRunner(
            sess,
            flavor=flavor,
            dtype=built.activation_dtype,
            kv_heads=[lw.num_kv_heads(ck.args.head_dim) for lw in qm.weights.layers],
            head_dim=ck.args.head_dim,
            inv_freq=ReferenceModel(ck.args, qm.weights).inv_freq,
            geometry=RingGeometry(sinks=4, window=16, slack=7),
        )
        ids = np.random.default_rng(4).integers(0, ck.args.vocab_size, 50).tolist()
        logits[flavor] = np.concatenate([run.feed(ids[:30], max_chunk=8), *[run.feed([t]) for t in ids[30:]]])
    err = rel_err(logits[Flavor.TRT], logits[Flavor.ORT].astype(np.float64))
    print(f"accuracy_level {level}: trt vs ort max rel diff {err:.2e}")
    assert err <= (1e-5 if level == 0 else INT8_ACTIVATION_TOLERANCE)


def test_int8_blocks_match_the_reference_and_round_closer_than_per_channel(ckpts):
    """--quant int8 --block 32 (llama.cpp's Q8_0 form): a scale per 32 inputs in MatMulNBits bits 8, the graph
    computing with exactly the dequantized weights, and every Linear's rounding error below per channel's."""
    ck = ckpts["llama-untied"]
    blocked = quantize_model(
        ck.args, ck.weights, ck.arch.weights, QuantConfig(QuantMethod.INT8, int8_block=32, accuracy_level=0)
    )
    per_channel = quantize_model(ck.args, ck.weights, ck.arch.weights, QuantConfig(QuantMethod.INT8))
    built, err = _grid(ck, blocked, ORT)
    assert err <= TOLERANCE["fp32"]
    assert blocked.record["block"] == 32 and per_channel.record["block"] == "channel"
    linears = [n for n, q in blocked.tensors.items() if n not in (ck.arch.weights.embed, ck.arch.weights.lm_head)]
    assert linears
    for name in linears:
        q = blocked.tensors[name]
        assert (q.bits, q.block, q.scales.shape) == (8, 32, (q.shape[0], q.shape[1] // 32)), name
        b, c = (m.record["per_tensor"][name]["rel_err"] for m in (blocked, per_channel))
        assert b < c, (name, b, c)
    nbits = [n for n in built.model.graph.node if n.op_type == "MatMulNBits" and "/layers." in n.name]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in nbits]
    assert attrs and all(a["bits"] == 8 and a["block_size"] == 32 for a in attrs)


def test_int8_blocks_must_divide_every_linear_input(ckpts, tmp_path):
    d = ckpts["llama-untied"].path  # hidden 64
    with pytest.raises(ExportError, match=r"INT8 block size 128 does not divide the input dimension 64 .*--block 64"):
        export(ExportOptions(d, tmp_path / "out", quant=QuantConfig(QuantMethod.INT8, int8_block=128)))
    with pytest.raises(ExportError, match="INT8 blocks apply to --quant int8, not int4"):
        QuantConfig(QuantMethod.INT4, int8_block=32)


def test_trt_quantized_graph_is_tensorrt_parsable(ckpts):
    ck = ckpts["llama-untied"]
    for method, block in ((QuantMethod.INT4, 64), (QuantMethod.INT8, 32)):
        qm = quantize_model(ck.args, ck.weights, ck.arch.weights, QuantConfig(method, block))
        model = build_decoder(ck.args, qm.weights, Flavor.TRT, Precision.FP16, quantized=qm).model
        assert {n.domain for n in model.graph.node} <= {""}
        assert {n.op_type for n in model.graph.node} <= TRT_10_3_OPS
        inits = {i.name: i for i in model.graph.initializer}
        for n in (n for n in model.graph.node if n.op_type == "DequantizeLinear"):
            assert len(n.input) == 2  # no zero point (TensorRT: zero-point 0 only)
            assert (numpy_helper.to_array(inits[n.input[1]]) > 0).all()
            codes = inits[n.input[0]]
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            if codes.data_type == onnx.TensorProto.INT4:
                assert attrs == {"axis": 0, "block_size": block}
            else:
                assert codes.data_type == onnx.TensorProto.INT8 and "block_size" not in attrs


# -- the export pipeline and the CLI -------------------------------------------------------------------


def test_cli_int4_awq_export_records_errors_and_perplexity(ckpts, tmp_path):
    ck = ckpts["llama-untied"]
    (ck.path / "heldout.txt").write_text("Whether 'tis nobler in the mind to suffer. " * 30)
    out = tmp_path / "b"
    r = CliRunner().invoke(export_cli, [str(ck.path), "-o", str(out), "--quant", "int4-awq", "--block", "64"])
    assert r.exit_code == 0, r.output
    # calibrated a layer at a time as each is quantized (the order: tests/test_export_progress.py)
    assert "quantizing: 3 layers (int4-awq, block 64, each layer's calibration forward on " in r.output
    assert "quantizing: 3/3 layers in " in r.output
    q = json.loads((out / "manifest.json").read_text())["quantization"]
    assert sorted(q["awq"]) == ["layer 0", "layer 1", "layer 2", "sink_weight"]
    assert q["method"] == "int4-awq" and q["block"] == 64 and q["embeddings"] == "int8 per row"
    assert len(q["per_tensor"]) == 7 * 3 + 2  # Linears, embedding, untied LM head
    assert all(0 < v["rel_err"] < 0.2 for v in q["per_tensor"].values())
    assert q["calibration"]["tokens"] > 100 and q["exact_parity"]["max_rel_err"] <= 1e-4
    ppl = q["heldout_ppl"]
    assert ppl["tokens"] > 100 and ppl["exported"] > 1 and ppl["original"] > 1
    r = CliRunner().invoke(export_cli, ["inspect", str(out)])
    assert r.exit_code == 0, r.output
    assert "int4-awq: Linear int4 block 64" in r.output and "held-out    perplexity" in r.output


def test_cli_int8_block_exports_validated_int8_blocks(ckpts, tmp_path):
    out = tmp_path / "b"
    r = CliRunner().invoke(
        export_cli, [str(ckpts["llama-untied"].path), "-o", str(out), "--quant", "int8", "--block", "32"]
    )
    assert r.exit_code == 0, r.output
    m = json.loads((out / "manifest.json").read_text())
    q = m["quantization"]
    assert q["block"] == 32 and m["provenance"]["options"]["int8_block"] == 32 and q["embeddings"] == "int8 per row"
    linears = [v for k, v in q["per_tensor"].items() if "layers." in k]
    assert len(linears) == 7 * 3 and all(v["bits"] == 8 and v["block"] == 32 for v in linears)
    assert m["validation"]["max_rel_err"] <= m["validation"]["tolerance"]
    r = CliRunner().invoke(export_cli, ["inspect", str(out)])
    assert r.exit_code == 0 and "int8: Linear int8 block 32" in r.output, r.output


def test_cli_table_bits_4_exports_an_int4_table(ckpts, tmp_path):
    out = tmp_path / "b"
    r = CliRunner().invoke(
        export_cli, [str(ckpts["llama-untied"].path), "-o", str(out), "--quant", "int4", "--table-bits", "4"]
    )
    assert r.exit_code == 0, r.output
    q = json.loads((out / "manifest.json").read_text())["quantization"]
    assert q["embeddings"] == "int4 block 32" and q["per_tensor"]["model.embed_tokens.weight"]["bits"] == 4


def _leftovers(parent):
    return sorted(p.name for p in parent.iterdir())


def test_cli_unknown_quant_is_a_usage_error_naming_the_methods(ckpts, tmp_path):
    """--quant is checked when the command line is parsed (click's usage error, exit 2), against QuantMethod."""
    out = tmp_path / "out" / "b"
    r = CliRunner().invoke(export_cli, [str(ckpts["llama-untied"].path), "-o", str(out), "--quant", "int3"])
    assert r.exit_code == 2 and "Traceback" not in r.output and not (tmp_path / "out").exists()
    known = "none, int8, int4, int4-awq, int4-gptq, int4-awq-gptq"
    assert f"unknown quantization method 'int3'; choose one of: {known}" in r.output.replace("\n", " ")
    help_text = CliRunner().invoke(export_cli, ["build", "--help"]).output
    assert "--quant [" + "|".join(m.value for m in QuantMethod) + "]" in help_text


@pytest.mark.parametrize(
    "args,message",
    [
        (["--quant", "int4", "--block", "48"], "block size 48 is not supported"),
        (["--quant", "int4", "--flavor", "trt", "--block", "32"], "not supported by TensorRT"),
        (["--quant", "int4-awq", "--calib", "/nonexistent/calib.txt"], "does not exist"),
        (["--quant", "int8", "--flavor", "trt", "--table-bits", "4"], "--table-bits 4 needs --flavor ort"),
    ],
)
def test_cli_bad_options_fail_in_one_line_leaving_nothing(ckpts, tmp_path, args, message):
    out = tmp_path / "out" / "b"
    r = CliRunner().invoke(export_cli, [str(ckpts["llama-untied"].path), "-o", str(out), *args])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.strip().splitlines()[-1].startswith("Error: ") and message in r.output
    assert not (tmp_path / "out").exists()


def test_block_that_does_not_divide_the_input_dimension(ckpts, tmp_path):
    d = ckpts["llama-untied"].path  # hidden 64: block 128 does not divide q_proj's input
    with pytest.raises(ExportError, match=r"block size 128 does not divide the input dimension 64 .*--block 64"):
        export(ExportOptions(d, tmp_path / "out", quant=QuantConfig(QuantMethod.INT4, 128)))
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("content", [None, "", "  \n\n"], ids=["missing", "empty", "blank"])
def test_missing_or_empty_calibration_file(ckpts, tmp_path, content):
    calib = tmp_path / "calib.txt"
    if content is not None:
        calib.write_text(content)
    opts = ExportOptions(
        ckpts["llama-untied"].path, tmp_path / "out", quant=QuantConfig(QuantMethod.INT4_GPTQ, 64), calibration=calib
    )
    with pytest.raises(ExportError, match="does not exist" if content is None else "is empty"):
        export(opts)
    assert _leftovers(tmp_path) == ([] if content is None else ["calib.txt"])


def test_unknown_method_and_bad_levels_are_export_errors():
    with pytest.raises(ExportError, match="choose one of: none, int8, int4, int4-awq, int4-gptq, int4-awq-gptq"):
        QuantMethod.parse("nf4")
    with pytest.raises(ExportError, match="accuracy_level 7"):
        QuantConfig(QuantMethod.INT4, 32, accuracy_level=7)

