"""An fp16 KV cache (`edge-export --kv-dtype fp16`, --kernel edge): LinearAttention and RingAttention read
fp16 rows and write the new ones rounded to fp16, computing in fp32 as with an fp32 cache.

The kernels are checked against themselves with an fp32 cache holding the same fp16-rounded rows: bit for
bit where the new rows are fp16-representable after RoPE, to the rounding of the new rows otherwise."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from edge_runtime import kernels

from .test_kernels import _attention_graph, _session, needs_kernels
from .test_ring_attention import CASES, _feeds, _ring_graph

pytestmark = needs_kernels


def _f16_cache(model: bytes, names: tuple[str, ...] = ("pk", "pv", "k", "v")) -> bytes:
    """The same one-node graph with its cache inputs and outputs typed float16."""
    m = onnx.load_from_string(model)
    for vi in [*m.graph.input, *m.graph.output]:
        if vi.name in names:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    return m.SerializeToString()


def _half(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`feeds` with the caches as float16 (the fp32 op then gets them widened back: the same values)."""
    return {**feeds, "pk": feeds["pk"].astype(np.float16), "pv": feeds["pv"].astype(np.float16)}


def _widened(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**feeds, "pk": feeds["pk"].astype(np.float32), "pv": feeds["pv"].astype(np.float32)}


def _linear_feeds(rng, hq, hkv, d, cap, past, t, half, *, identity_rope: bool) -> dict[str, np.ndarray]:
    qkv = rng.standard_normal((1, t, (hq + 2 * hkv) * d)).astype(np.float32)
    if identity_rope:  # cos 1, sin 0: the new rows are their fp16-representable inputs, so no rounding at all
        qkv = qkv.astype(np.float16).astype(np.float32)
        angles = np.zeros((cap, half))
    else:
        angles = np.arange(cap)[:, None] * (10000.0 ** (-np.arange(half) / half))[None]
    feeds = {"qkv": qkv, "seq": np.array([past + t - 1], np.int32)}
    feeds |= {n: rng.standard_normal((1, hkv, cap, d)).astype(np.float16) for n in ("pk", "pv")}
    return feeds | {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}


def _check(got: list[np.ndarray], want: list[np.ndarray], *, exact: bool) -> None:
    """got: the fp16-cache op's (out, present_key, present_value); want: the fp32 op's on the widened cache."""
    assert got[1].dtype == got[2].dtype == np.float16 and got[0].dtype == np.float32
    for a, b in zip(got[1:], want[1:], strict=True):  # every row, new ones rounded to nearest even
        assert np.array_equal(a, b.astype(np.float16))
    if exact:
        assert np.array_equal(got[0], want[0])
    else:  # only the new rows' rounding (relative 2^-11 per element) separates them
        assert np.abs(got[0] - want[0]).max() / np.abs(want[0]).max() < 2e-3


# (hq, hkv, d, capacity, past, T, rot_half): decode deep in the cache, a prefill chunk from 0, GQA, partial rotary.
LINEAR = [(9, 3, 64, 300, 200, 1, 32), (4, 2, 16, 64, 0, 7, 8), (4, 2, 32, 64, 10, 5, 8), (8, 8, 128, 90, 37, 9, 24)]


@pytest.mark.parametrize("identity_rope", [True, False])
@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "past", "t", "half"), LINEAR)
def test_linear_attention_with_an_fp16_cache_is_the_fp32_op_on_its_rows(hq, hkv, d, cap, past, t, half, identity_rope):
    rng = np.random.default_rng(past + t)
    feeds = _linear_feeds(rng, hq, hkv, d, cap, past, t, half, identity_rope=identity_rope)
    graph = _attention_graph(kernels.LINEAR_ATTENTION, hq, hkv, d)
    got = _session(_f16_cache(graph)).run(None, feeds)
    want = _session(graph).run(None, _widened(feeds))
    _check(got, want, exact=identity_rope)


@pytest.mark.parametrize("identity_rope", [True, False])
@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "sinks", "t", "half", "write"), CASES)
def test_ring_attention_with_an_fp16_cache_is_the_fp32_op_on_its_rows(
    hq, hkv, d, cap, sinks, t, half, write, identity_rope
):
    """CASES: decode and chunks, rows written mid-buffer and at its end (a wrapped ring), sinks, masks."""
    rng = np.random.default_rng(cap + t)
    feeds = _half(_feeds(rng, hq, hkv, d, cap, sinks, t, half, write))
    if identity_rope:
        feeds["qkv"] = feeds["qkv"].astype(np.float16).astype(np.float32)
        feeds |= {n: np.ones_like(feeds[n]) for n in ("cos", "cos_sink")}
        feeds |= {n: np.zeros_like(feeds[n]) for n in ("sin", "sin_sink")}
    graph = _ring_graph(hq, hkv, d)
    got = _session(_f16_cache(graph)).run(None, feeds)
    want = _session(graph).run(None, _widened(feeds))
    _check(got, want, exact=identity_rope)


def test_a_chunk_across_the_wrap_with_an_fp16_cache_is_its_decode_steps_bit_for_bit():
    """RingAttention's row-by-row exactness holds for an fp16 cache: a 5-row chunk written at the buffer's
    last rows equals five one-row calls, each reading the rows the previous one rounded."""
    hq, hkv, d, cap, sinks, t, half, write = 4, 2, 32, 40, 4, 5, 8, 35
    rng = np.random.default_rng(3)
    feeds = _half(_feeds(rng, hq, hkv, d, cap, sinks, t, half, write, hide_later_rows=True))
    session = _session(_f16_cache(_ring_graph(hq, hkv, d)))
    out, keys, values = session.run(None, feeds)
    rows, pk, pv = [], feeds["pk"], feeds["pv"]
    for i in range(t):
        step = {n: feeds[n][i : i + 1] for n in ("cos", "sin", "cos_sink", "sin_sink", "mask")}
        step |= {"qkv": feeds["qkv"][:, i : i + 1], "write_index": feeds["write_index"] + i}
        o, pk, pv = session.run(None, {**step, "pk": pk, "pv": pv, "sink_rows": feeds["sink_rows"]})
        rows.append(o)
    assert np.array_equal(np.concatenate(rows, axis=1), out)
    assert np.array_equal(pk, keys) and np.array_equal(pv, values)
