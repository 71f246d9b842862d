"""A model and its caches: several streams beside one loaded graph, each in a cache of its own.

Interleaved conversations on two caches give exactly the tokens and logits each gives alone; the weights are
loaded once; the caches share no buffer; the memory budget counts every cache before any is allocated; a
snapshot moves a conversation from one cache to another; the fused argmax is read from the cache that decoded.
"""

from __future__ import annotations

import numpy as np
import pytest

from edge_runtime import kernels
from edge_runtime.engine import LoadOptions, MemoryBudgetError, load
from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.sampling import SamplingParams
from edge_runtime.session import Session

VOCAB = 256  # the tiny checkpoints' vocabulary
NO_STOP: list[int] = []


def ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def turn(session: Session, prompt: list[int], n: int, **kw) -> tuple[list[int], list[np.ndarray]]:
    tokens, rows = [], []
    for step in session.send(prompt, max_tokens=n, stop_ids=NO_STOP, logprobs=0, **kw):
        tokens.append(step.token)
        rows.append(step.logprob)
    return tokens, rows


def test_interleaved_conversations_on_two_caches_equal_each_alone(tied_bundle):
    engine = load(tied_bundle, LoadOptions(caches=2))
    a, b = Session(engine), Session(engine.on(1))
    alone_a, alone_b = Session(load(tied_bundle)), Session(load(tied_bundle))
    for k in range(4):  # a's turn, then b's, on one model: neither disturbs the other
        pa, pb = ids(10 + k, 7 + k), ids(20 + k, 11 - k)
        assert turn(a, pa, 9) == turn(alone_a, pa, 9)
        assert turn(b, pb, 9) == turn(alone_b, pb, 9)
    assert a.length == alone_a.length and b.length == alone_b.length
    assert a.recent_ids() == alone_a.recent_ids() and b.recent_ids() != a.recent_ids()


def test_one_graph_many_caches_no_shared_buffer(tied_bundle):
    engine = load(tied_bundle, LoadOptions(caches=3))
    model = engine.model
    assert len(model.caches) == 3 and engine.cache is model.caches[0]
    other = engine.on(2)
    assert other.model is model and other.cache is model.caches[2]
    assert other.backend.session is engine.backend.session  # the weights: one InferenceSession
    arrays = [
        [*c.pool.keys, *c.pool.values, c.pool.logits, c.pool.input_ids, c.pool.decode.attn_mask] for c in model.caches
    ]
    for i in range(3):
        for j in range(i + 1, 3):
            for x, y in zip(arrays[i], arrays[j], strict=True):
                assert not np.shares_memory(x, y)
    with pytest.raises(EdgeRuntimeError, match="cache 3 does not exist: this model was loaded with 3"):
        engine.on(3)


def test_the_budget_counts_every_cache_before_any_is_allocated(tied_bundle):
    one = load(tied_bundle)
    need_one = one.weight_bytes + one.model.kv_bytes
    kv = one.model.kv_bytes
    assert load(tied_bundle, LoadOptions(caches=1, memory_budget=need_one)).model.caches
    with pytest.raises(MemoryBudgetError, match=r"2 KV caches .* use fewer --slots, a smaller --window"):
        load(tied_bundle, LoadOptions(caches=2, memory_budget=need_one + kv - 1))
    assert len(load(tied_bundle, LoadOptions(caches=2, memory_budget=need_one + kv)).model.caches) == 2
    with pytest.raises(EdgeRuntimeError, match="at least one cache"):
        load(tied_bundle, LoadOptions(caches=0))


def test_a_snapshot_moves_a_conversation_to_another_cache(tied_bundle):
    engine = load(tied_bundle, LoadOptions(caches=2))
    first, second = Session(engine), Session(engine.on(1))
    turn(first, ids(1, 12), 6)
    second.restore(first.snapshot())
    prompt = ids(2, 5)
    assert turn(second, prompt, 8) == turn(first, prompt, 8)


def test_sampled_replies_on_two_caches_equal_each_alone(tied_bundle):
    engine = load(tied_bundle, LoadOptions(caches=2))
    a, b = Session(engine), Session(engine.on(1))
    alone = Session(load(tied_bundle))
    params = SamplingParams(temperature=0.9, seed=5)
    turn(b, ids(3, 20), 5)  # b's cache holds a conversation of its own meanwhile
    assert turn(a, ids(4, 9), 12, sampling=params) == turn(alone, ids(4, 9), 12, sampling=params)


@pytest.mark.skipif(not kernels.available(), reason=f"{kernels.unavailable_reason()}")
def test_the_fused_argmax_is_read_from_the_cache_that_decoded(tmp_path):
    """An int4 edge graph leaves each step's greedy token in the pool: with two caches, each reply's tokens
    are its own cache's (a reply reading another cache's token would repeat the other conversation)."""
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod

    from .tiny_models import save_tiny_checkpoint

    save_tiny_checkpoint("llama-untied", tmp_path / "ck")
    quant = QuantConfig(QuantMethod.INT4, 32, kernel=MatMulKernel.EDGE)
    out = tmp_path / "q4"
    export(ExportOptions(checkpoint=tmp_path / "ck", out=out, window=60, quant=quant))
    engine = load(out, LoadOptions(caches=2))
    assert engine.fused_argmax
    a, b = Session(engine), Session(engine.on(1))
    alone_a, alone_b = Session(load(out)), Session(load(out))

    def greedy(session: Session, prompt: list[int]) -> list[int]:
        return [s.token for s in session.send(prompt, max_tokens=10, stop_ids=NO_STOP)]  # no logprobs: fused

    for k in range(3):
        pa, pb = ids(30 + k, 6), ids(40 + k, 9)
        assert greedy(a, pa) == greedy(alone_a, pa)
        assert greedy(b, pb) == greedy(alone_b, pb)
