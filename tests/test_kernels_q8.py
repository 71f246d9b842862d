"""MatMulQ8 (csrc/q8gemm.h): INT8 per-channel weights x int8 activations in blocks of 32, against a float64
reference, MatMulNBits' 8-bit path at block 32 (the same arithmetic), and between its implementations."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_runtime import kernels

from .test_kernels import ISAS, MATMUL_CASES, _pin_isa, _session, needs_kernels


def _graph(
    op: str, k: int, n: int, b: np.ndarray, s: np.ndarray, rank: int, *, argmax: bool = False, fp32: bool = False
) -> bytes:
    """`fp32`: MatMulQ8's fp32_compute=1, or MatMulNBits at accuracy_level 0 (both with float activations)."""
    if op == kernels.MATMUL_Q8:
        domain, attrs = kernels.DOMAIN, {"K": k, "N": n, **({"fp32_compute": 1} if fp32 else {})}
    else:  # the per-channel scale repeated over blocks of 32: exactly the same weights
        level = 0 if fp32 else 4
        domain, attrs = "com.microsoft", {"K": k, "N": n, "bits": 8, "block_size": 32, "accuracy_level": level}
        b, s = b.reshape(n, k // 32, 32), np.repeat(s[:, None], k // 32, axis=1)
    lead = ["T"] if rank == 2 else [1, "T"]
    outputs = ["y", "am"] if argmax else ["y"]
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "B", "S"], outputs, domain=domain, **attrs)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])]
        + ([helper.make_tensor_value_info("am", TensorProto.INT64, None)] if argmax else []),
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "S")],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def _weights(rng, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    b = rng.integers(0, 256, (n, k), dtype=np.uint8)  # codes -128..127 + 128: both extremes occur
    s = (rng.random(n, dtype=np.float32) * 0.02 + 1e-4).astype(np.float32)
    return b, s


def _op_weights(rng, op: str, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Random B and scales for `op`: MatMulQ4's int4 blocks with fp16 scales, or MatMulQ8's per-channel int8."""
    if op == kernels.MATMUL_Q4:
        b = rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8)
        return b, (rng.random((n, k // 32)) * 0.02 + 1e-4).astype(np.float16)
    return _weights(rng, k, n)


def _reference(x: np.ndarray, b: np.ndarray, s: np.ndarray) -> np.ndarray:
    """float64: dequantized weights times x rounded to int8 per block of 32 (scale = block max / 127)."""
    n, k = b.shape
    w = (b.astype(np.float64) - 128) * s.astype(np.float64)[:, None]
    xb = x.reshape(-1, k // 32, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    xq = np.rint(xb * inv).astype(np.float64) * (amax / np.float32(127)).astype(np.float64)
    return (xq.reshape(-1, k) @ w.T).reshape(*x.shape[:-1], n)


@needs_kernels
@pytest.mark.parametrize(("m", "k", "n", "rank"), MATMUL_CASES)
@pytest.mark.parametrize("isa", ISAS)
def test_matmul_q8_is_int8_activations_times_per_channel_weights(m, k, n, rank, isa, monkeypatch):
    _pin_isa(monkeypatch, isa)
    rng = np.random.default_rng(m * 1000 + n)
    b, s = _weights(rng, k, n)
    x = rng.standard_normal((m, k) if rank == 2 else (1, m, k)).astype(np.float32)
    x[..., :32] *= 40  # one block with outliers, as sink tokens have: its own scale must absorb them
    ours = _session(_graph(kernels.MATMUL_Q8, k, n, b, s, rank)).run(None, {"x": x})[0]
    mlas = _session(_graph("MatMulNBits", k, n, b, s, rank)).run(None, {"x": x})[0]
    ref = _reference(x, b, s)
    assert ours.shape == ref.shape == mlas.shape
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() / scale < 2e-6
    assert np.abs(ours - mlas).max() / scale < 2e-6


@needs_kernels
def test_matmul_q8_implementations_agree(monkeypatch):
    """VNNI's unsigned codes with the zero point removed and AVX2's signed products are the same int32 sums."""
    isas = kernels.runnable()
    if len(isas) < 2:
        pytest.skip("this CPU has only the AVX2 implementations")
    rng = np.random.default_rng(7)
    b, s = _weights(rng, 1088, 70)
    x = rng.standard_normal((21, 1088)).astype(np.float32)
    ys = {}
    for isa in isas:
        monkeypatch.setenv("EDGE_KERNELS_ISA", isa)
        sess = _session(_graph(kernels.MATMUL_Q8, 1088, 70, b, s, 2))
        ys[isa] = np.concatenate([sess.run(None, {"x": x})[0], sess.run(None, {"x": x[:1]})[0]])
    for isa in isas[1:]:
        assert np.abs(ys["avx2"] - ys[isa]).max() / np.abs(ys["avx2"]).max() < 1e-6, isa


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_matmul_q8_argmax_output_is_numpys_argmax(isa, monkeypatch):
    _pin_isa(monkeypatch, isa)
    rng = np.random.default_rng(11)
    k, n = 128, 4099
    b, s = _weights(rng, k, n)
    b[[100, 3000, 4098]], s[[100, 3000, 4098]] = b[7], s[7]  # copies of column 7 in other column tasks
    sess = _session(_graph(kernels.MATMUL_Q8, k, n, b, s, 2, argmax=True))
    for m in (1, 5, 16):
        y, am = sess.run(None, {"x": rng.standard_normal((m, k)).astype(np.float32)})
        assert am.shape == (m, 1) and am.dtype == np.int64
        np.testing.assert_array_equal(am[:, 0], y.argmax(-1))
    y, am = sess.run(None, {"x": (b[7].astype(np.float32) - 128)[None]})  # column 7 and its copies tie
    assert y[0, 7] == y[0, 100] == y[0, 3000] == y[0, 4098] == y.max() and am[0, 0] == 7


@needs_kernels
def test_matmul_q8_zero_rows_single_thread_and_bad_shapes():
    rng = np.random.default_rng(2)
    b, s = _weights(rng, 128, 40)
    sess = _session(_graph(kernels.MATMUL_Q8, 128, 40, b, s, 3), threads=1)
    assert sess.run(None, {"x": np.zeros((1, 0, 128), np.float32)})[0].shape == (1, 0, 40)
    assert not sess.run(None, {"x": np.zeros((1, 2, 128), np.float32)})[0].any()  # scale-0 blocks
    with pytest.raises(Exception, match="MatMulQ8: K must be a positive multiple of 64"):
        odd_k = _graph(kernels.MATMUL_Q8, 96, 8, *_weights(rng, 96, 8), 2)
        _session(odd_k).run(None, {"x": np.ones((1, 96), np.float32)})
    with pytest.raises(Exception, match="MatMulQ8: B or scales do not hold N x K bytes and N scales"):
        _session(_graph(kernels.MATMUL_Q8, 128, 8, b[:4], s[:4], 2)).run(None, {"x": np.ones((1, 128), np.float32)})
    blockwise = onnx.load_from_string(_graph(kernels.MATMUL_Q8, 128, 8, b[:8], s[:8], 2))
    blockwise.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones((8, 4), np.float32), "S"))
    with pytest.raises(Exception, match="N x K bytes and N scales"):  # MatMulNBits' block scales are refused
        _session(blockwise.SerializeToString()).run(None, {"x": np.ones((1, 128), np.float32)})
    halves = _graph(kernels.MATMUL_Q8, 128, 8, b[:8], s[:8].astype(np.float16), 2)
    with pytest.raises(Exception, match="MatMulQ8: scales must be float"):
        _session(halves).run(None, {"x": np.ones((1, 128), np.float32)})


@needs_kernels
def test_int8_edge_export_runs_matmul_q8_for_every_product_and_validates(tmp_path, monkeypatch):
    from edge_runtime.engine import load
    from edge_runtime.exporters import export as export_module
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod

    from .tiny_models import save_tiny_checkpoint

    builds = []
    real_build = export_module.build_decoder
    monkeypatch.setattr(export_module, "build_decoder", lambda *a, **k: builds.append(a[4]) or real_build(*a, **k))
    ckpt = tmp_path / "ckpt"
    save_tiny_checkpoint("llama-tied", ckpt, intermediate_size=128)  # every K a multiple of 64
    manifests = {}
    for kernel in ("edge", "mlas"):
        quant = QuantConfig(QuantMethod.INT8, kernel=MatMulKernel(kernel))
        manifests[kernel] = export(ExportOptions(checkpoint=ckpt, out=tmp_path / kernel, window=60, quant=quant))
    # Each graph is its own fp32 twin (MatMulQ8 fp32_compute=1 over the same data file), built once.
    assert [q.config.kernel.value for q in builds] == ["edge", "mlas"]
    edge = manifests["edge"]
    for m in manifests.values():
        assert m.validation.max_rel_err <= m.validation.tolerance
        assert m.quantization["exact_parity"]["max_rel_err"] <= m.quantization["exact_parity"]["tolerance"] <= 5e-3
    graph = onnx.load(str(tmp_path / "edge" / "model.onnx"), load_external_data=False).graph
    top = [n.op_type for n in graph.node]
    # no If: one RingAttention a layer at every fill; qkv, o, gate_up, down a layer and the LM head
    assert "If" not in top and top.count(kernels.MATMUL_Q8) == 2 * 4 + 1 and "MatMulNBits" not in top
    assert top.count(kernels.RING_ATTENTION) == 2
    (head,) = [n for n in graph.node if n.op_type == kernels.MATMUL_Q8 and n.name.startswith("/lm_head")]
    (gather,) = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    assert head.input[1] == gather.input[0]  # the tied table: one copy, read by both

    a, b = load(tmp_path / "edge"), load(tmp_path / "mlas")
    assert a.fused_argmax and not b.fused_argmax
    prompt = list(range(3, 40))
    la, lb = a.prefill(prompt, all_logits=True), b.prefill(prompt, all_logits=True)
    errs = [np.abs(la - lb).max() / np.abs(lb).max()]
    for tok in (5, 9, 11, 2) * 20:  # 80 decode steps: past the 64-row ring's wrap
        da, db = a.decode(tok), b.decode(tok)
        assert a.decoded_argmax() == int(np.argmax(da))
        errs.append(np.abs(da - db).max() / np.abs(db).max())
    # MLAS quantizes the activations in its blocks of 64 and 128, MatMulQ8 in blocks of 32: the two differ
    # by activation rounding (3e-2 median here), not by the weights, and the finer blocks are the closer
    # to the float model (the exporter's validation: 0.049 against MLAS's 0.055 on this checkpoint)
    assert max(errs) < edge.validation.tolerance
    assert edge.validation.max_rel_err <= manifests["mlas"].validation.max_rel_err


@needs_kernels
@pytest.mark.parametrize("op", [kernels.MATMUL_Q4, kernels.MATMUL_Q8])
@pytest.mark.parametrize("isa", ISAS)
def test_rows_up_to_exact_rows_are_bit_for_bit_decode_steps(op, isa, monkeypatch):
    """kernels.exact_rows, which caps speculative verification chunks, is true: a chunk of up to that many
    rows (24 where it says any) equals one-row calls bit for bit, K chunked (2048, 1536) or not (576, 640:
    a last quad of 1 and of 2 pairs, which the kernels sum on their own)."""
    from .test_kernels import _graph as q4_graph
    from .test_kernels import _weights as q4_weights

    _pin_isa(monkeypatch, isa)
    cap = kernels.exact_rows({op})
    rng = np.random.default_rng(5)
    tight = []
    for k in (576, 640, 1536, 2048):
        n = 80
        if op == kernels.MATMUL_Q4:
            b, s = q4_weights(rng, k, n)
            sess = _session(q4_graph(op, k, n, b, s.astype(np.float16), 2))
        else:
            sess = _session(_graph(op, k, n, *_weights(rng, k, n), 2))
        x = rng.standard_normal((24, k)).astype(np.float32)
        one = np.concatenate([sess.run(None, {"x": x[i : i + 1]})[0] for i in range(24)])
        for m in range(1, (cap or 24) + 1):
            assert np.array_equal(sess.run(None, {"x": x[:m]})[0], one[:m]), (k, m)
        if cap is not None:
            tight.append(not np.array_equal(sess.run(None, {"x": x[: cap + 1]})[0], one[: cap + 1]))
    # The cap is the kernel's, not a loose bound: one row more rounds differently at some K (AVX2's
    # MatMulQ4 at five rows still equals decode where K is not chunked, K = 576).
    assert cap is None or any(tight)


@needs_kernels
@pytest.mark.parametrize(("m", "k", "n", "rank"), MATMUL_CASES)
def test_matmul_q8_fp32_compute_is_float_activations_times_the_same_weights(m, k, n, rank):
    """fp32_compute=1 (the export's fp32 twin of INT8 edge graphs): MatMulNBits at accuracy_level 0's arithmetic
    over the same bytes, without its float copy of B per call; float64 reference, no activation rounding."""
    rng = np.random.default_rng(m * 1000 + n + 7)
    b, s = _weights(rng, k, n)
    x = rng.standard_normal((m, k) if rank == 2 else (1, m, k)).astype(np.float32)
    x[..., :32] *= 40
    ours, am = _session(_graph(kernels.MATMUL_Q8, k, n, b, s, rank, argmax=True, fp32=True)).run(None, {"x": x})
    mlas = _session(_graph("MatMulNBits", k, n, b, s, rank, fp32=True)).run(None, {"x": x})[0]
    w = (b.astype(np.float64) - 128) * s.astype(np.float64)[:, None]
    ref = (x.reshape(-1, k).astype(np.float64) @ w.T).reshape(*x.shape[:-1], n)
    scale = np.abs(ref).max()
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() / scale < 2e-6  # float32 sums of exact products
    assert np.abs(ours - mlas).max() / scale < 2e-6
    quantized = _reference(x, b, s)  # int8 activations are measurably further off: the mode is really float
    assert np.abs(quantized - ref).max() / scale > 10 * np.abs(ours - ref).max() / scale
    np.testing.assert_array_equal(am[..., 0], np.argmax(ours, axis=-1))


@needs_kernels
def test_fp32_compute_is_refused_on_matmul_q4():
    graph = helper.make_graph(
        [helper.make_node(kernels.MATMUL_Q4, ["x", "B", "S"], ["y"], domain=kernels.DOMAIN, K=64, N=4, fp32_compute=1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [
            numpy_helper.from_array(np.zeros((4, 2, 16), np.uint8), "B"),
            numpy_helper.from_array(np.ones((4, 2), np.float32), "S"),
        ],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1)]
    with pytest.raises(Exception, match="only MatMulQ8 and MatMulGGUF take 1"):
        _session(helper.make_model(graph, opset_imports=opsets).SerializeToString())


@needs_kernels
def test_fp32_compute_twin_turns_int8_products_into_matmul_q8_and_refuses_the_rest(tmp_path):
    """INT8 per-channel graphs (edge or MLAS) become their own float twin; MatMulQ4 (no float mode) and INT8 in
    blocks (MatMulQ8 holds one scale a row) leave the graph as it was, for the rebuilt twin."""
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod
    from edge_runtime.exporters.quant_graph import fp32_compute_twin

    from .tiny_models import save_tiny_checkpoint

    ckpt = tmp_path / "ckpt"
    save_tiny_checkpoint("llama-tied", ckpt, intermediate_size=128)
    configs = {
        "int8-edge": QuantConfig(QuantMethod.INT8, kernel=MatMulKernel.EDGE),
        "int8-mlas": QuantConfig(QuantMethod.INT8),
        "int4-edge": QuantConfig(QuantMethod.INT4, kernel=MatMulKernel.EDGE),
        "int8-blocks": QuantConfig(QuantMethod.INT8, int8_block=32),
    }
    models = {}
    for name, quant in configs.items():
        export(ExportOptions(checkpoint=ckpt, out=tmp_path / name, window=60, quant=quant))
        models[name] = onnx.load(str(tmp_path / name / "model.onnx"), load_external_data=False)

    def products(model):
        top = list(model.graph.node)
        inner = [n for node in top for a in node.attribute if a.type == onnx.AttributeProto.GRAPH for n in a.g.node]
        return [n for n in top + inner if n.op_type in (kernels.MATMUL_Q4, kernels.MATMUL_Q8, "MatMulNBits")]

    for name in ("int4-edge", "int8-blocks"):
        before = models[name].SerializeToString()
        assert not fp32_compute_twin(models[name], tmp_path / name) and models[name].SerializeToString() == before
    for name in ("int8-edge", "int8-mlas"):
        assert fp32_compute_twin(models[name], tmp_path / name)
        flipped = products(models[name])
        assert {n.op_type for n in flipped} == {kernels.MATMUL_Q8}
        assert all(
            helper.get_attribute_value(next(a for a in n.attribute if a.name == "fp32_compute")) == 1 for n in flipped
        )
    # MLAS's repeated per-block scales became one per row, the same values
    mlas = models["int8-mlas"]
    head = next(n for n in mlas.graph.node if n.op_type == kernels.MATMUL_Q8)
    (row_scales,) = [numpy_helper.to_array(t) for t in mlas.graph.initializer if t.name == head.input[2]]
    blocks = onnx.load(str(tmp_path / "int8-mlas" / "model.onnx"))  # with its data: the original scales
    (orig,) = [
        numpy_helper.to_array(t) for t in blocks.graph.initializer if t.name + "/fp32_twin_channel" == head.input[2]
    ]
    np.testing.assert_array_equal(row_scales, orig[:, 0])


@needs_kernels
def test_the_rebuilt_twin_reads_its_int8_products_as_stored_and_keeps_its_int4_ones(tmp_path, monkeypatch):
    """An INT4 export's rebuilt accuracy_level 0 twin: its INT8 per-channel LM head becomes MatMulQ8 with
    fp32_compute (MatMulNBits would dequantize it whole on every step), its INT4 products stay MatMulNBits, and
    the export still validates at the fp32 twin's tolerance through it."""
    from edge_runtime.exporters import export as export_module
    from edge_runtime.exporters import quant_graph
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod
    from edge_runtime.exporters.quant_graph import fp32_compute_int8

    from .tiny_models import save_tiny_checkpoint

    ckpt = tmp_path / "ckpt"
    save_tiny_checkpoint("llama-untied", ckpt, intermediate_size=128)
    converted = []

    def spy(model, data_dir):
        n = fp32_compute_int8(model, data_dir)
        converted.append([(node.op_type, node.name) for node in model.graph.node if "MatMul" in node.op_type])
        return n

    monkeypatch.setattr(export_module, "fp32_compute_int8", spy)
    monkeypatch.setattr(quant_graph, "FP32_HEAD_MAX_BYTES", 0)  # a head too large for a float32 Gemm, as Gemma's
    quant = QuantConfig(QuantMethod.INT4, kernel=MatMulKernel.EDGE)
    manifest = export(ExportOptions(checkpoint=ckpt, out=tmp_path / "b", window=60, quant=quant))
    assert manifest.quantization["exact_parity"]["max_rel_err"] <= manifest.quantization["exact_parity"]["tolerance"]
    (ops,) = converted
    head = [op for op, name in ops if "lm_head" in name]
    assert head and set(head) == {kernels.MATMUL_Q8}
    assert {op for op, name in ops if "lm_head" not in name and "layers" in name} == {"MatMulNBits"}


@needs_kernels
@pytest.mark.parametrize("kv", ["fp16", "q8"])
def test_an_int8_edge_export_with_a_narrow_cache_is_its_own_twin_with_an_fp32_cache(kv, tmp_path, monkeypatch):
    """The bundle's own graph carries its fp16 / q8 cache, which the fp32 twin's tolerance does not allow for:
    the twin is that graph with float activations and an fp32 cache (quant_graph.float32_cache), nothing
    rebuilt, and the export passes."""
    from edge_runtime.exporters import export as export_module
    from edge_runtime.exporters.decoder import KvDtype
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod

    from .tiny_models import save_tiny_checkpoint

    builds, caches = [], []
    real_build, real_session = export_module.build_decoder, export_module._session
    monkeypatch.setattr(export_module, "build_decoder", lambda *a, **k: builds.append(k) or real_build(*a, **k))

    def session(*a, **k):
        s = real_session(*a, **k)
        caches.append({i.type for i in s.get_inputs() if i.name.startswith("past_")})
        return s

    monkeypatch.setattr(export_module, "_session", session)
    ckpt = tmp_path / "ckpt"
    save_tiny_checkpoint("llama-tied", ckpt, intermediate_size=128)
    quant = QuantConfig(QuantMethod.INT8, kernel=MatMulKernel.EDGE)
    m = export(ExportOptions(checkpoint=ckpt, out=tmp_path / "b", window=60, quant=quant, kv_dtype=KvDtype(kv)))
    narrow = {"fp16": "tensor(float16)", "q8": "tensor(uint8)"}[kv]
    assert len(builds) == 1 and caches == [{"tensor(float)"}, {narrow}]  # the twin, then the bundle's own graph
    parity = m.quantization["exact_parity"]
    assert parity["max_rel_err"] <= parity["tolerance"] <= 5e-3
    assert m.validation.max_rel_err <= m.validation.tolerance


@needs_kernels
@pytest.mark.parametrize("op", [kernels.MATMUL_Q4, kernels.MATMUL_Q8])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m", [1, 3, 9, 20])  # decode, the tree rows of a chunk, a prompt's lanes rows
def test_a_nan_or_inf_activation_makes_its_row_non_finite(op, isa, m, monkeypatch):
    """The activation quantizer must not swallow a NaN (max_ps drops one): a NaN that became finite
    garbage would pass logits_check.py, which is how the runtime refuses a corrupted model's output."""
    from .test_kernels import _graph as q4_graph
    from .test_kernels import _weights as q4_weights

    _pin_isa(monkeypatch, isa)
    rng = np.random.default_rng(m)
    k, n = 640, 24
    if op == kernels.MATMUL_Q4:
        b, s = q4_weights(rng, k, n)
        sess = _session(q4_graph(op, k, n, b, s.astype(np.float16), 2))
    else:
        sess = _session(_graph(op, k, n, *_weights(rng, k, n), 2))
    x = rng.standard_normal((m, k)).astype(np.float32)
    clean = sess.run(None, {"x": x})[0]
    for bad in (np.nan, np.inf, -np.inf):
        for pos in (0, 5, 33, 600):  # first and later lanes of a block, a later block, the last quad
            row = pos % m
            y = x.copy()
            y[row, pos] = bad
            out = sess.run(None, {"x": y})[0]
            assert not np.isfinite(out[row]).any(), (bad, pos)
            others = [r for r in range(m) if r != row]
            assert np.array_equal(out[others], clean[others]), (bad, pos)
