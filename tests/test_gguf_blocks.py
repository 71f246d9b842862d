"""GGUF blocks as stored (exporters/gguf_blocks.py) and the MatMulGGUF op that runs them (csrc/ggml_blocks.h).

The op reads every block type's bytes as gguf-py dequantizes them, bit for bit (its fp32_compute mode reads the
whole matrix back through identity rows), and its product equals a float64 product of those weights with the
int8-rounded activations to float32 accumulation, at every row count, each row equal to that row computed alone.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from onnx import TensorProto, helper, numpy_helper

from edge_runtime import kernels
from edge_runtime.errors import CorruptCheckpointError
from edge_runtime.exporters.gguf_blocks import BLOCK_TYPES, check, dequantize
from edge_runtime.exporters.reference import round_int8_blocks, round_llama_blocks

needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"{kernels.unavailable_reason()}")

# Byte offsets of each type's fp16 scales and minimums within a block.
_FP16_AT = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
            "Q5_K": (0, 2), "Q6_K": (208,)}  # fmt: skip


def _blocks(rng: np.random.Generator, name: str, n: int) -> np.ndarray:
    """n random blocks: random codes and sub-scales, fp16 scales/minimums of both signs over 1e-4..6e4 (the
    extremes of fp16 included), every seventh scale 0 and the last block all zero bytes."""
    t = BLOCK_TYPES[name]
    b = rng.integers(0, 256, (n, t.bytes), dtype=np.uint8)
    for at in _FP16_AT[name]:
        d = rng.standard_normal(n) * rng.choice([1e-4, 1e-2, 1.0, 100.0, 6e4], n)
        d = d.clip(-65504, 65504).astype(np.float16)
        d[::7] = 0
        b[:, at : at + 2] = d.view(np.uint8).reshape(n, 2)
    b[-1] = 0
    return b


def test_truncated_mislabelled_or_non_finite_blocks_are_refused_in_one_line():
    t = BLOCK_TYPES["Q4_K"]
    raw = _blocks(np.random.default_rng(0), "Q4_K", 4).reshape(2, -1)
    with pytest.raises(CorruptCheckpointError, match=r"^blk.0.w: 431 bytes where 2 x 512 Q4_K weights take 576 "):
        check(t, raw.reshape(-1)[:-145], (2, 512), "blk.0.w")
    with pytest.raises(CorruptCheckpointError, match="Q4_K weights take 288"):  # a Q4_0 tensor's bytes, say
        check(t, raw, (1, 512), "w")
    with pytest.raises(CorruptCheckpointError, match="rows of 320 are not whole blocks of 256"):
        check(t, raw, (2, 320), "w")
    bad = raw.copy()
    bad[1, 2:4] = np.array([np.inf], np.float16).view(np.uint8)  # the second row's dmin
    with pytest.raises(CorruptCheckpointError, match="a Q4_K block's dmin is not finite"):
        check(t, bad, (2, 512), "w")
    with pytest.raises(CorruptCheckpointError) as refused:
        check(t, raw.reshape(-1)[:10], (2, 512), "w")
    assert "\n" not in str(refused.value)


def _node_graph(k: int, n: int, ggml_type: int, raw: np.ndarray, **attrs: int) -> ort.InferenceSession:
    node = helper.make_node(
        kernels.MATMUL_GGUF, ["x", "B"], ["y"], domain=kernels.DOMAIN, K=k, N=n, type=ggml_type, **attrs
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", n])],
        [numpy_helper.from_array(raw, "B")],
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2  # the op's column tasks split between two threads
    so.log_severity_level = 3
    assert kernels.register(so)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1)]
    return ort.InferenceSession(helper.make_model(graph, opset_imports=opsets).SerializeToString(), so)


def _graph(name: str, k: int, n: int, raw: np.ndarray, **attrs: int) -> ort.InferenceSession:
    return _node_graph(k, n, BLOCK_TYPES[name].ggml_id, raw, **attrs)


def _llama_rows(x: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """x's rows as the op quantizes them, in float64: the codes times their scales (llama.cpp's Q8_0/Q8_1 rounding
    with fp16 scales under a legacy type, blocks of 32 with float32 scales under a K-quant: the reference's two, whose
    agreement with the op test_the_references_rounding_is_matmul_gguf_s checks alone), and per block of 32 Q8_1's
    code-sum term a minimum multiplies, fp16(unrounded scale * code sum)."""
    rounded = round_int8_blocks(x, 32) if name.endswith("_K") else round_llama_blocks(x)
    xb = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(axis=-1)
    d = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    sums = np.rint(xb * inv[..., None]).sum(axis=-1).astype(np.float32)
    return rounded.astype(np.float64), (d * sums).astype(np.float16).astype(np.float64)


def _minimums(name: str, raw: np.ndarray) -> np.ndarray:
    """Q4_1/Q5_1: each block's fp16 minimum [N, K / 32] (the term Q8_1's code sums meet); other types: none."""
    if name not in ("Q4_1", "Q5_1"):
        return np.zeros((raw.shape[0], 0))
    t = BLOCK_TYPES[name]
    blocks = raw.reshape(raw.shape[0], -1, t.bytes)
    return np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0].astype(np.float64)


_SHAPES = [(name, k) for name in sorted(BLOCK_TYPES) for k in ((1536,) if name.endswith("_K") else (1088, 96))]


@needs_kernels
@pytest.mark.parametrize(("name", "k"), _SHAPES)
def test_matmul_gguf_is_the_dequantized_weights_times_llama_cpp_s_int8_rows(name, k):
    """1..64 rows against 70 columns of K = 1536 (K-quants: 6 super-blocks), 1088 (17 pairs of blocks, one past
    a K chunk) or 96 (3 blocks: half a pair at the end, as tiny models have): within float32 accumulation of the
    float64 product, relative to the sum of the terms' magnitudes (the random extreme scales make sums that
    cancel), and every row as that row alone."""
    t = BLOCK_TYPES[name]
    rng = np.random.default_rng(100 + t.ggml_id)
    n = 70
    raw = _blocks(rng, name, n * k // t.elements).reshape(n, -1)
    w = dequantize(t, raw, (n, k)).astype(np.float64)
    session = _graph(name, k, n, raw)
    for m in (1, 2, 3, 4, 5, 8, 13, 64):
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[0, :32] = 0  # an all-zero activation block
        y = session.run(None, {"x": x})[0]
        xr, term = _llama_rows(x, name)
        mins = _minimums(name, raw)
        if mins.size:  # the minimum meets Q8_1's rounded code-sum term, d * q (exact) the codes
            zero_min = raw.reshape(n, -1, t.bytes).copy()
            zero_min[..., 2:4] = 0
            wq = dequantize(t, zero_min.reshape(n, -1), (n, k)).astype(np.float64)
            want, size = xr @ wq.T + term @ mins.T, np.abs(xr) @ np.abs(wq).T + np.abs(term) @ np.abs(mins).T
        else:
            want, size = xr @ w.T, np.abs(xr) @ np.abs(w).T
        err = np.abs(y - want) / (size + 1e-30)
        assert err.max() < 1e-6, (m, err.max())
        alone = np.concatenate([session.run(None, {"x": x[i : i + 1]})[0] for i in range(m)])
        assert np.array_equal(y, alone), m


@needs_kernels
@pytest.mark.parametrize(("name", "k"), _SHAPES)
def test_the_avx2_and_vnni_implementations_give_the_same_bits(name, k, monkeypatch):
    """The two implementations form the same int32 block sums (VNNI's Q8_0 codes plus 128, then 128 times the
    activation code sums off; AVX2's |w| against a with w's sign) and the same float work after them."""
    runs = [isa for isa in ("avx2", "avx512vnni") if isa in kernels.runnable()]
    if len(runs) < 2:
        pytest.skip(f"this CPU runs {runs}: nothing to compare")
    t = BLOCK_TYPES[name]
    rng = np.random.default_rng(300 + t.ggml_id)
    n = 37
    raw = _blocks(rng, name, n * k // t.elements).reshape(n, -1)
    x = rng.standard_normal((13, k)).astype(np.float32)
    ys = {}
    for isa in runs:
        monkeypatch.setenv("EDGE_KERNELS_ISA", isa)
        session = _graph(name, k, n, raw)
        ys[isa] = [session.run(None, {"x": x[:m]})[0] for m in (1, 5, 13)]
    for a, b in zip(*ys.values(), strict=True):
        np.testing.assert_array_equal(a, b)


@needs_kernels
@pytest.mark.parametrize(("name", "k"), _SHAPES)
def test_matmul_gguf_fp32_compute_is_the_dequantized_weights_times_float_rows(name, k):
    """fp32_compute=1 (the export's accuracy_level 0 twin): float activations against weights formed as gguf-py
    forms them, so the product is the float64 one to float32 accumulation."""
    t = BLOCK_TYPES[name]
    rng = np.random.default_rng(200 + t.ggml_id)
    n = 70
    raw = _blocks(rng, name, n * k // t.elements).reshape(n, -1)
    w = dequantize(t, raw, (n, k))
    session = _graph(name, k, n, raw, fp32_compute=1)
    for m in (1, 3, 8, 13):
        x = rng.standard_normal((m, k)).astype(np.float32)
        y = session.run(None, {"x": x})[0]
        err = np.abs(y - x.astype(np.float64) @ w.T.astype(np.float64)) / (np.abs(x) @ np.abs(w).T + 1e-30)
        assert err.max() < 1e-6, (m, err.max())


@needs_kernels
@pytest.mark.parametrize("name", sorted(BLOCK_TYPES))
def test_the_op_reads_every_block_as_gguf_py_does_bit_for_bit(name):
    """Identity rows through fp32_compute=1 read the whole matrix back: each weight the op forms equals
    gguf.quants.dequantize's (random blocks: scales and minimums of both signs over 1e-4..6e4, zeros, a zero
    block). A sum of one exact product and zeros is that product, so nothing but the op's reading is tested."""
    t = BLOCK_TYPES[name]
    rng = np.random.default_rng(t.ggml_id)
    k, n = 3 * t.elements, 7
    raw = _blocks(rng, name, n * 3).reshape(n, -1)
    want = gguf_dequantize(raw, GGMLQuantizationType[name]).astype(np.float32)
    assert want.shape == (n, k)
    back = _graph(name, k, n, raw, fp32_compute=1).run(None, {"x": np.eye(k, dtype=np.float32)})[0].T
    assert np.array_equal(back, want)  # -0.0 may come back +0.0 (a sum with zeros): equal values
    assert (back[-1, -t.elements :] == 0).all()  # the zero block


@needs_kernels
def test_matmul_gguf_refuses_wrong_bytes_and_types_with_a_message():
    raw = _blocks(np.random.default_rng(1), "Q6_K", 8).reshape(4, -1)
    q6k = BLOCK_TYPES["Q6_K"].ggml_id
    with pytest.raises(Exception, match="MatMulGGUF: B or scales do not hold N rows of K / block GGUF blocks"):
        _node_graph(512, 5, q6k, raw).run(None, {"x": np.ones((1, 512), np.float32)})  # 4 rows, N says 5
    with pytest.raises(Exception, match="type 15 is not an executed GGUF block type, or K is not a multiple"):
        _node_graph(512, 4, 15, raw)  # ggml's Q8_K: llama.cpp's activation format, not a weight type here
    with pytest.raises(Exception, match="type 14 is not an executed GGUF block type, or K is not a multiple"):
        _node_graph(320, 4, q6k, raw)  # 320 is not whole super-blocks of 256


@needs_kernels
def test_matmul_gguf_nan_activations_reach_the_output():
    """A non-finite activation makes its row's products NaN (quad.h's quantize_block), never finite garbage."""
    raw = _blocks(np.random.default_rng(2), "Q4_K", 8).reshape(4, -1)
    x = np.ones((2, 512), np.float32)
    x[1, 300] = np.nan
    y = _graph("Q4_K", 512, 4, raw).run(None, {"x": x})[0]
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all()


def _gather(name: str, k: int, raw: np.ndarray) -> ort.InferenceSession:
    node = helper.make_node(
        kernels.GATHER_GGUF, ["table", "ids"], ["rows"], domain=kernels.DOMAIN, K=k, type=BLOCK_TYPES[name].ggml_id
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "T"])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [1, "T", k])],
        [numpy_helper.from_array(raw, "table")],
    )
    so = ort.SessionOptions()
    so.log_severity_level = 3
    assert kernels.register(so)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1)]
    return ort.InferenceSession(helper.make_model(graph, opset_imports=opsets).SerializeToString(), so)


@needs_kernels
@pytest.mark.parametrize("name", sorted(BLOCK_TYPES))
def test_gather_gguf_rows_are_gguf_py_s_bit_for_bit(name):
    """GatherGGUF (an embedding over the LM head's GGUF bytes) gives each row as gguf.quants.dequantize does, in
    any order and repeated, the zero block included; an index outside the table is refused in one line."""
    t = BLOCK_TYPES[name]
    rng = np.random.default_rng(100 + t.ggml_id)
    k, n = 3 * t.elements, 9
    raw = _blocks(rng, name, n * 3).reshape(n, -1)
    want = gguf_dequantize(raw, GGMLQuantizationType[name]).astype(np.float32)
    ids = np.array([[8, 0, 3, 3, 7]], np.int64)
    session = _gather(name, k, raw)
    got = session.run(None, {"ids": ids})[0]
    assert got.shape == (1, 5, k)
    assert np.array_equal(got[0], want[ids[0]]) and np.array_equal(np.signbit(got[0]), np.signbit(want[ids[0]]))
    assert np.array_equal(session.run(None, {"ids": ids[:, 2:3]})[0][0, 0], want[3])  # one row: the decode path
    with pytest.raises(Exception, match="index 9 is outside the table's 9 rows"):
        session.run(None, {"ids": np.array([[1, 9]], np.int64)})


@needs_kernels
@pytest.mark.parametrize("name", ["Q8_0", "Q5_0", "Q4_K", "Q6_K"])
def test_the_references_rounding_is_matmul_gguf_s(name):
    """The int8 probe's rounding of a MatMulGGUF input (exporters/reference.py, which sets an export's tolerance) is
    the op's: llama.cpp's Q8_0 blocks (fp16 scales, round_llama_blocks) under a legacy type, blocks of 32 with float32
    scales (round_int8_blocks) under a K-quant; and the two are measurably apart."""
    t = BLOCK_TYPES[name]
    rng = np.random.default_rng(11)
    k, n = 512, 40
    raw = _blocks(rng, name, n * k // t.elements).reshape(n, -1)
    w = dequantize(t, raw, (n, k)).astype(np.float64)
    x = rng.standard_normal((6, k)).astype(np.float32)
    x[:, :32] *= 40
    x[2, 256:] = 0.0  # blocks of zeros
    y = _graph(name, k, n, raw).run(None, {"x": x})[0]
    size = np.abs(x).astype(np.float64) @ np.abs(w).T + 1e-30
    legacy, int8 = round_llama_blocks(x).astype(np.float64) @ w.T, round_int8_blocks(x, 32).astype(np.float64) @ w.T
    ours, other = (int8, legacy) if name.endswith("_K") else (legacy, int8)
    assert (np.abs(y - ours) / size).max() < 2e-6
    assert (np.abs(y - other) / size).max() > 1e-4
