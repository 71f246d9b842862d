"""ai.edge_runtime::RingAttention (csrc/ring_attention.h): the full ring's attention in one node. Checked
against a float64 transcription of its formula, for row-by-row exactness (a T-row call is T one-row calls
bit for bit, and while the ring is linear it is LinearAttention bit for bit; given ring_full off, it computes as
LinearAttention), for its refusals, and for
writing the cache in place when its outputs are bound to its inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edge_runtime import kernels
from edge_runtime.ring import MASKED

from .test_kernels import _attention_graph, _cache_copies, _session, needs_kernels

pytestmark = needs_kernels

NAMES = ["qkv", "pk", "pv", "write_index", "cos", "sin", "cos_sink", "sin_sink", "sink_rows", "mask"]


def _ring_graph(
    hq: int, hkv: int, d: int, *, mask_rank: int = 2, batched: bool = False, by_fill: bool = False
) -> bytes:
    """`batched`: the optional row_cache input too (past_* then hold a batch of caches). `by_fill`: the linear
    ring's optional inputs too (ring_full, seqlens_k, cos_cache, sin_cache)."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    names = [*NAMES, "row_cache"] if batched else NAMES
    if by_fill:
        names = [*names, *([] if batched else [""]), "ring_full", "seq", "cos_cache", "sin_cache"]
    inputs = [
        helper.make_tensor_value_info("qkv", f, [1, "T", "W"]),
        *(helper.make_tensor_value_info(n, f, [1, "H", "C", "D"]) for n in ("pk", "pv")),
        helper.make_tensor_value_info("write_index", i64, ["one"]),  # free: the op's own check is tested
        *(helper.make_tensor_value_info(n, f, ["T", "R"]) for n in ("cos", "sin", "cos_sink", "sin_sink")),
        helper.make_tensor_value_info("sink_rows", i64, ["one"]),
        helper.make_tensor_value_info("mask", f, ["T", "C"] if mask_rank == 2 else [1, 1, "T", "C"]),
    ]
    if batched:
        inputs[1:3] = [helper.make_tensor_value_info(n, f, ["B", "H", "C", "D"]) for n in ("pk", "pv")]
        inputs.append(helper.make_tensor_value_info("row_cache", i64, ["rows"]))
    if by_fill:
        inputs += [
            helper.make_tensor_value_info("ring_full", TensorProto.BOOL, []),
            helper.make_tensor_value_info("seq", TensorProto.INT32, [1]),
            *(helper.make_tensor_value_info(n, f, ["C", "R"]) for n in ("cos_cache", "sin_cache")),
        ]
    attrs = {"num_heads": hq, "kv_num_heads": hkv, "scale": float(1 / np.sqrt(d))}
    node = helper.make_node(kernels.RING_ATTENTION, names, ["out", "k", "v"], domain=kernels.DOMAIN, **attrs)
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("out", "k", "v")]
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1)]
    return helper.make_model(helper.make_graph([node], "g", inputs, outs), opset_imports=opsets).SerializeToString()


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Half-split RoPE on the first 2 * R/2 dims of x [T, H, D] with cos/sin [T, R/2]."""
    half = cos.shape[1]
    c, s = cos[:, None, :], sin[:, None, :]
    a, b = x[..., :half], x[..., half : 2 * half]
    y = x.copy()
    y[..., :half], y[..., half : 2 * half] = a * c - b * s, b * c + a * s
    return y


def reference(feeds: dict[str, np.ndarray], hq: int, hkv: int) -> tuple[np.ndarray, ...]:
    """The op's formula in float64: (out, present_key, present_value)."""
    f = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()}
    keys, values = f["pk"][0].copy(), f["pv"][0].copy()  # [Hkv, C, D]
    _, cap, d = keys.shape
    t = f["qkv"].shape[1]
    x = f["qkv"][0].reshape(t, hq + 2 * hkv, d)
    q, k, v = x[:, :hq], x[:, hq : hq + hkv], x[:, hq + hkv :]
    w = int(feeds["write_index"][0])
    keys[:, w : w + t] = _rope(k, f["cos"], f["sin"]).transpose(1, 0, 2)
    values[:, w : w + t] = v.transpose(1, 0, 2)
    group = hq // hkv
    kq, vq = np.repeat(keys, group, axis=0), np.repeat(values, group, axis=0)  # [Hq, C, D]
    window = np.einsum("thd,hcd->thc", _rope(q, f["cos"], f["sin"]), kq)
    sink = np.einsum("thd,hcd->thc", _rope(q, f["cos_sink"], f["sin_sink"]), kq)
    scores = np.where(np.arange(cap) < int(feeds["sink_rows"][0]), sink, window) / np.sqrt(d)
    scores = scores + f["mask"].reshape(t, cap)[:, None, :]
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("thc,hcd->thd", p, vq).reshape(1, t, hq * d)
    return out, keys[None], values[None]


def _angles(rng, t: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    a = rng.uniform(-np.pi, np.pi, (t, half))
    return np.cos(a).astype(np.float32), np.sin(a).astype(np.float32)


def _feeds(rng, hq, hkv, d, cap, sinks, t, half, write, *, hide_later_rows: bool = False) -> dict[str, np.ndarray]:
    """Random inputs; ~30% of the columns masked, a few softly biased, each row's own new row visible.
    `hide_later_rows`: row i does not see rows write + j, j > i (as ring.plan guarantees), so the call is
    also a sequence of one-row calls."""
    feeds = {"qkv": rng.standard_normal((1, t, (hq + 2 * hkv) * d)).astype(np.float32)}
    feeds |= {n: rng.standard_normal((1, hkv, cap, d)).astype(np.float32) for n in ("pk", "pv")}
    feeds["cos"], feeds["sin"] = _angles(rng, t, half)
    feeds["cos_sink"], feeds["sin_sink"] = _angles(rng, t, half)
    mask = np.where(rng.random((t, cap)) < 0.3, MASKED, 0.0)
    mask = np.where(rng.random((t, cap)) < 0.1, -rng.uniform(0, 3, (t, cap)), mask)
    mask[np.arange(t), write + np.arange(t)] = 0.0
    if hide_later_rows:
        for i in range(t):
            mask[i, write + i + 1 : write + t] = MASKED
    feeds["mask"] = mask.astype(np.float32)
    feeds["write_index"] = np.array([write], np.int64)
    feeds["sink_rows"] = np.array([sinks], np.int64)
    return feeds


# (hq, hkv, d, capacity, sinks, T, rot_half, write_index): decode and chunks, GQA ratios 3, 2, 4 and 1,
# partial rotary (2 * rot_half < d), no sinks, sinks that split a four-key group, rows written at the end.
CASES = [
    (9, 3, 64, 300, 4, 1, 32, 150),
    (4, 2, 16, 40, 4, 7, 8, 20),
    (4, 1, 32, 37, 0, 5, 8, 32),
    (8, 8, 128, 70, 3, 9, 24, 61),
    (6, 2, 72, 29, 5, 3, 20, 0),
    (4, 1, 32, 160, 4, 3, 8, 120),  # one KV head: its query heads share blocks of 64 columns (ring_heads)
]


@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "sinks", "t", "half", "write"), CASES)
def test_ring_attention_is_the_formula(hq, hkv, d, cap, sinks, t, half, write):
    rng = np.random.default_rng(cap + t)
    feeds = _feeds(rng, hq, hkv, d, cap, sinks, t, half, write)
    ours = _session(_ring_graph(hq, hkv, d)).run(None, feeds)
    want = reference(feeds, hq, hkv)
    assert ours[0].shape == want[0].shape
    assert np.abs(ours[0] - want[0]).max() / np.abs(want[0]).max() < 1e-5
    kept = np.ones(cap, bool)
    kept[write : write + t] = False
    for a, b, past in zip(ours[1:], want[1:], (feeds["pk"], feeds["pv"]), strict=True):
        assert np.abs(a - b).max() < 1e-5
        assert np.array_equal(a[:, :, kept], past[:, :, kept])  # only the new rows written
    four = {**feeds, "mask": feeds["mask"].reshape(1, 1, t, cap)}  # the [1, 1, T, C] form of the mask
    assert np.array_equal(_session(_ring_graph(hq, hkv, d, mask_rank=4)).run(None, four)[0], ours[0])


def test_a_fully_masked_row_outputs_zeros():
    rng = np.random.default_rng(3)
    feeds = _feeds(rng, 4, 2, 16, 12, 2, 2, 8, 4)
    feeds["mask"][1] = MASKED
    out = _session(_ring_graph(4, 2, 16)).run(None, feeds)[0]
    assert np.array_equal(out[0, 1], np.zeros(4 * 16, np.float32))
    assert np.abs(out[0, 0] - reference(feeds, 4, 2)[0][0, 0]).max() < 1e-5


def _one_row(feeds: dict[str, np.ndarray], i: int, pk: np.ndarray, pv: np.ndarray) -> dict[str, np.ndarray]:
    row = {n: feeds[n][i : i + 1] for n in ("cos", "sin", "cos_sink", "sin_sink", "mask")}
    row["qkv"] = feeds["qkv"][:, i : i + 1]
    row["write_index"] = feeds["write_index"] + i
    return {**row, "pk": pk, "pv": pv, "sink_rows": feeds["sink_rows"]}


@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "sinks", "t", "half", "write"), CASES[1:])
def test_a_chunk_is_its_rows_as_one_row_calls_bit_for_bit(hq, hkv, d, cap, sinks, t, half, write):
    rng = np.random.default_rng(7 * cap + t)
    feeds = _feeds(rng, hq, hkv, d, cap, sinks, t, half, write, hide_later_rows=True)
    session = _session(_ring_graph(hq, hkv, d))
    out, keys, values = session.run(None, feeds)
    rows, pk, pv = [], feeds["pk"], feeds["pv"]
    for i in range(t):
        o, pk, pv = session.run(None, _one_row(feeds, i, pk, pv))
        rows.append(o)
    assert np.array_equal(np.concatenate(rows, axis=1), out)
    assert np.array_equal(pk, keys) and np.array_equal(pv, values)


LINEAR_CASES = [
    (9, 3, 64, 90, 4, 37, 6, 32),
    (4, 2, 16, 40, 0, 0, 9, 8),
    (4, 1, 32, 30, 3, 10, 5, 8),
    (4, 1, 32, 200, 4, 140, 3, 8),
]


@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "sinks", "past", "t", "half"), LINEAR_CASES)
def test_on_a_linear_ring_it_is_linear_attention_bit_for_bit(hq, hkv, d, cap, sinks, past, t, half):
    """Row r = token r, every written row visible, cos_sink = cos (ring.plan before S + W - 1): a chunk that
    crosses into the full ring computes its still-linear rows as the LinearAttention decode steps did."""
    rng = np.random.default_rng(past + t)
    qkv = rng.standard_normal((1, t, (hq + 2 * hkv) * d)).astype(np.float32)
    pk, pv = (rng.standard_normal((1, hkv, cap, d)).astype(np.float32) for _ in range(2))
    angles = np.arange(cap)[:, None] * (10000.0 ** (-np.arange(half) / half))[None]
    cos_cache, sin_cache = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    linear = {"qkv": qkv, "pk": pk, "pv": pv, "seq": np.array([past + t - 1], np.int32)}
    want = _session(_attention_graph(kernels.LINEAR_ATTENTION, hq, hkv, d)).run(
        None, {**linear, "cos": cos_cache, "sin": sin_cache}
    )
    rows = slice(past, past + t)
    causal = np.arange(cap)[None, :] <= np.arange(past, past + t)[:, None]
    ring = {"qkv": qkv, "pk": pk, "pv": pv, "write_index": np.array([past], np.int64)}
    ring |= {"cos": cos_cache[rows], "sin": sin_cache[rows], "cos_sink": cos_cache[rows], "sin_sink": sin_cache[rows]}
    ring |= {"sink_rows": np.array([max(sinks, 1)], np.int64), "mask": np.where(causal, 0.0, MASKED).astype(np.float32)}
    got = _session(_ring_graph(hq, hkv, d)).run(None, ring)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "sinks", "past", "t", "half"), LINEAR_CASES)
def test_with_ring_full_off_it_computes_linear_attention_and_with_it_on_the_ring(hq, hkv, d, cap, sinks, past, t, half):
    """The graphs' one attention node a layer (no If): given ring_full, seqlens_k and the rotary cache, RingAttention
    is LinearAttention bit for bit while ring_full is false (its ring inputs unread: here all masked, angles
    garbage), and the plain RingAttention bit for bit once it is true (ring inputs of the same linear ring: then
    LinearAttention's result again)."""
    rng = np.random.default_rng(past + t + 1)
    qkv = rng.standard_normal((1, t, (hq + 2 * hkv) * d)).astype(np.float32)
    pk, pv = (rng.standard_normal((1, hkv, cap, d)).astype(np.float32) for _ in range(2))
    angles = np.arange(cap)[:, None] * (10000.0 ** (-np.arange(half) / half))[None]
    cos_cache, sin_cache = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    seq = np.array([past + t - 1], np.int32)
    want_linear = _session(_attention_graph(kernels.LINEAR_ATTENTION, hq, hkv, d)).run(
        None, {"qkv": qkv, "pk": pk, "pv": pv, "seq": seq, "cos": cos_cache, "sin": sin_cache}
    )
    garbage = {n: rng.standard_normal((t, half)).astype(np.float32) for n in ("cos", "sin", "cos_sink", "sin_sink")}
    ring = {"qkv": qkv, "pk": pk, "pv": pv, "write_index": np.array([past], np.int64), **garbage}
    ring |= {"sink_rows": np.array([max(sinks, 1)], np.int64), "mask": np.full((t, cap), MASKED, np.float32)}
    linear = {"seq": seq, "cos_cache": cos_cache, "sin_cache": sin_cache}
    both = _session(_ring_graph(hq, hkv, d, by_fill=True))
    got = both.run(None, {**ring, **linear, "ring_full": np.array(False)})
    for a, b in zip(got, want_linear, strict=True):
        assert np.array_equal(a, b)
    rows = slice(past, past + t)
    causal = np.arange(cap)[None, :] <= np.arange(past, past + t)[:, None]
    ring |= {n: cos_cache[rows] for n in ("cos", "cos_sink")} | {n: sin_cache[rows] for n in ("sin", "sin_sink")}
    ring["mask"] = np.where(causal, 0.0, MASKED).astype(np.float32)
    want_ring = _session(_ring_graph(hq, hkv, d)).run(None, ring)
    got = both.run(None, {**ring, **linear, "ring_full": np.array(True)})
    for a, b, c in zip(got, want_ring, want_linear, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)


def test_ring_full_comes_with_the_linear_inputs_and_a_batch_needs_it_on():
    hq, hkv, d, cap, t = 4, 2, 16, 12, 1
    rng = np.random.default_rng(0)
    feeds = {"qkv": rng.standard_normal((1, t, (hq + 2 * hkv) * d)).astype(np.float32)}
    feeds |= {n: np.zeros((2, hkv, cap, d), np.float32) for n in ("pk", "pv")}
    feeds |= {n: np.ones((t, 4), np.float32) for n in ("cos", "sin", "cos_sink", "sin_sink")}
    feeds |= {"write_index": np.array([0], np.int64), "sink_rows": np.array([1], np.int64)}
    feeds |= {"mask": np.zeros((t, cap), np.float32), "row_cache": np.array([1], np.int64)}
    feeds |= {"seq": np.array([0], np.int32), "ring_full": np.array(False)}
    feeds |= {n: np.ones((cap, 4), np.float32) for n in ("cos_cache", "sin_cache")}
    with pytest.raises(Exception, match="a batch \\(row_cache\\) needs ring_full on"):
        _session(_ring_graph(hq, hkv, d, batched=True, by_fill=True)).run(None, feeds)
    node = helper.make_node(kernels.RING_ATTENTION, [*NAMES, "", "ring_full"], ["out", "k", "v"],
                            domain=kernels.DOMAIN, num_heads=hq, kv_num_heads=hkv, scale=0.25)  # fmt: skip
    model = onnx.load_model_from_string(_ring_graph(hq, hkv, d))
    model.graph.input.append(helper.make_tensor_value_info("ring_full", TensorProto.BOOL, []))
    del model.graph.node[:]
    model.graph.node.append(node)
    one = {k: v[:1] if k in ("pk", "pv") else v for k, v in feeds.items() if k in (*NAMES, "ring_full")}
    with pytest.raises(Exception, match="ring_full must hold one value and come with seqlens_k"):
        _session(model.SerializeToString()).run(None, one)


def test_ring_attention_refuses_bad_inputs_with_a_message():
    rng = np.random.default_rng(0)
    good = _feeds(rng, 2, 1, 16, 8, 2, 2, 8, 3)
    session = _session(_ring_graph(2, 1, 16))
    session.run(None, good)
    bad = [
        ({"write_index": np.array([7], np.int64)}, "write_index puts the new rows outside the cache"),
        ({"write_index": np.array([-1], np.int64)}, "write_index puts the new rows outside the cache"),
        ({"sink_rows": np.array([9], np.int64)}, "sink_rows is outside the cache"),
        ({"pv": np.zeros((1, 1, 6, 16), np.float32)}, "past_key, past_value of one shape"),
        ({"pk": np.zeros((1, 2, 8, 16), np.float32), "pv": np.zeros((1, 2, 8, 16), np.float32)}, "kv_num_heads"),
        ({"qkv": np.zeros((1, 2, 5 * 16), np.float32)}, "qkv width"),
        ({"mask": np.zeros((2, 7), np.float32)}, r"attn_mask must be \[T, C\]"),
        ({"cos_sink": np.zeros((2, 4), np.float32)}, "cos, sin, cos_sink and sin_sink"),
        ({n: np.zeros((2, 9), np.float32) for n in ("cos", "sin", "cos_sink", "sin_sink")}, "R <= D"),
        ({"write_index": np.array([1, 2], np.int64)}, "write_index one"),
    ]
    for change, message in bad:
        with pytest.raises(Exception, match=message):
            session.run(None, {**good, **change})
    odd = _feeds(rng, 2, 1, 12, 8, 2, 2, 4, 3)  # D = 12: not a multiple of 8
    with pytest.raises(Exception, match="multiple of 8"):
        _session(_ring_graph(2, 1, 12)).run(None, odd)


def test_ring_attention_writes_bound_outputs_in_place():
    hq, hkv, d, cap, t, write = 4, 2, 32, 50, 3, 40
    rng = np.random.default_rng(11)
    feeds = _feeds(rng, hq, hkv, d, cap, 4, t, 8, write)
    session = _session(_ring_graph(hq, hkv, d))
    before = _cache_copies(kernels.RING_ATTENTION)
    want = session.run(None, feeds)
    assert _cache_copies(kernels.RING_ATTENTION) == before + 1  # outputs ORT allocated: the cache was copied
    pk, pv = feeds["pk"].copy(), feeds["pv"].copy()
    io = session.io_binding()
    for name in NAMES:
        if name not in ("pk", "pv"):
            io.bind_cpu_input(name, feeds[name])
    k_ov, v_ov = ort.OrtValue.ortvalue_from_numpy(pk), ort.OrtValue.ortvalue_from_numpy(pv)
    io.bind_ortvalue_input("pk", k_ov)
    io.bind_ortvalue_input("pv", v_ov)
    io.bind_output("out")  # outputs come back in binding order
    io.bind_ortvalue_output("k", k_ov)
    io.bind_ortvalue_output("v", v_ov)
    session.run_with_iobinding(io)
    assert _cache_copies(kernels.RING_ATTENTION) == before + 1  # no copy this time
    assert np.array_equal(io.copy_outputs_to_cpu()[0], want[0])
    assert np.array_equal(pk, want[1]) and np.array_equal(pv, want[2])  # the bound arrays themselves
    changed = np.flatnonzero(np.abs(pk - feeds["pk"]).sum(axis=(0, 1, 3)))
    assert changed.tolist() == list(range(write, write + t))


@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "sinks", "half"), [(9, 3, 64, 300, 4, 32), (4, 1, 32, 37, 0, 8)])
def test_a_batch_of_caches_is_each_row_alone_bit_for_bit(hq, hkv, d, cap, sinks, half):
    """row_cache: row i is a token of cache row_cache[i] (in any order, some caches left out), written at its own
    row; its output and its cache's new rows equal the row run alone on that cache, and the other rows stay."""
    rng = np.random.default_rng(cap)
    caches, order = 5, [3, 0, 4]  # cache 1 and 2 sit this step out
    batch_k, batch_v = (rng.standard_normal((caches, hkv, cap, d)).astype(np.float32) for _ in range(2))
    writes = [cap - 1, 0, cap // 2]
    rows = [_feeds(rng, hq, hkv, d, cap, sinks, 1, half, w) for w in writes]
    feeds = {
        n: np.concatenate([r[n] for r in rows], axis=1 if n == "qkv" else 0)
        for n in rows[0]
        if n not in ("pk", "pv", "write_index", "sink_rows")
    }
    feeds |= {"pk": batch_k.copy(), "pv": batch_v.copy(), "sink_rows": rows[0]["sink_rows"]}
    feeds |= {"write_index": np.array(writes, np.int64), "row_cache": np.array(order, np.int64)}
    out, keys, values = _session(_ring_graph(hq, hkv, d, batched=True)).run(None, feeds)
    alone = _session(_ring_graph(hq, hkv, d))
    for i, (c, row) in enumerate(zip(order, rows, strict=True)):
        one = {**row, "pk": batch_k[c : c + 1].copy(), "pv": batch_v[c : c + 1].copy()}
        want = alone.run(None, one)
        assert np.array_equal(out[0, i], want[0][0, 0])
        assert np.array_equal(keys[c], want[1][0]) and np.array_equal(values[c], want[2][0])
    for c in (1, 2):
        assert np.array_equal(keys[c], batch_k[c]) and np.array_equal(values[c], batch_v[c])
    for change, message in [
        ({"row_cache": np.array([3, 0, 5], np.int64)}, "outside the batch"),
        ({"write_index": np.array([0, 0, cap], np.int64)}, "outside the batch"),
        ({"row_cache": np.array([3, 3, 4], np.int64), "write_index": np.array([1, 1, 2], np.int64)}, "one buffer row"),
        ({"row_cache": np.array([3, 0], np.int64)}, "T with row_cache"),
    ]:
        with pytest.raises(Exception, match=message):
            _session(_ring_graph(hq, hkv, d, batched=True)).run(None, {**feeds, **change})
