"""Exact mode means exact: for every kind of bundle this CPU runs, greedy speculation gives plain greedy's tokens
(160 of them, a grounded prompt that lookup accepts often) and so does a session over three turns; it verifies
only as many rows as were measured to round like decode steps (exactness.py), and where that is one row it
does not speculate and says so."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest

from edge_runtime import exactness, kernels
from edge_runtime.engine import LoadOptions, load
from edge_runtime.generate import step_generator
from edge_runtime.proposers import PromptLookup
from edge_runtime.sampling import Sampler, SamplingParams
from edge_runtime.session import Session
from edge_runtime.speculative import SpeculationOffWarning, SpeculativeDecoder

EDGE = kernels.available()
# Every kind of bundle a user can have on x86 (the edge ones where the kernels are built here): conftest.DemoBundles.
KINDS = ["fp32", "fp16", "int8-mlas", "int4-mlas", "trt-fp32", "trt-int4"]
if EDGE:
    KINDS += ["int4-edge", "int8-edge", "int4-edge-kv-fp16", "int4-edge-kv-q8"]
# A small ring, so 160 tokens wrap it several times; slack 16 lets a chunk be as wide as any kernel keeps exact.
RING = LoadOptions(sinks=4, window=40, slack=16)


@pytest.fixture(scope="module")
def bundles(demo_bundles):
    return {kind: demo_bundles[kind] for kind in KINDS}


def grounded_prompt(vocab: int) -> list[int]:
    """A parts list said twice and begun a third time: the reply copies it, so lookup proposes and is right."""
    phrase = np.random.default_rng(11).integers(3, vocab, 14).tolist()
    return phrase * 2 + phrase[:5]


def greedy(engine, prompt, n, spec=None) -> list[int]:
    steps = step_generator(engine, prompt, Sampler(SamplingParams()), speculative=spec)
    try:
        return [next(steps).token for _ in range(n)]
    finally:
        steps.close()


def widest_chunks(engine) -> list[int]:
    """Rows of every chunk the engine runs from now on (recorded by wrapping the backend)."""
    rows: list[int] = []
    run_chunk = engine.backend.run_chunk

    def recording(ids, plan, keep):
        rows.append(len(ids))
        return run_chunk(ids, plan, keep)

    engine.backend.run_chunk = recording
    return rows


@pytest.mark.parametrize("kind", list(KINDS))
def test_exact_speculation_equals_plain_greedy(kind, bundles):
    engine = load(bundles[kind], RING)
    prompt = grounded_prompt(engine.manifest.model.vocab_size)
    want = greedy(engine, prompt, 160)
    spec = SpeculativeDecoder(PromptLookup(), k=8, adaptive=False)
    cap = engine.exact_rows
    chunks = widest_chunks(engine)
    if cap == 1:
        with pytest.warns(SpeculationOffWarning, match="speculation is off"):
            assert greedy(engine, prompt, 160, spec) == want
        assert spec.stats.verify_steps == 0
        return
    assert greedy(engine, prompt, 160, spec) == want
    assert engine.ring.written > 2 * engine.geometry.capacity  # the ring wrapped
    st = spec.stats
    assert st.verify_steps > 10 and st.accepted > 0, st
    prefill = int(np.searchsorted(np.cumsum(chunks), len(prompt))) + 1  # the prompt's chunks come first
    verified = chunks[prefill:]
    assert verified and max(verified) <= cap  # never a verification wider than measured exact


@pytest.mark.parametrize("kind", list(KINDS))
def test_exact_speculation_over_three_session_turns(kind, bundles):
    plain, fast = Session(load(bundles[kind], RING)), Session(load(bundles[kind], RING))
    spec = SpeculativeDecoder(PromptLookup(), k=8)  # adaptive, as edge-run and edge-serve run it
    vocab = plain.manifest.model.vocab_size
    rng = np.random.default_rng(5)
    for turn in range(3):
        user = grounded_prompt(vocab) if turn == 0 else rng.integers(3, vocab, 6).tolist() * 2
        want = [s.token for s in plain.send(user, max_tokens=50, stop_ids=())]
        with pytest.warns(SpeculationOffWarning) if fast.engine.exact_rows == 1 else nullcontext():
            got = [s.token for s in fast.send(user, max_tokens=50, stop_ids=(), speculative=spec)]
        assert got == want, f"turn {turn}"
        assert fast.length == plain.length
    if fast.engine.exact_rows > 1:
        assert spec.stats.verify_steps > 0


@pytest.mark.skipif(not EDGE, reason=f"{kernels.unavailable_reason()}")
def test_the_documented_caps_are_measured_true_and_a_rounding_difference_is_found(bundles):
    """The edge ops' table (kernels.exact_rows) holds on this CPU's graph; a graph made to round its chunks
    of more than three rows differently measures 3; the probe leaves a session's state exactly as it was."""
    engine = load(bundles["int4-edge"], RING)
    documented = kernels.exact_rows(engine.backend.kernel_ops())
    widest = min(documented or exactness.WIDEST, RING.slack + 1)
    assert exactness.measure(engine, RING.slack + 1) >= widest

    run_chunk = engine.backend.run_chunk

    def rounding_otherwise(ids, plan, keep):
        out = run_chunk(ids, plan, keep)
        if len(ids) > 3:
            out = out.copy()
            out[-1, 0] = np.nextafter(out[-1, 0], np.float32(np.inf))  # one ulp on one logit
        return out

    engine.backend.run_chunk = rounding_otherwise
    assert exactness.measure(engine, RING.slack + 1) == 3
    engine.backend.run_chunk = run_chunk

    # In the middle of a conversation, a probe changes nothing the session can see.
    probed, untouched = Session(engine), Session(load(bundles["int4-edge"], RING))
    user = grounded_prompt(engine.manifest.model.vocab_size)
    for s in (probed, untouched):
        list(s.send(user, max_tokens=30, stop_ids=()))
    exactness.measure(engine, RING.slack + 1)
    a = [s.token for s in probed.send([7, 8, 9], max_tokens=30, stop_ids=())]
    b = [s.token for s in untouched.send([7, 8, 9], max_tokens=30, stop_ids=())]
    assert a == b


def test_the_answer_is_cached_per_bundle_and_cpu(bundles, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(tmp_path))
    first = load(bundles["fp32"], RING).exact_rows
    assert (tmp_path / "exact-rows.json").is_file()

    def no_probe(*_):
        raise AssertionError("probed again")

    monkeypatch.setattr(exactness, "measure", no_probe)
    assert load(bundles["fp32"], RING).exact_rows == first
    (tmp_path / "exact-rows.json").write_text("{not json")  # a damaged record: probed again, not an error
    monkeypatch.undo()
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(tmp_path))
    assert load(bundles["fp32"], RING).exact_rows == first


PARTS = (
    "Copy this parts list exactly, one item per line: bolt M3 x 13 mm, washer M3, nut M3 nylon, standoff M2.5 x 10 "
    "mm, servo horn 25T, bearing 608ZZ, belt GT2 6 mm, pulley GT2 20T, spring 0.5 x 5 x 20 mm, cable tie 100 mm."
)


@pytest.mark.parametrize("which", ["real_fp32_bundle", "real_int4_bundle"])
def test_exact_speculation_on_the_real_model(which, request):
    """SmolLM2-135M-Instruct (fp32, and int4 on the kernels x86 users get): 160 greedy tokens of a copying task
    through the chat template, with and without lookup, token for token."""
    from edge_runtime.chat import ChatTemplate
    from edge_runtime.tokenizer import Tokenizer

    engine = load(request.getfixturevalue(which), LoadOptions(threads=2))
    tok = Tokenizer(engine.bundle.tokenizer_file, engine.manifest.tokenizer)
    text = ChatTemplate.for_bundle(engine.bundle).render(
        [{"role": "user", "content": PARTS}], add_generation_prompt=True
    )
    prompt = tok.encode(text, add_special_tokens=False)
    want = greedy(engine, prompt, 160)
    spec = SpeculativeDecoder(PromptLookup())  # edge-run's --speculative lookup
    if engine.exact_rows == 1:
        with pytest.warns(SpeculationOffWarning):
            assert greedy(engine, prompt, 160, spec) == want
        return
    assert greedy(engine, prompt, 160, spec) == want
    assert spec.stats.accepted > 20, spec.stats
