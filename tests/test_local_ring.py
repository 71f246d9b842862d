"""Gemma 3's local layers keep their own ring (docs/architecture.md §5.2): a local layer's cache
holds its window plus slack rows, the global layers keep sinks + window; the two rings advance, chunk,
roll back and snapshot together, and every step still matches StreamingLLM's reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edge_runtime.engine import LoadOptions, load
from edge_runtime.errors import BundleError, RollbackError
from edge_runtime.exporters import ReferenceModel, load_checkpoint
from edge_runtime.exporters.decoder import Flavor
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.reference import StreamingReference
from edge_runtime.exporters.validate import TOLERANCE
from edge_runtime.manifest import CAPACITY_DIM, LOCAL_CAPACITY_DIM, MANIFEST_FILE, with_digest
from edge_runtime.pool import StaticPool
from edge_runtime.proposers import PromptLookup
from edge_runtime.ring import LocalLayers, RingGeometry, RingState, local_geometry
from edge_runtime.session import RingOverflowWarning, Session
from edge_runtime.speculative import SpeculativeDecoder

from .bad_inputs_util import copy_bundle
from .tiny_models import TINY_CONFIGS, save_tiny_checkpoint

pytest.importorskip("torch")

LOCAL = [i for i, t in enumerate(TINY_CONFIGS["gemma3"]["layer_types"]) if t == "sliding_attention"]  # 0, 1, 3
LOCAL_WINDOW = TINY_CONFIGS["gemma3"]["sliding_window"]  # 12
# Global ring 4 + 16 + 8 = 28 rows, local ring 12 + 12 = 24 rows: 70 tokens wrap both more than twice.
SMALL = LoadOptions(sinks=4, window=16, slack=8, spin=False)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma3")
    save_tiny_checkpoint("gemma3", d / "ckpt")
    out = {}
    for flavor in Flavor:
        out[flavor] = d / flavor.value
        export(ExportOptions(checkpoint=d / "ckpt", out=out[flavor], flavor=flavor, sinks=4, window=16))
    return d / "ckpt", out


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_the_local_geometry_is_the_window_and_as_much_slack_never_more_rows_than_the_global_ring():
    g = RingGeometry(sinks=4, window=2044, slack=63)
    assert local_geometry(g, 512) == RingGeometry(sinks=0, window=512, slack=512)
    # A window W at or below the local one: W rows, and slack up to the global ring's row count.
    assert local_geometry(RingGeometry(4, 100, 8), 512) == RingGeometry(0, 100, 12)
    assert local_geometry(RingGeometry(4, 508, 63), 1024).capacity == 575  # Gemma 3 4B at the rpi4 window
    assert local_geometry(RingGeometry(4, 100, 200), 50) == RingGeometry(0, 50, 200)  # never less slack
    for sinks, window, slack, local in [(4, w, s, lw) for w in (16, 500, 1020, 2044, 8188) for s in (0, 8, 63)
                                        for lw in (12, 512, 1024)]:  # fmt: skip
        g = RingGeometry(sinks, window, slack)
        lg = local_geometry(g, local)
        assert lg.capacity <= g.capacity and lg.slack >= g.slack and lg.window == min(local, window)


def test_both_rings_bound_chunks_and_rollback_and_state_covers_both():
    state = RingState(RingGeometry(4, 16, 8), np.ones(4), local=LocalLayers(window=12, inv_freq=np.ones(4) / 2))
    local = state.local_ring
    assert local is not None and local.geometry == RingGeometry(0, 12, 12)
    assert state.max_chunk(4) == 20  # the local ring's 24 - 4 rows left, not the global ring's 28 - 4
    for n in state.chunks(60):
        plan = state.plan(n, new_rows_as_columns=False)
        assert plan.attn_mask_local is not None and plan.attn_mask_local.shape == (n, 24)
        assert plan.write_index_local is not None and plan.attn_mask.shape == (n, 28)
    assert local.tokens == state.tokens == 60
    # Past the wrap each ring allows slack + 1 less what is pending: the global ring's 9 is the smaller.
    assert state.rollback_limit() == min(9, local.rollback_limit()) == 9
    tokens, written, rows = state.state()
    assert rows.shape == (28 + 24,) and (rows[28:] >= 0).sum() == 24
    state.truncate(3)
    assert local.tokens == 57 and local.row_pos.max() == 56
    with pytest.raises(RollbackError):
        state.truncate(7)
    state.set_state(tokens, written, rows)
    assert local.tokens == 60 and np.array_equal(state.state()[2], rows)


def test_local_layers_hold_their_window_and_slack_rows_and_the_graph_says_so(gemma):
    _, bundles = gemma
    for flavor, bundle in bundles.items():
        engine = load(bundle, SMALL)
        g, lg = engine.geometry, engine.local_geometry
        assert lg == RingGeometry(0, LOCAL_WINDOW, LOCAL_WINDOW), flavor
        m = engine.manifest
        assert m.graph.local_cache_layers == frozenset(LOCAL)
        for i, k in enumerate(engine.pool.keys):
            dim = m.graph.inputs[f"past_key.{i}"]["shape"][2]
            want = (LOCAL_CAPACITY_DIM, lg.capacity) if i in LOCAL else (CAPACITY_DIM, g.capacity)
            assert (dim, k.shape[2]) == want
        assert engine.pool.kv_nbytes() == StaticPool.estimate_kv_bytes(m, g, lg)
    # At a long window the saving is the point: 3 of 4 layers hold 24 rows instead of 4 + 500 + 8.
    big = load(bundles[Flavor.ORT], LoadOptions(sinks=4, window=500, slack=8, spin=False))
    every_layer_global = StaticPool.estimate_kv_bytes(big.manifest, big.geometry, None)
    assert big.pool.kv_nbytes() / every_layer_global == pytest.approx((512 + 3 * 24) / (4 * 512))


@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
def test_prefill_past_both_wraps_matches_streamingllm_at_every_token(gemma, flavor):
    """One prefill of 70 tokens (chunked where either ring needs it), then decoding: every row's logits
    against the StreamingLLM reference, whose local layers attend their window as the model does."""
    ckpt_dir, bundles = gemma
    engine = load(bundles[flavor], SMALL)
    ckpt = load_checkpoint(ckpt_dir)
    stream = StreamingReference(ReferenceModel(ckpt.args, ckpt.weights), 4, 16)
    ids = np.random.default_rng(5).integers(0, ckpt.args.vocab_size, 90)
    got = engine.prefill(ids[:70].tolist(), all_logits=True)
    errs = [_rel(got[i], stream.step(int(t))) for i, t in enumerate(ids[:70])]
    errs += [_rel(engine.decode(int(t)), stream.step(int(t))) for t in ids[70:]]
    assert engine.ring.local_ring.written > 3 * engine.local_geometry.capacity
    assert max(errs) <= TOLERANCE["fp32"], f"worst step {int(np.argmax(errs))}: {max(errs):.2e}"


def test_truncate_and_snapshot_restore_both_rings(gemma, tmp_path):
    _, bundles = gemma
    engine = load(bundles[Flavor.ORT], SMALL)
    rng = np.random.default_rng(6)
    ids, x, y = (rng.integers(0, 256, n).tolist() for n in (50, 5, 5))
    fresh = load(bundles[Flavor.ORT], SMALL)
    fresh.prefill(ids)
    want = fresh.prefill(y, all_logits=True)

    engine.prefill(ids)
    engine.prefill(x)
    engine.truncate(5)  # both rings have wrapped: x's rows are masked in each until rewritten
    assert np.array_equal(engine.prefill(y, all_logits=True), want)
    with pytest.raises(RollbackError):
        engine.truncate(engine.ring.rollback_limit() + 1)

    session = Session(load(bundles[Flavor.ORT], SMALL))
    with pytest.warns(RingOverflowWarning):  # 50 tokens in one turn: more than the window of 16
        session.prefill(ids)
    session.save(tmp_path / "s.npz")
    after = [session.engine.decode(t).copy() for t in y]
    other = Session(load(bundles[Flavor.ORT], SMALL))
    other.load(tmp_path / "s.npz")
    assert all(np.array_equal(other.engine.decode(t), a) for t, a in zip(y, after, strict=True))


def test_greedy_lookup_speculation_equals_plain_greedy_across_the_local_wrap(gemma):
    from edge_runtime.generate import step_generator
    from edge_runtime.sampling import Sampler, SamplingParams

    _, bundles = gemma
    engine = load(bundles[Flavor.ORT], SMALL)
    phrase = np.random.default_rng(7).integers(3, 256, 9).tolist()
    prompt = phrase * 3 + phrase[:4]

    def greedy(spec=None) -> list[int]:
        steps = step_generator(engine, prompt, Sampler(SamplingParams()), speculative=spec)
        try:
            return [next(steps).token for _ in range(60)]
        finally:
            steps.close()

    want = greedy()
    # exact=False: this fp32 graph rounds a chunk unlike a decode step, so exact mode would not verify at
    # all; the walk across the local ring's wraps is what is tested here (test_speculative_exact.py: exactness)
    spec = SpeculativeDecoder(PromptLookup(), k=6, adaptive=False, exact=False)
    assert greedy(spec) == want
    assert engine.ring.local_ring.written > 2 * engine.local_geometry.capacity
    assert spec.stats.verify_steps > 5


def test_a_bundle_whose_local_layers_share_the_global_ring_is_refused(gemma, tmp_path):
    """Bundles exported before the local ring declared every layer's rows as the global ring's."""
    _, bundles = gemma
    b = copy_bundle(bundles[Flavor.ORT], tmp_path / "b")
    data = json.loads((b / MANIFEST_FILE).read_text())
    for spec in data["graph"]["inputs"].values():
        spec["shape"] = [CAPACITY_DIM if d == LOCAL_CAPACITY_DIM else d for d in spec["shape"]]
    (b / MANIFEST_FILE).write_text(json.dumps(with_digest(data)))
    with pytest.raises(BundleError, match=r"before they had their own ring.*re-export"):
        load(b, SMALL)
