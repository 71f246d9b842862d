"""Ring-buffer bookkeeping properties (edge_runtime.ring)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.ring import RingGeometry, RingState

geometries = st.builds(RingGeometry, sinks=st.integers(0, 6), window=st.integers(1, 24), slack=st.integers(0, 9))


@given(geometries, st.integers(0, 500))
def test_slots_stay_in_their_region(g, t):
    s = g.slot(t)
    assert 0 <= s < g.capacity
    assert (s < g.sinks) == (t < g.sinks)


@settings(max_examples=60, deadline=None)
@given(geometries, st.lists(st.integers(1, 40), min_size=1, max_size=8))
def test_chunks_are_contiguous_and_keep_every_key_their_rows_need(g, requests):
    state = RingState(g, np.ones(2))
    for n_tokens in requests:
        for n in state.chunks(n_tokens):
            t0 = state.tokens
            rows = [g.slot(t) for t in range(t0, t0 + n)]
            assert rows == list(range(rows[0], rows[0] + n))  # no wrap inside a call
            if t0 < g.sinks:  # a call writing sinks has no row that needs the sink-rotated query
                assert t0 + n - 1 <= g.logical_capacity - 1
            plan = state.plan(n, new_rows_as_columns=False)
            assert plan.attn_mask.shape[1] == g.capacity and plan.sink_rows[0] == max(g.sinks, 1)
            visible = plan.attn_mask == 0
            # Until the ring is full the `ort` graph runs GroupQueryAttention, which writes rows
            # [t0, t0 + n), rotates them at their row index and lets row t see rows 0..t: all must hold.
            assert bool(plan.ring_full) == (t0 + n - 1 >= g.logical_capacity)
            if not plan.ring_full:
                assert rows == list(range(t0, t0 + n)) and int(plan.seqlens_k[0]) == t0 + n - 1
                assert int(plan.total_len) == t0 + n
                for r, t in enumerate(range(t0, t0 + n)):
                    assert set(np.flatnonzero(visible[r])) == set(range(t + 1))
            for r, t in enumerate(range(t0, t0 + n)):
                # Row t sees exactly: the sinks and the last W tokens up to itself.
                want = {p for p in range(t + 1) if p < g.sinks or t - p < g.window}
                assert {int(state.row_pos[c]) for c in np.flatnonzero(visible[r])} == want
            assert (state.row_pos[: g.sinks] >= 0).sum() == min(state.tokens, g.sinks)


@given(geometries, st.integers(1, 80))
def test_a_prompt_that_fits_goes_in_one_call_with_its_sinks(g, n_tokens):
    # Split as the sinks and then the rest, a short prompt would pay a second pass over every weight.
    state = RingState(g, np.ones(2))
    sizes = state.chunks(n_tokens)
    fits = n_tokens <= g.capacity and (g.sinks == 0 or n_tokens <= g.logical_capacity)
    assert sum(sizes) == n_tokens and (sizes == [n_tokens]) == fits


def test_plan_refuses_an_illegal_chunk():
    state = RingState(RingGeometry(4, 8), np.ones(2))
    state.plan(12, new_rows_as_columns=False)
    with pytest.raises(EdgeRuntimeError, match="exceeds the ring's limit 1"):
        state.plan(2, new_rows_as_columns=False)


def test_bad_geometry_is_named():
    with pytest.raises(EdgeRuntimeError, match="window=0"):
        RingGeometry(4, 0)


def test_sink_query_position_is_cache_logical():
    g = RingGeometry(sinks=2, window=3)
    inv = np.array([1.0])
    state = RingState(g, inv, position_offset=100)
    plans = [state.plan(1, new_rows_as_columns=False) for _ in range(8)]
    angles_abs = [np.arctan2(p.sin[0, 0], p.cos[0, 0]) for p in plans]
    angles_sink = [np.arctan2(p.sin_sink[0, 0], p.cos_sink[0, 0]) for p in plans]
    wrap = lambda a: (a + np.pi) % (2 * np.pi) - np.pi  # noqa: E731
    assert np.allclose(angles_abs, wrap(100 + np.arange(8)))
    assert np.allclose(angles_sink, wrap(100 + np.minimum(np.arange(8), 4)))  # min(t, S + W - 1)


def _decode_buffers(g: RingGeometry, half: int):
    from edge_runtime.ring import DecodeBuffers

    cols = g.capacity
    return DecodeBuffers(
        cos=np.zeros((1, half)), sin=np.zeros((1, half)), cos_sink=np.zeros((1, half)), sin_sink=np.zeros((1, half)),
        attn_mask=np.full((1, cols), -1e9), sink_mask=np.arange(cols) < g.sinks, write_index=np.zeros(1, np.int64),
        sink_rows=np.array([g.sink_rows], np.int64), ring_full=np.zeros((), np.bool_),
        seqlens_k=np.zeros(1, np.int32), total_len=np.zeros((), np.int32), cos_cache=np.zeros((cols, half)),
        sin_cache=np.zeros((cols, half)), masked=-1e9, angle=np.zeros(half), trig=np.zeros(half),
    )  # fmt: skip


@pytest.mark.parametrize("sinks", [4, 0])
def test_gqa_while_linear_skips_only_inputs_the_linear_branch_never_reads(sinks):
    """From the first ring_full step on, every decode input equals the eager one's; before it, only the
    cos/sin/sink angles (read by the full-ring branch alone) may be stale."""
    g = RingGeometry(sinks=sinks, window=12, slack=3)
    inv_freq = 1.0 / 10000 ** (np.arange(8) / 8)
    eager, lazy = RingState(g, inv_freq, 5), RingState(g, inv_freq, 5, gqa_while_linear=True)
    be, bl = _decode_buffers(g, 8), _decode_buffers(g, 8)
    eager.sync_decode(be)
    lazy.sync_decode(bl)
    for t in range(3 * g.capacity):
        assert eager.decode_into(be, new_rows_as_columns=False) == lazy.decode_into(bl, new_rows_as_columns=False)
        for name in ("attn_mask", "write_index", "ring_full", "seqlens_k", "total_len"):
            assert np.array_equal(getattr(be, name), getattr(bl, name)), (t, name)
        if t >= g.logical_capacity:
            for name in ("cos", "sin", "cos_sink", "sin_sink"):
                assert np.array_equal(getattr(be, name), getattr(bl, name)), (t, name)
        else:
            assert not bl.ring_full
