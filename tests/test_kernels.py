"""edge-runtime's own ONNX Runtime ops (csrc/): MatMulQ4, SiluMul and LinearAttention, one graph each.

The op must compute exactly what MatMulNBits computes at accuracy_level 4 on the same bytes (int8
activations per block of 32, scale max/127, round to nearest even), so it is checked against a numpy
transcription of that arithmetic and against MatMulNBits itself. `--kernel edge` exports are checked in
tests/test_kernels_export.py.
"""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_runtime import kernels
from edge_runtime.errors import KernelPinError

needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"{kernels.unavailable_reason()}")
ISAS = kernels.ISAS  # MatMulQ4's and MatMulQ8's implementations (csrc/qgemm.c)


def _pin_isa(monkeypatch, isa: str) -> None:
    """Sessions created after this run MatMulQ4's `isa` implementation; skip where the CPU lacks it."""
    monkeypatch.setenv("EDGE_KERNELS_ISA", isa)
    if kernels.isa() != isa:
        pytest.skip(f"this CPU cannot run MatMulQ4's {isa} implementation")


def _graph(op: str, k: int, n: int, b: np.ndarray, s: np.ndarray, rank: int, *, free_k: bool = False) -> bytes:
    if op == "MatMulQ4":
        domain, attrs = kernels.DOMAIN, {"K": k, "N": n}
    else:
        domain, attrs = "com.microsoft", {"K": k, "N": n, "bits": 4, "block_size": 32, "accuracy_level": 4}
    lead = ["T"] if rank == 2 else [1, "T"]
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "B", "S"], ["y"], domain=domain, **attrs)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, "K" if free_k else k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "S")],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def _session(model: bytes, threads: int = 2) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    assert kernels.register(so)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _weights(rng, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    b = rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8)
    s = (rng.random((n, k // 32), dtype=np.float32) * 0.02 + 1e-4).astype(np.float32)
    return b, s


def _int8_act_reference(x: np.ndarray, b: np.ndarray, s: np.ndarray) -> np.ndarray:
    """MatMulNBits' accuracy_level-4 arithmetic in float64: dequantized weights times int8-rounded x."""
    n, kb, _ = b.shape
    k = kb * 32
    codes = np.stack([(b & 15), (b >> 4)], axis=-1).reshape(n, k).astype(np.float64) - 8
    w = codes * np.repeat(s.astype(np.float64), 32, axis=1)
    xb = x.reshape(-1, kb, 32).astype(np.float32)
    scale = np.abs(xb).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.where(scale > 0, np.float32(127) / np.abs(xb).max(axis=-1, keepdims=True), 0).astype(np.float32)
    xq = np.rint(xb * inv).astype(np.float64) * scale.astype(np.float64)
    return (xq.reshape(-1, k) @ w.T).reshape(*x.shape[:-1], n)


# (M, K, N, rank of A) for the matmul ops' parity tests (MatMulQ4 here, MatMulQ8 in test_kernels_q8.py):
# M = 6, 7 and 9: tiles and a part; 128: eight-row pairs of tiles; K = 1088: K in chunks of 16 pairs with a
# 1-pair chunk; K = 576, 192: a partial last quad; M = 16, N = 37: a task of 5 columns (pairs and a single);
# M = 19: above MatMulQ8's tree rows, full tiles (lanes) and a part (tree) in one call
MATMUL_CASES = [
    (1, 576, 960, 3),
    (1, 64, 5, 2),
    (3, 128, 37, 3),
    (4, 192, 64, 2),
    (6, 128, 20, 2),
    (9, 2048, 130, 3),
    (7, 1088, 40, 2),
    (128, 576, 300, 3),
    (16, 256, 37, 2),
    (19, 576, 45, 2),
    (5, 640, 33, 2),  # a last quad of 2 pairs after full ones (VNNI sums it on its own)
    (17, 1088, 37, 2),  # AMX from 17 rows: a tile and one row, K chunks of 32 blocks and 2, a part of 16 columns
    (300, 64, 50, 3),  # AMX: more rows than one call takes (256), one pair of blocks
]


@needs_kernels
@pytest.mark.parametrize(("m", "k", "n", "rank"), MATMUL_CASES)
@pytest.mark.parametrize("scale_dtype", [np.float16, np.float32])  # fp16: what exports write
@pytest.mark.parametrize("isa", ISAS)
def test_matmul_q4_is_matmulnbits_at_accuracy_level_4(m, k, n, rank, scale_dtype, isa, monkeypatch):
    _pin_isa(monkeypatch, isa)
    rng = np.random.default_rng(m * 1000 + n)
    b, s = _weights(rng, k, n)
    s = s.astype(scale_dtype).astype(np.float32)  # fp16-representable, as exported scales are
    x = rng.standard_normal((m, k) if rank == 2 else (1, m, k)).astype(np.float32)
    x[..., :32] *= 40  # one block with outliers, as sink tokens have: its own scale must absorb them
    ours = _session(_graph("MatMulQ4", k, n, b, s.astype(scale_dtype), rank)).run(None, {"x": x})[0]
    mlas = _session(_graph("MatMulNBits", k, n, b, s, rank)).run(None, {"x": x})[0]
    ref = _int8_act_reference(x, b, s)
    assert ours.shape == ref.shape == mlas.shape
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() / scale < 2e-6
    assert np.abs(ours - mlas).max() / scale < 2e-6


@needs_kernels
def test_the_references_int8_rounding_is_matmul_q4s():
    """exporters.reference.round_int8_blocks (the int8 bound's probe, exporters/validate.py) rounds a Linear's
    input as MatMulQ4 does: its product with the dequantized weights is the op's result to float noise."""
    from edge_runtime.exporters.reference import round_int8_blocks

    rng = np.random.default_rng(7)
    k, n = 576, 45
    b, s = _weights(rng, k, n)
    x = rng.standard_normal((9, k)).astype(np.float32)
    x[:, :32] *= 40
    x[3, 64:96] = 0.0  # a block of zeros: scale 0, codes 0
    codes = np.stack([(b & 15), (b >> 4)], axis=-1).reshape(n, k).astype(np.float64) - 8
    w = codes * np.repeat(s.astype(np.float64), 32, axis=1)
    ours = round_int8_blocks(x, 32).astype(np.float64) @ w.T
    op = _session(_graph("MatMulQ4", k, n, b, s, 2)).run(None, {"x": x})[0]
    assert np.abs(op - ours).max() / np.abs(ours).max() < 2e-6
    assert np.abs(x @ w.T - ours).max() / np.abs(ours).max() > 1e-4  # and the rounding is really there


@pytest.mark.parametrize("block", [32, 128])
def test_the_references_int8_rounding_is_matmulnbits_8_bit_at_its_block(block):
    """MatMulNBits at accuracy_level 4 rounds its inputs in blocks of its own block_size (a per-channel INT8
    product's is the largest of 128..16 dividing K: quant_graph.nbits_block), as the probe does."""
    from edge_runtime.exporters.reference import round_int8_blocks

    rng = np.random.default_rng(block)
    k, n = 640, 24
    codes = rng.integers(-127, 128, (n, k))
    s = (rng.random((n, k // block), dtype=np.float32) * 0.01 + 1e-4).astype(np.float32)
    b = (codes + 128).astype(np.uint8).reshape(n, k // block, block)
    node = helper.make_node(
        "MatMulNBits", ["x", "B", "S"], ["y"], domain="com.microsoft", K=k, N=n, bits=8, block_size=block,
        accuracy_level=4,
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", n])],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "S")],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((7, k)).astype(np.float32)
    x[:, :32] *= 40
    w = codes * np.repeat(s.astype(np.float64), block, axis=1)
    y = sess.run(None, {"x": x})[0]
    ours = round_int8_blocks(x, block).astype(np.float64) @ w.T
    other = round_int8_blocks(x, 160 - block).astype(np.float64) @ w.T  # the other block's rounding
    assert np.abs(y - ours).max() / np.abs(ours).max() < 2e-6 < np.abs(y - other).max() / np.abs(ours).max()


@needs_kernels
def test_matmul_q4_implementations_agree_and_a_bad_pin_is_refused(monkeypatch):
    """Every implementation forms the same exact int32 block sums as AVX2's; only float rounding order
    differs (21 rows: AMX tiles where the CPU has them; 1 row: decode)."""
    isas = kernels.runnable()
    if len(isas) < 2:
        pytest.skip("this CPU has only MatMulQ4's AVX2 implementation")
    rng = np.random.default_rng(7)
    b, s = _weights(rng, 1088, 70)
    model = _graph("MatMulQ4", 1088, 70, b, s.astype(np.float16), 2)
    x = rng.standard_normal((21, 1088)).astype(np.float32)
    ys = {}
    for isa in isas:
        monkeypatch.setenv("EDGE_KERNELS_ISA", isa)
        sess = _session(model)
        ys[isa] = np.concatenate([sess.run(None, {"x": x})[0], sess.run(None, {"x": x[:1]})[0]])
    for isa in isas[1:]:
        diff = np.abs(ys["avx2"] - ys[isa]).max() / np.abs(ys["avx2"]).max()
        assert 0 < diff < 1e-6, isa  # different code (not one implementation twice), the same sums
    monkeypatch.setenv("EDGE_KERNELS_ISA", "sse2")
    assert kernels.isa() is None
    refused = r"EDGE_KERNELS_ISA=sse2 is not a MatMulQ4 .*\(it runs: [a-z0-9, ]+\); unset"
    with pytest.raises(KernelPinError, match=refused):
        _session(model)


@needs_kernels
@pytest.mark.parametrize("op", [kernels.MATMUL_Q4, kernels.MATMUL_Q8])
def test_amx_takes_calls_from_17_rows_and_leaves_fewer_to_the_vnni_code(op, monkeypatch):
    """The AMX implementation hands calls of up to 16 rows to the VNNI code (bit for bit its results, so
    decode and verification chunks are untouched) and runs tiles from 17 rows: different float order,
    the same int32 block sums."""
    if "amx" not in kernels.runnable():
        pytest.skip("this CPU (or its OS) does not run the AMX implementation")
    from .test_kernels_q8 import _graph as q8_graph
    from .test_kernels_q8 import _weights as q8_weights

    rng = np.random.default_rng(3)
    k, n = 1536, 100
    if op == kernels.MATMUL_Q4:
        b, s = _weights(rng, k, n)
        model = _graph(op, k, n, b, s.astype(np.float16), 2)
    else:
        model = q8_graph(op, k, n, *q8_weights(rng, k, n), 2)
    x = rng.standard_normal((40, k)).astype(np.float32)
    ys = {}
    for isa in ("avx512vnni", "amx"):
        monkeypatch.setenv("EDGE_KERNELS_ISA", isa)
        sess = _session(model)
        ys[isa] = {m: sess.run(None, {"x": x[:m]})[0] for m in (1, 9, 16, 17, 40)}
    for m in (1, 9, 16):
        np.testing.assert_array_equal(ys["amx"][m], ys["avx512vnni"][m])
    for m in (17, 40):
        diff = np.abs(ys["amx"][m] - ys["avx512vnni"][m]).max() / np.abs(ys["avx512vnni"][m]).max()
        assert 0 < diff < 1e-6, m


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_matmul_q4_argmax_output_is_numpys_argmax(isa, monkeypatch):
    """The optional second output: each row's first largest column (a NaN counting as largest)."""
    _pin_isa(monkeypatch, isa)
    rng = np.random.default_rng(11)
    k, n = 128, 4099  # 65 column tasks of 64: ties and maxima across task boundaries
    b, s = _weights(rng, k, n)
    b[[100, 3000, 4098]] = b[7]  # columns equal to column 7, in other tasks
    s[[100, 3000, 4098]] = s[7]
    graph = onnx.load_from_string(_graph("MatMulQ4", k, n, b, s.astype(np.float16), 2))
    graph.graph.node[0].output.append("am")
    graph.graph.output.append(helper.make_tensor_value_info("am", TensorProto.INT64, None))
    sess = _session(graph.SerializeToString())
    for m in (1, 5, 16):
        x = rng.standard_normal((m, k)).astype(np.float32)
        y, am = sess.run(None, {"x": x})
        assert am.shape == (m, 1) and am.dtype == np.int64
        np.testing.assert_array_equal(am[:, 0], y.argmax(-1))
    x = np.zeros((2, k), np.float32)  # every logit 0: the first column wins
    assert sess.run(None, {"x": x})[1][:, 0].tolist() == [0, 0]
    w7 = np.stack([(b[7] & 15), (b[7] >> 4)], axis=-1).reshape(k).astype(np.float32) - 8
    y, am = sess.run(None, {"x": w7[None]})  # x along column 7: it and its three copies tie at the top
    assert y[0, 7] == y[0, 100] == y[0, 3000] == y[0, 4098] == y.max() and am[0, 0] == 7
    assert sess.run(None, {"x": np.zeros((0, k), np.float32)})[1].shape == (0, 1)
    s[[50, 2000]] = np.nan  # NaN columns: numpy.argmax answers the first NaN, and so must the op
    graph = onnx.load_from_string(_graph("MatMulQ4", k, n, b, s.astype(np.float16), 2))
    graph.graph.node[0].output.append("am")
    graph.graph.output.append(helper.make_tensor_value_info("am", TensorProto.INT64, None))
    y, am = _session(graph.SerializeToString()).run(None, {"x": rng.standard_normal((3, k)).astype(np.float32)})
    assert np.isnan(y[:, 50]).all() and am[:, 0].tolist() == y.argmax(-1).tolist() == [50, 50, 50]


@needs_kernels
def test_matmul_q4_zero_rows_and_single_thread():
    rng = np.random.default_rng(1)
    b, s = _weights(rng, 128, 40)
    sess = _session(_graph("MatMulQ4", 128, 40, b, s, 3), threads=1)
    assert sess.run(None, {"x": np.zeros((1, 0, 128), np.float32)})[0].shape == (1, 0, 40)
    x = np.zeros((1, 2, 128), np.float32)  # all-zero blocks: scale 0, no division by zero
    assert not sess.run(None, {"x": x})[0].any()


@needs_kernels
def test_matmul_q4_refuses_bad_shapes_with_a_message():
    rng = np.random.default_rng(2)
    b, s = _weights(rng, 96, 8)
    with pytest.raises(Exception, match="multiple of 64"):
        _session(_graph("MatMulQ4", 96, 8, b, s, 2)).run(None, {"x": np.ones((1, 96), np.float32)})
    b, s = _weights(rng, 128, 8)
    sess = _session(_graph("MatMulQ4", 128, 8, b, s, 2, free_k=True))  # so the op itself sees the wrong K
    with pytest.raises(Exception, match="last dimension is not K"):
        sess.run(None, {"x": np.ones((1, 64), np.float32)})
    short = _graph("MatMulQ4", 128, 8, b[:4], s[:4], 2)  # B holds 4 rows, N says 8
    with pytest.raises(Exception, match="N x K/32 blocks"):
        _session(short).run(None, {"x": np.ones((1, 128), np.float32)})
    ints = _graph("MatMulQ4", 128, 8, b, s.astype(np.int32), 2)  # the scales input takes any type at load
    with pytest.raises(Exception, match="float16 or float"):
        _session(ints).run(None, {"x": np.ones((1, 128), np.float32)})


def _silu_session(width: int | str) -> ort.InferenceSession:
    graph = helper.make_graph(
        [helper.make_node(kernels.SILU_MUL, ["x"], ["y"], domain=kernels.DOMAIN)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1)]
    return _session(helper.make_model(graph, opset_imports=opsets).SerializeToString())


@needs_kernels
@pytest.mark.parametrize(("t", "width"), [(1, 3072), (5, 18), (128, 2 * 96), (0, 8)])
def test_silu_mul_is_silu_of_gate_times_up(t, width):
    rng = np.random.default_rng(t + width)
    x = (rng.standard_normal((1, t, width)) * 6).astype(np.float32)
    if t:
        x[0, 0, :4] = [90.0, -90.0, 0.0, -20.0]  # past exp's range both ways, and the origin
    y = _silu_session(width).run(None, {"x": x})[0]
    gate, up = np.split(x.astype(np.float64), 2, axis=-1)
    ref = gate / (1 + np.exp(-gate)) * up
    assert y.shape == ref.shape
    if t:
        assert np.abs(y - ref).max() / np.abs(ref).max() < 2e-7
        assert np.isfinite(y).all()


@needs_kernels
def test_silu_mul_refuses_an_odd_width():
    with pytest.raises(Exception, match="last dimension is odd"):
        _silu_session("W").run(None, {"x": np.ones((1, 2, 7), np.float32)})


def _cache_copies(op: str = kernels.LINEAR_ATTENTION) -> int:
    """Calls of attention op `op` in this process that copied a whole cache (present_* not on past_*)."""
    lib = ctypes.CDLL(str(kernels.library()))
    count = {kernels.LINEAR_ATTENTION: lib.edge_linear_attention_cache_copies,
             kernels.RING_ATTENTION: lib.edge_ring_attention_cache_copies}[op]  # fmt: skip
    count.restype = ctypes.c_int64
    return count()


def _attention_graph(op: str, hq: int, hkv: int, d: int) -> bytes:
    qkv = helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [1, "T", (hq + 2 * hkv) * d])
    caches = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, hkv, "C", d]) for n in ("pk", "pv")]
    seq = helper.make_tensor_value_info("seq", TensorProto.INT32, [1])
    trig = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["C", "R"]) for n in ("cos", "sin")]
    scale = float(1 / np.sqrt(d))
    if op == kernels.LINEAR_ATTENTION:
        domain, names, inputs = kernels.DOMAIN, ["qkv", "pk", "pv", "seq", "cos", "sin"], [qkv, *caches, seq, *trig]
        attrs = {"num_heads": hq, "kv_num_heads": hkv, "scale": scale}
    else:
        total = helper.make_tensor_value_info("tot", TensorProto.INT32, [])
        domain, names = "com.microsoft", ["qkv", "", "", "pk", "pv", "seq", "tot", "cos", "sin"]
        inputs = [qkv, *caches, seq, total, *trig]
        attrs = {"num_heads": hq, "kv_num_heads": hkv, "scale": scale, "do_rotary": 1, "rotary_interleaved": 0}
    node = helper.make_node(op, names, ["out", "k", "v"], domain=domain, **attrs)
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("out", "k", "v")]
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)]
    return helper.make_model(helper.make_graph([node], "g", inputs, outs), opset_imports=opsets).SerializeToString()


@needs_kernels
@pytest.mark.parametrize(
    ("hq", "hkv", "d", "capacity", "past", "t", "half"),
    [(9, 3, 64, 300, 200, 1, 32), (4, 2, 16, 64, 0, 7, 8), (32, 8, 64, 260, 100, 1, 32), (4, 2, 32, 64, 10, 5, 8)],
)
def test_linear_attention_is_group_query_attention(hq, hkv, d, capacity, past, t, half):
    """Decode and prefill, GQA grouping, partial rotary (half * 2 < d): the same out and new cache rows."""
    rng = np.random.default_rng(past + t)
    qkv = rng.standard_normal((1, t, (hq + 2 * hkv) * d)).astype(np.float32)
    pk, pv = (rng.standard_normal((1, hkv, capacity, d)).astype(np.float32) for _ in range(2))
    angles = np.arange(capacity)[:, None] * (10000.0 ** (-np.arange(half) / half))[None]
    feeds = {"qkv": qkv, "pk": pk, "pv": pv, "seq": np.array([past + t - 1], np.int32)}
    feeds |= {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    ours = _session(_attention_graph(kernels.LINEAR_ATTENTION, hq, hkv, d)).run(None, feeds)
    gqa = _session(_attention_graph("GroupQueryAttention", hq, hkv, d)).run(
        None, {**feeds, "tot": np.array(past + t, np.int32)}
    )
    assert np.abs(ours[0] - gqa[0]).max() / np.abs(gqa[0]).max() < 2e-6
    rows = slice(0, past + t)  # GroupQueryAttention leaves rows past the total length undefined
    for a, b in zip(ours[1:], gqa[1:], strict=True):
        assert np.abs(a[:, :, rows] - b[:, :, rows]).max() < 1e-5


@needs_kernels
@pytest.mark.parametrize("q8", [False, True])
@pytest.mark.parametrize(
    ("hq", "hkv", "d", "capacity", "past", "t"),
    [(9, 3, 64, 300, 150, 11), (4, 2, 80, 200, 60, 9), (4, 4, 16, 40, 0, 17), (4, 1, 32, 300, 150, 11)],
)
def test_linear_attention_chunk_is_its_rows_as_decode_steps_bit_for_bit(hq, hkv, d, capacity, past, t, q8):
    """A chunk's rows share each block of keys (csrc/attention_avx2.c) but compute what one-row calls do,
    bit for bit: speculative verification's greedy exactness rests on it. Contexts past one 64-key block,
    more rows than one call takes (8), a head size with a partial 64-wide value pass, fp32 and q8 caches."""
    from .test_kv_q8 import _q8_cache, quantize

    rng = np.random.default_rng(capacity + t)
    half = d // 4  # partial rotary
    qkv = rng.standard_normal((1, t, (hq + 2 * hkv) * d)).astype(np.float32)
    pk, pv = (rng.standard_normal((1, hkv, capacity, d)).astype(np.float32) for _ in range(2))
    if q8:
        pk, pv = quantize(pk), quantize(pv)
    angles = np.arange(capacity)[:, None] * (10000.0 ** (-np.arange(half) / half))[None]
    trig = {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    graph = _attention_graph(kernels.LINEAR_ATTENTION, hq, hkv, d)
    session = _session(_q8_cache(graph, d) if q8 else graph)
    out, keys, values = session.run(
        None, {"qkv": qkv, "pk": pk, "pv": pv, "seq": np.array([past + t - 1], np.int32)} | trig
    )
    rows, k, v = [], pk, pv
    for i in range(t):
        o, k, v = session.run(
            None, {"qkv": qkv[:, i : i + 1], "pk": k, "pv": v, "seq": np.array([past + i], np.int32)} | trig
        )
        rows.append(o)
    assert np.array_equal(np.concatenate(rows, axis=1), out)
    assert np.array_equal(k, keys) and np.array_equal(v, values)


@needs_kernels
def test_linear_attention_refuses_rows_outside_the_cache():
    feeds = {"qkv": np.zeros((1, 2, 4 * 16), np.float32), "pk": np.zeros((1, 1, 8, 16), np.float32)}
    feeds |= {"pv": np.zeros((1, 1, 8, 16), np.float32), "seq": np.array([8], np.int32)}
    feeds |= {"cos": np.ones((8, 8), np.float32), "sin": np.zeros((8, 8), np.float32)}
    session = _session(_attention_graph(kernels.LINEAR_ATTENTION, 2, 1, 16))
    with pytest.raises(Exception, match="outside the cache"):
        session.run(None, feeds)
    feeds["seq"] = np.array([1], np.int32)
    with pytest.raises(Exception, match="past_key and past_value"):  # would read past the smaller buffer
        session.run(None, {**feeds, "pv": np.zeros((1, 1, 4, 16), np.float32)})
