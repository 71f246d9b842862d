"""The allocation-free Sampler picks exactly what the straightforward one did, seed for seed, and a
sampling step allocates nothing vocabulary-sized."""

from __future__ import annotations

import tracemalloc
from collections.abc import Sequence

import numpy as np
import pytest

from edge_runtime.errors import CorruptOutputError, EdgeRuntimeError
from edge_runtime.sampling import Sampler, SamplingParams


def _reference(p: SamplingParams, rng: np.random.Generator, logits: np.ndarray, history: Sequence[int]) -> int:
    """The Sampler as it was before its work rows (commit 95a5310), kept as the oracle."""
    if p.repetition_penalty != 1.0 and len(history):
        logits = logits.astype(np.float64)
        seen = np.unique(np.asarray(history))
        vals = logits[seen]
        logits[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if p.greedy:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / p.temperature
    if p.top_k and p.top_k < z.size:
        kth = np.partition(z, -p.top_k)[-p.top_k]
        z = np.where(z < kth, -np.inf, z)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        cut = int(np.searchsorted(cum, p.top_p)) + 1
        keep = np.zeros_like(probs, dtype=bool)
        keep[order[:cut]] = True
        probs = np.where(keep, probs, 0.0)
    if p.min_p > 0:
        probs = np.where(probs >= p.min_p * probs.max(), probs, 0.0)
    probs /= probs.sum()
    return int(rng.choice(probs.size, p=probs))


PARAMS = [
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=1.0, top_p=0.9, seed=2),
    SamplingParams(temperature=0.7, top_k=40, top_p=0.95, seed=3),
    SamplingParams(temperature=1.3, min_p=0.05, seed=4),
    SamplingParams(temperature=0.9, top_k=5, min_p=0.1, repetition_penalty=1.3, seed=5),
    SamplingParams(temperature=2.0, top_p=0.5, repetition_penalty=0.8, seed=6),
    SamplingParams(temperature=0, repetition_penalty=1.5),
]


def _rows(vocab: int, n: int, seed: int) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    rows = [(g.standard_normal(vocab) * 3).astype(np.float32) for _ in range(n)]
    # Ties, the case where top-p must keep the lower ids: quantized logits, and a flat row.
    rows.append(np.round(rows[0]).astype(np.float32))
    rows.append(np.zeros(vocab, np.float32))
    return rows


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: repr(p)[15:60])
def test_same_tokens_as_the_reference_for_a_seed(params):
    rows = _rows(4224, 60, seed=0)
    sampler, rng = Sampler(params), np.random.default_rng(params.seed)
    history: list[int] = [3, 17, 17, 400]
    for logits in rows:
        want = _reference(params, rng, logits, history)
        assert sampler(logits, history) == want
        history.append(want)


def test_top_p_ties_keep_the_lowest_ids():
    logits = np.zeros(1000, np.float32)
    logits[[10, 500, 900]] = 5.0  # three tied favourites; top_p small enough for one of them
    params = SamplingParams(temperature=1.0, top_p=0.05, seed=0)
    assert {Sampler(params)(logits) for _ in range(20)} == {10}


def test_a_sampling_step_allocates_nothing_vocabulary_sized():
    vocab = 128_256
    logits = _rows(vocab, 1, seed=1)[0]
    sampler = Sampler(SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.01, repetition_penalty=1.1, seed=0))
    history = list(range(0, 2000, 7))
    sampler(logits, history)  # the first step allocates the work rows
    tracemalloc.start()
    try:
        for _ in range(5):
            sampler(logits, history)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < vocab  # the old step peaked at ~4 bytes x 8 per entry; now only history-sized scraps


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9, seed=0)])
def test_non_finite_logits_are_refused_not_sampled(bad, params):
    logits = np.zeros(100, np.float32)
    logits[7] = bad
    with pytest.raises(CorruptOutputError, match="non-finite logits"):
        Sampler(params)(logits)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"seed": 1.5}, "seed must be an integer >= 0"),
        ({"temperature": 1e-308}, "temperature must be 0 (greedy) or a finite value >= 1e-06"),
        ({"temperature": float("nan")}, "temperature must be 0"),
        ({"temperature": float("inf")}, "temperature must be 0"),
        ({"temperature": -1.0}, "temperature must be 0"),
        ({"top_p": float("nan")}, "top_p"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
    ],
)
def test_sampling_params_refuse_what_would_crash_later(kwargs, needle):
    with pytest.raises(EdgeRuntimeError) as e:
        SamplingParams(**kwargs)
    assert needle in str(e.value)


def test_logit_bias_adds_to_the_listed_logits_and_refuses_bad_entries():
    from edge_runtime.sampling import LogitBias

    logits = np.array([1.0, 2.0, 3.0, 0.5], np.float32)
    biased = LogitBias({2: -100, 0: 2.5})([], logits.copy())
    np.testing.assert_array_equal(biased, np.array([3.5, 2.0, -97.0, 0.5], np.float32))
    assert Sampler(SamplingParams())(biased) == 0  # the old argmax banned, the raised one wins
    with pytest.raises(EdgeRuntimeError, match=r"\[-100, 100\]"):
        LogitBias({1: 100.5})
    with pytest.raises(EdgeRuntimeError, match="token ids"):
        LogitBias({-1: 1.0})
    with pytest.raises(EdgeRuntimeError, match="vocabulary has 4"):
        LogitBias({4: 1.0})([], logits.copy())
