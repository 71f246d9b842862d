"""Speculative decoding: greedy outputs equal plain greedy token for token with either proposer,
before and after the ring wraps; the rejection rule samples the target's distribution; bad set-ups fail in
one typed line."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

import numpy as np
import pytest

from edge_runtime import kernels
from edge_runtime.engine import LoadOptions, load
from edge_runtime.errors import DraftMismatchError, SpeculativeError
from edge_runtime.generate import step_generator
from edge_runtime.proposers import DraftModel, PromptLookup, Proposal, check_draft
from edge_runtime.sampling import Sampler, SamplingParams
from edge_runtime.session import Session
from edge_runtime.speculative import (
    SpeculationOffWarning,
    SpeculativeDecoder,
    rejection_sample,
    resolve,
    speculative_generate_step,
)

# A small ring, so a reply of ~100 tokens wraps it several times: sinks 4 + window 24, slack 8.
SMALL = LoadOptions(sinks=4, window=24, slack=8)


@pytest.fixture(scope="module")
def demo(demo_bundles):
    """The demo model at fp32 (conftest.DemoBundles). (INT4 bundles on edge-runtime's kernels: test_edge_int4_...
    below.)"""
    return demo_bundles["fp32"]


def greedy(source, prompt, n: int, spec=None) -> list[int]:
    steps = step_generator(source, prompt, Sampler(SamplingParams()), speculative=spec)
    try:
        return [next(steps).token for _ in range(n)]
    finally:
        steps.close()


def repetitive_prompt(vocab: int) -> list[int]:
    """A random phrase said three times: lookup finds matches from the start, and a random model's
    greedy reply soon loops too."""
    phrase = np.random.default_rng(7).integers(3, vocab, 9).tolist()
    return phrase * 3 + phrase[:4]


def proposer(kind: str, bundle):
    if kind == "lookup":
        return PromptLookup()
    # The target itself as the draft (everything accepted), or with a 6-token window (often rejected).
    window = SMALL.window if kind == "draft-same" else 6
    return DraftModel(load(bundle, dataclasses.replace(SMALL, window=window)))


@pytest.mark.parametrize("kind", ["lookup", "draft-same", "draft-short"])
@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_greedy_speculation_equals_plain_greedy_across_wraps(model, kind, tied_bundle, demo):
    """The verification walk, rollbacks and both proposers across wraps. exact=False: these fp32 bundles
    round a chunk unlike a decode step (exact mode would not verify at all), and the tokens still agree here
    because the models' margins exceed that rounding; exact mode is tested in test_speculative_exact.py."""
    bundle = tied_bundle if model == "tiny" else demo
    engine = load(bundle, SMALL)
    prompt = repetitive_prompt(engine.manifest.model.vocab_size)
    n = 48 if model == "demo" else 64
    want = greedy(engine, prompt, n)
    spec = SpeculativeDecoder(proposer(kind, bundle), k=6 if kind == "lookup" else 3, adaptive=False, exact=False)
    got = greedy(engine, prompt, n, spec)
    assert engine.ring.written > 2 * engine.geometry.capacity  # the ring wrapped more than twice
    assert got == want
    st = spec.stats
    assert st.verify_steps > 5 and st.accepted > 0
    if kind == "draft-same":
        assert st.accepted == st.proposed  # its own draft: every proposal stands
    if kind == "draft-short":
        assert st.accepted < st.proposed  # rejections, and their rollbacks, were exercised


class Garbage:
    """A proposer whose proposals are always wrong (token 2, which the reply never holds here)."""

    def start(self, target, context, sampling) -> None: ...

    def advance(self, emitted, accepted) -> None: ...

    def propose(self, budget):
        return Proposal([2] * budget("garbage"), arm="garbage")


class StepClock:
    """The decoder's clock, advanced by the target's calls at a fixed cost model: a decode step costs 1, a
    chunk of n rows 1 + 0.5 (n - 1). On the tiny bundle a real 2-row call costs about what a 1-row call
    does (fixed overheads), so the real clock cannot show a losing proposer reliably on a busy machine."""

    def __init__(self, monkeypatch) -> None:
        from edge_runtime import speculative
        from edge_runtime.engine import Engine

        self.now = 0.0
        monkeypatch.setattr(speculative, "time", self)
        decode, prefill = Engine.decode, Engine.prefill

        def timed_decode(engine, token):
            self.now += 1.0
            return decode(engine, token)

        def timed_prefill(engine, ids, *, all_logits=False):
            if all_logits:  # a verification: the pending token and the proposals, one row each
                self.now += 1.0 + 0.5 * (len(ids) - 1)
            return prefill(engine, ids, all_logits=all_logits)

        # The engine's own calls: whichever source (an Engine, a Session) the reply runs on goes through them.
        monkeypatch.setattr(Engine, "decode", timed_decode)
        monkeypatch.setattr(Engine, "prefill", timed_prefill)

    def perf_counter(self) -> float:
        return self.now


def test_adaptive_lookup_is_exact_and_a_losing_proposer_is_switched_off(tied_bundle, monkeypatch):
    engine = load(tied_bundle, SMALL)
    prompt = repetitive_prompt(320)
    want = greedy(engine, prompt, 120)
    assert 2 not in want
    lookup = SpeculativeDecoder(PromptLookup(), k=8, exact=False)  # fp32: see the first test
    assert greedy(engine, prompt, 120, lookup) == want
    # Every proposal rejected: each verification costs more than the plain step it replaces, so the
    # arm is switched off, for longer each time (16, 32, 64 tokens: a few probes in 120 tokens).
    StepClock(monkeypatch)
    losing = SpeculativeDecoder(Garbage(), k=4, exact=False)
    assert greedy(engine, prompt, 120, losing) == want
    st = losing.stats
    assert st.accepted == 0 and st.switched_off >= 2 and st.verify_steps <= 20, st


def test_session_turns_with_speculation_equal_plain_turns(tied_bundle):
    """Across turns, a reply stopped inside an accepted run is rolled back to its last token."""
    plain, fast = Session(load(tied_bundle, SMALL)), Session(load(tied_bundle, SMALL))
    spec = SpeculativeDecoder(PromptLookup(), k=7, adaptive=False, exact=False)  # as in the test above
    rng = np.random.default_rng(3)
    for turn in range(6):
        user = rng.integers(3, 320, 4).tolist() * 2
        n = 9 + 4 * turn
        want = [s.token for s in plain.send(user, max_tokens=n, stop_ids=())]
        got = [s.token for s in fast.send(user, max_tokens=n, stop_ids=(), speculative=spec)]
        assert got == want, f"turn {turn}"
        assert fast.length == plain.length and fast.pending == plain.pending
    assert spec.stats.accepted > 0 and fast.engine.ring.written > fast.geometry.capacity


def test_logprobs_and_processors_see_the_same_rows(tied_bundle):
    """Logprobs and logits processors are applied per verified row as plain decoding applies them per step."""
    engine = load(tied_bundle, SMALL)
    prompt = repetitive_prompt(320)
    ban = lambda reply, logits: (logits.__setitem__(slice(0, 3), -1e9), logits)[1]  # noqa: E731

    def run(spec):
        sampler = Sampler(SamplingParams())
        steps = step_generator(engine, prompt, sampler, logits_processors=[ban], logprobs=2, speculative=spec)
        out = [next(steps) for _ in range(60)]
        steps.close()
        return out

    want, got = run(None), run(SpeculativeDecoder(PromptLookup(), k=5, adaptive=False))
    assert [s.token for s in got] == [s.token for s in want]
    for a, b in zip(got, want, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t for t, _ in a.top_logprobs] == [t for t, _ in b.top_logprobs]


def test_a_constraint_that_forces_tokens_is_decoded_plainly(tied_bundle):
    """speculative_generate_step refuses a processor that forces tokens; step_generator (stream_generate's
    choice) decodes such a reply with generate_step, speculation unused."""

    class Forcing:  # a constraint's shape (constrain.Constraint): it may force tokens, here never does
        def __call__(self, reply, logits):
            return logits

        def forced_tokens(self, reply):
            return []

    engine = load(tied_bundle, SMALL)
    prompt = repetitive_prompt(320)
    spec = SpeculativeDecoder(PromptLookup(), k=4, adaptive=False, exact=False)
    with pytest.raises(SpeculativeError, match="forces tokens"):
        next(speculative_generate_step(engine, prompt, Sampler(SamplingParams()), spec, logits_processors=[Forcing()]))
    steps = step_generator(engine, prompt, Sampler(SamplingParams()), logits_processors=[Forcing()], speculative=spec)
    got = [next(steps).token for _ in range(40)]
    steps.close()
    assert got == greedy(engine, prompt, 40) and spec.stats.proposed == 0


# -- the rejection rule samples the target's distribution ---------------------------------------------


def chi2_upper(df: int) -> float:
    """The chi-square distribution's 99.99th percentile (Wilson-Hilferty): a false alarm 1 in 10^4."""
    z = 3.719
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(counts: Counter, probs: dict, n: int) -> tuple[float, int]:
    """Pearson's statistic over the cells expected 5+ times (the rest pooled into one cell), and its df."""
    big = [c for c, p in probs.items() if p * n >= 5]
    stat, rest_obs, rest_exp = 0.0, n - sum(counts[c] for c in big), n - sum(probs[c] * n for c in big)
    for c in big:
        stat += (counts[c] - probs[c] * n) ** 2 / (probs[c] * n)
    cells = len(big)
    if rest_exp >= 5:
        stat, cells = stat + (rest_obs - rest_exp) ** 2 / rest_exp, cells + 1
    else:
        assert rest_obs <= max(5, 3 * rest_exp), "tokens outside the target's support"
    return stat, cells - 1


@pytest.mark.parametrize(
    "p, q",
    [
        ([0.5, 0.2, 0.15, 0.1, 0.05, 0.0], [0.1, 0.1, 0.1, 0.2, 0.2, 0.3]),  # q puts mass where p has none
        ([0.05, 0.05, 0.9, 0.0, 0.0, 0.0], [0.9, 0.05, 0.05, 0.0, 0.0, 0.0]),
        ([0.3, 0.3, 0.4, 0.0, 0.0, 0.0], [0.3, 0.3, 0.4, 0.0, 0.0, 0.0]),  # q == p: always accepted
    ],
)
def test_the_rejection_rule_outputs_the_target_distribution(p, q):
    p, q = np.array(p), np.array(q)
    sampler = Sampler(SamplingParams(temperature=1.0, seed=11))
    draft = np.random.default_rng(12)
    n = 20000
    out, kept = Counter(), 0
    for _ in range(n):
        d = int(draft.choice(q.size, p=q))
        accepted, token = rejection_sample(p, q, d, sampler)
        out[token] += 1
        kept += accepted
    stat, df = chi2(out, dict(enumerate(p)), n)
    assert stat < chi2_upper(df)
    assert kept / n == pytest.approx(np.minimum(p, q).sum(), abs=0.02)  # the rule's acceptance rate


def test_sampled_draft_replies_follow_the_target_distribution(tied_bundle):
    """End to end on the tiny model with a draft that disagrees (a 4-token window): the joint distribution of
    the reply's first three tokens (the last two decided by verification) is the target's."""
    target = load(tied_bundle)
    draft = DraftModel(load(tied_bundle, LoadOptions(window=4)))
    prompt = np.random.default_rng(5).integers(3, 320, 14).tolist()  # longer than the draft's 4 + 4
    params = SamplingParams(temperature=1.0, top_k=3)
    spec = SpeculativeDecoder(draft, k=2, adaptive=False)
    n = 300
    seen: Counter = Counter()
    for seed in range(n):
        steps = step_generator(target, prompt, Sampler(dataclasses.replace(params, seed=seed)), speculative=spec)
        seen[tuple(next(steps).token for _ in range(3))] += 1
        steps.close()

    # The exact joint from the target's own rows: P(a) P(b | a) P(c | a, b).
    def dist(ids):
        target.reset()
        return rows.probabilities(target.prefill(ids))

    probs = {}
    rows = Sampler(params)
    pa = dist(prompt)
    for a in np.flatnonzero(pa):
        pb = dist([*prompt, a])
        for b in np.flatnonzero(pb):
            pc = dist([*prompt, a, b])
            for c in np.flatnonzero(pc):
                probs[(int(a), int(b), int(c))] = pa[a] * pb[b] * pc[c]
    stat, df = chi2(seen, probs, n)
    assert stat < chi2_upper(df), (stat, df)
    st = spec.stats
    assert 0 < st.accepted < st.proposed  # both branches of the rule ran


# -- bad input: one typed line -------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, -2, 2.5])
def test_k_below_one_is_refused(k):
    with pytest.raises(SpeculativeError, match="integer >= 1") as e:
        SpeculativeDecoder(PromptLookup(), k=k)
    assert "\n" not in str(e.value)


def test_k_above_the_slack_is_refused(tied_bundle):
    engine = load(tied_bundle, LoadOptions(slack=4))
    with pytest.raises(SpeculativeError, match="exceed the target ring's 4 slack rows") as e:
        greedy(engine, [5, 6, 7], 3, SpeculativeDecoder(PromptLookup(), k=5))
    assert "\n" not in str(e.value)
    draft = DraftModel(load(tied_bundle, LoadOptions(slack=2)))
    with pytest.raises(SpeculativeError, match="draft ring's 2 slack rows"):
        greedy(engine, [5, 6, 7], 3, SpeculativeDecoder(draft, k=3))


def test_a_draft_of_another_vocabulary_or_tokenizer_is_refused(tied_bundle, demo):
    target = load(tied_bundle)
    with pytest.raises(DraftMismatchError, match="vocabulary of 4096 tokens, the target 320") as e:
        greedy(target, [5, 6, 7], 3, SpeculativeDecoder(DraftModel(load(demo)), k=2))
    assert "\n" not in str(e.value)
    m = target.manifest
    other = dataclasses.replace(m, files={**m.files, m.tokenizer.file: "0" * 64})
    with pytest.raises(DraftMismatchError, match="tokenizer differs"):
        check_draft(m, other)


def test_resolve_names_what_it_takes():
    assert isinstance(resolve("lookup").proposer, PromptLookup)
    with pytest.raises(SpeculativeError, match="'lookup' or a SpeculativeDecoder"):
        resolve("ngram")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--speculative", "lookup", "--draft-tokens", "0"], "integer >= 1"),
        (["--speculative", "lookup", "--draft-tokens", "500"], "slack rows"),
        (["--draft-tokens", "3"], "needs --speculative lookup or --draft"),
        (["--draft", "DEMO"], "vocabulary of 4096 tokens"),
    ],
)
def test_edge_run_refuses_bad_speculation_in_one_line(tied_bundle, demo, args, needle):
    from click.testing import CliRunner

    from edge_runtime.cli.run import main

    args = [str(demo) if a == "DEMO" else a for a in args]
    r = CliRunner().invoke(main, ["--bundle", str(tied_bundle), "--target", "x86", "--prompt", "a b", *args])
    assert r.exit_code == 1
    lines = [line for line in r.output.splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and needle in lines[0], r.output


def test_edge_run_speculative_lookup_prints_the_plain_text(tied_bundle):
    from click.testing import CliRunner

    from edge_runtime.cli.run import main

    base = ["--bundle", str(tied_bundle), "--target", "x86", "--prompt", "a b a b a b", "--max-tokens", "24", "--json"]
    base += ["--temperature", "0"]
    plain = json.loads(CliRunner().invoke(main, base).output)
    fast = json.loads(CliRunner().invoke(main, [*base, "--speculative", "lookup"]).output)
    assert fast["token_ids"] == plain["token_ids"] and fast["text"] == plain["text"]


needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"{kernels.unavailable_reason()}")


@pytest.fixture(scope="module")
def edge_int4(demo_bundles):
    """The demo model at INT4 block 32 on edge-runtime's kernels (LinearAttention, then RingAttention; the LM head
    at int8: MatMulQ8)."""
    return demo_bundles["int4-edge"]


def _chunk_calls(engine) -> list[tuple[int, bool]]:
    """Record (rows, ring_full) of every multi-token graph call the engine makes from now on."""
    calls, run_chunk = [], engine.backend.run_chunk

    def recording(ids, plan, keep):
        calls.append((len(ids), bool(plan.ring_full)))
        return run_chunk(ids, plan, keep)

    engine.backend.run_chunk = recording
    return calls


@needs_kernels
def test_edge_int4_chunks_are_decode_steps_bit_for_bit_across_the_wrap(edge_int4):
    """A prefill chunk as wide as this CPU's kernels keep exact (9 rows, or engine.exact_rows: 4 on AVX2)
    gives logits equal to decode()'s of the same tokens bit for bit while the ring is linear, in the chunk
    that turns it full (its first rows still linear), past S + W - 1 and past the buffer's wrap:
    RingAttention computes each row as a one-row call does."""
    engine = load(edge_int4, SMALL)
    width = min(9, engine.exact_rows or 9)
    assert width > 1 and kernels.RING_ATTENTION in engine.backend.kernel_ops()
    ids = np.random.default_rng(1).integers(3, engine.manifest.model.vocab_size, 80).tolist()
    calls = _chunk_calls(engine)
    for start in (10, 24, 27, 30, 40, 60):  # S + W = 28, capacity 36
        engine.reset()
        engine.prefill(ids[:start])
        del calls[:]
        chunk = engine.prefill(ids[start : start + width], all_logits=True)
        assert all(full == (start + width > SMALL.sinks + SMALL.window) for _, full in calls)
        engine.reset()
        engine.prefill(ids[:start])
        steps = np.stack([engine.decode(t).copy() for t in ids[start : start + width]])
        assert np.array_equal(chunk, steps), f"chunk at token {start}: {np.abs(chunk - steps).max():.3g} apart"


@needs_kernels
def test_edge_int4_verification_chunks_are_decode_steps_bit_for_bit(edge_int4):
    """On the edge kernels a verification chunk is as wide as engine.exact_rows allows (VNNI's MatMulQ4
    any width, with MatMulQ8's LM head 16 rows; AVX2's MatMulQ4 4 rows), and greedy speculation with k = 8
    equals plain greedy on a small ring wrapped several times: past S + W - 1 RingAttention computes a
    chunk's rows as decode steps do, bit for bit."""
    engine = load(edge_int4, SMALL)
    assert engine.backend.kernel_ops() >= {kernels.MATMUL_Q4, kernels.MATMUL_Q8, kernels.RING_ATTENTION}
    cap = {"amx": 16, "avx512vnni": 16, "avx2": 4}[kernels.isa()]
    assert engine.exact_rows == min(cap, SMALL.slack + 1)  # measured up to the widest chunk the slack allows
    prompt = repetitive_prompt(engine.manifest.model.vocab_size)
    want = greedy(engine, prompt, 96)
    spec = SpeculativeDecoder(PromptLookup(), k=8, adaptive=False)
    calls = _chunk_calls(engine)
    assert greedy(engine, prompt, 96, spec) == want
    st = spec.stats
    assert engine.ring.written > 3 * engine.geometry.capacity  # the ring wrapped three times
    # Lookup proposes fewer than k where its match runs out (6.5 a step of 8 on VNNI): half the cap is plenty
    assert st.verify_steps > 5 and st.proposed / st.verify_steps > min(8, cap - 1) / 2
    prefill = int(np.searchsorted(np.cumsum([rows for rows, _ in calls]), len(prompt))) + 1  # the prompt's chunks
    verified = [rows for rows, full in calls[prefill:] if rows > 1 and full]
    assert len(verified) > 5 and max(verified) == min(9, cap)  # on the full ring as wide as the cap, never past it


def test_speculation_is_off_with_a_warning_where_no_two_rows_round_alike(tied_bundle, monkeypatch):
    """Where the bundle's kernels keep only one row exact, exact speculation does not verify at all (one
    warning) and the output is plain greedy's; exact=False speculates anyway."""
    from edge_runtime.engine import Engine

    engine = load(tied_bundle, SMALL)
    monkeypatch.setattr(Engine, "exact_rows", property(lambda self: 1))
    prompt = repetitive_prompt(engine.manifest.model.vocab_size)
    want = greedy(engine, prompt, 20)
    spec = SpeculativeDecoder(PromptLookup(), k=8, adaptive=False)
    with pytest.warns(SpeculationOffWarning, match="speculation is off"):
        assert greedy(engine, prompt, 20, spec) == want
    assert spec.stats.verify_steps == 0
    loose = SpeculativeDecoder(PromptLookup(), k=8, adaptive=False, exact=False)
    greedy(engine, prompt, 20, loose)
    assert loose.stats.verify_steps > 0


def test_a_draft_catching_up_reports_it_and_sleeps_between_calls(tied_bundle):
    """The first proposal after a long context feeds the draft the whole context: that catch-up is
    reported apart (the decoder leaves it out of the step's gain, or a draft's first probe always loses);
    a step in step feeds 1-2 tokens and reports none. from_options loads a draft whose threads sleep."""
    from edge_runtime.speculative import from_options

    target = load(tied_bundle, SMALL)
    draft = DraftModel(load(tied_bundle, dataclasses.replace(SMALL, spin=False)))
    context = repetitive_prompt(320)[:20]
    draft.start(target, context, SamplingParams())
    first = draft.propose(lambda arm: 3)
    assert len(first.tokens) == 3 and first.catch_up_s > 0
    draft.advance([first.tokens[0], 7], 1)
    assert draft.propose(lambda arm: 3).catch_up_s == 0.0
    spec = from_options(target, None, tied_bundle, 2)
    options = spec.proposer.engine.backend.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
