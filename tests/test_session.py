"""Sessions: a conversation kept in the ring across turns, prefix match, rollback, snapshots,
logprobs and logits processors, against full re-prefills and the StreamingLLM reference."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_runtime import kernels
from edge_runtime.engine import LoadOptions, load
from edge_runtime.errors import (
    CorruptSnapshotError,
    RingOverflowError,
    RollbackError,
    SessionError,
    SnapshotMismatchError,
)
from edge_runtime.exporters import ReferenceModel, load_checkpoint
from edge_runtime.exporters.decoder import Flavor
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.reference import StreamingReference, log_softmax
from edge_runtime.generate import generate_step, stream_generate
from edge_runtime.models import DEMO_CHECKPOINT
from edge_runtime.sampling import Sampler, SamplingParams
from edge_runtime.session import RingOverflowWarning, Session
from edge_runtime.snapshot import Snapshot
from edge_runtime.tokenizer import Tokenizer

from .tiny_models import save_tiny_checkpoint

VOCAB = 320
NO_STOP: tuple[int, ...] = ()


@pytest.fixture(scope="module")
def tiny(tied_bundle, tmp_path_factory):
    """The float64 reference of conftest's tied tiny llama (the same seeded checkpoint, saved again) and
    its bundle."""
    d = tmp_path_factory.mktemp("ckpt")
    save_tiny_checkpoint("llama-tied", d)
    ckpt = load_checkpoint(d)
    return ReferenceModel(ckpt.args, ckpt.weights), tied_bundle, d


@pytest.fixture(scope="module")
def bundles(tiny, tmp_path_factory):
    """The same checkpoint in both graph flavors (`trt` copies each new row into the ring host-side)."""
    out = tmp_path_factory.mktemp("trt") / "b"
    export(ExportOptions(checkpoint=tiny[2], out=out, window=200, flavor=Flavor.TRT))
    return {"ort": tiny[1], "trt": out}


def rng_ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def reply(session: Session, ids, n: int, **kw) -> list[int]:
    return [s.token for s in session.send(ids, max_tokens=n, stop_ids=NO_STOP, **kw)]


def fresh_greedy(engine, prompt, n: int) -> list[int]:
    steps = generate_step(engine, prompt, Sampler(SamplingParams()))
    return [next(steps).token for _ in range(n)]


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


# -- turns -------------------------------------------------------------------------------------------


def test_under_capacity_turns_equal_a_full_reprefill(tied_bundle):
    session, fresh = Session(load(tied_bundle)), load(tied_bundle)
    conversation: list[int] = []
    for turn in range(6):
        user = rng_ids(turn, 7 + 3 * turn)
        got = reply(session, user, 8)
        conversation += user
        assert got == fresh_greedy(fresh, conversation, 8), f"turn {turn}"
        conversation += got
        assert session.length == len(conversation) and session.pending == got[-1]
        assert session.evicted == 0 and session.held == len(conversation)
        before = len(conversation) - len(user) - 8
        assert session.last_cached == max(0, before - 1)  # all but the last reply's pending token was reused
        assert session.last_fed == len(user) + (turn > 0)
    assert session.position == len(conversation)


@pytest.mark.parametrize("flavor", ["ort", "trt"])
def test_past_capacity_every_step_matches_streamingllm(tiny, bundles, flavor):
    """12 turns through a 4 + 24 window: the logits of every sampled step equal the StreamingLLM
    transcription of the same token stream."""
    model, bundle = tiny[0], bundles[flavor]
    engine = load(bundle, LoadOptions(sinks=4, window=24, slack=5, position_offset=1000))
    session = Session(engine)
    stream = StreamingReference(model, 4, 24)
    seen: list[np.ndarray] = []

    def record(_reply, logits):
        seen.append(logits.copy())
        return logits

    stream_ids: list[int] = []
    pending: list[int] = []  # the last reply token: fed at the start of the next turn
    with warnings.catch_warnings():
        warnings.simplefilter("error", RingOverflowWarning)  # no turn here exceeds the window
        for turn in range(12):
            seen.clear()
            user = rng_ids(100 + turn, 5 + turn % 4)
            got = reply(session, user, 6, logits_processors=[record])
            want = [stream.step(t) for t in pending + user][-1:] + [stream.step(t) for t in got[:-1]]
            pending = got[-1:]
            stream_ids += user + got
            errs = [rel(a, b) for a, b in zip(seen, want, strict=True)]
            assert max(errs) <= 1e-4, f"turn {turn}: {max(errs):.2e}"
    assert session.length == len(stream_ids) > 4 + 24 + 5
    assert session.evicted == session.length - (4 + 24 - 1) and session.held == 4 + 23
    assert session.position == 1000 + len(stream_ids)


def test_a_turn_longer_than_the_window_is_chunked_with_a_warning_or_refused(tiny):
    model, bundle, _ = tiny
    engine = load(bundle, LoadOptions(sinks=4, window=16, slack=3))
    session = Session(engine)
    user = rng_ids(7, 40)
    with pytest.warns(RingOverflowWarning, match="first 20 tokens leave the window"):
        got = reply(session, user, 1)
    stream = StreamingReference(model, 4, 16)
    want = [stream.step(t) for t in user][-1]
    assert got == [int(np.argmax(want))]
    strict = Session(load(bundle, LoadOptions(sinks=4, window=16, slack=3)), overflow="refuse")
    with pytest.raises(RingOverflowError, match="exceeds the window of 16"):
        reply(strict, user, 1)
    assert strict.length == 0  # refused before anything was fed


def test_prefix_match_feeds_only_the_new_tokens(tied_bundle):
    session = Session(load(tied_bundle))
    system, user = rng_ids(1, 30), rng_ids(2, 10)
    answer = reply(session, system + user, 5)
    conversation = system + user + answer + rng_ids(3, 6)
    assert session.match(conversation) == conversation[-6:]
    assert session.length == len(system + user + answer)
    # An edited turn: rolls back to the edit.
    edited = system + rng_ids(4, 10)
    assert session.match(edited) == edited[30:] and session.length == 30
    # A shorter conversation (a regenerate): rolls back; nothing new, so the last token is re-run.
    assert session.match(system) == []
    got = reply(session, [], 4)
    assert got == fresh_greedy(load(tied_bundle), system, 4)


def test_prefix_match_past_capacity_checks_the_evicted_tokens(tied_bundle):
    session = Session(load(tied_bundle, LoadOptions(sinks=4, window=16, slack=3)))
    conversation = rng_ids(5, 60)
    with pytest.warns(RingOverflowWarning):
        session.prefill(conversation)
    assert session.match([*conversation, 9, 10]) == [9, 10]  # whole stream agrees
    edited = list(conversation)
    edited[10] = (edited[10] + 1) % VOCAB  # inside the evicted part: nothing can be reused
    assert session.match(edited) == edited and session.length == 0
    with pytest.warns(RingOverflowWarning):
        session.prefill(conversation)
    edited = [*conversation[:-3], 7, 7, 7]  # in the slack: rolled back
    assert session.match(edited) == [7, 7, 7] and session.length == 57


# -- rollback ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_engines(tied_bundle):
    opts = LoadOptions(sinks=2, window=12, slack=6)
    return load(tied_bundle, opts), load(tied_bundle, opts)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prefix=st.integers(1, 70),
    dropped=st.integers(1, 12),
    k_extra=st.integers(0, 3),
    then=st.integers(1, 5),
    seed=st.integers(0, 1000),
)
def test_truncate_equals_a_session_that_never_saw_the_tokens(small_engines, prefix, dropped, k_extra, then, seed):
    """Feed a prefix, then `dropped` tokens (fed or replied), truncate them, continue: the same tokens
    and logits as a session fed only the prefix, also after the 2 + 18-row ring wrapped (prefix > 20)."""
    a, b = Session(small_engines[0]), Session(small_engines[1])
    ids = rng_ids(seed, prefix + dropped + then)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RingOverflowWarning)
        a.prefill(ids[:prefix])
        b.prefill(ids[:prefix])
        extra = ids[prefix : prefix + dropped]
        if k_extra:  # some of the dropped tokens are a reply (one of them pending)
            extra = extra[: max(0, dropped - k_extra)]
            reply(a, extra, dropped - len(extra))
        else:
            a.prefill(extra)
        assert a.length == prefix + dropped
        if dropped > a.rollback_limit:
            with pytest.raises(RollbackError, match="at most"):
                a.truncate(dropped)
            return
        a.truncate(dropped)
        assert a.length == prefix
        cont = ids[prefix + dropped :]
        seen_a, seen_b = [], []
        got_a = reply(a, cont, 4, logits_processors=[lambda _r, x: seen_a.append(x.copy()) or x])
        got_b = reply(b, cont, 4, logits_processors=[lambda _r, x: seen_b.append(x.copy()) or x])
    assert got_a == got_b
    # The dropped rows are masked or never read; what remains is float noise where a kept token's row was
    # computed in another chunk (a reply with no new tokens re-runs the last one), else bit for bit.
    assert max(rel(x, y) for x, y in zip(seen_a, seen_b, strict=True)) <= 1e-5


def test_truncate_beyond_the_slack_is_refused_after_wraparound(tied_bundle):
    session = Session(load(tied_bundle, LoadOptions(sinks=2, window=12, slack=6)))
    session.prefill(rng_ids(9, 11))
    assert session.rollback_limit == 11  # no row reused yet: everything
    reply(session, rng_ids(10, 8), 30)  # 49 tokens through 2 + 18 rows
    assert session.rollback_limit == 7 + 1  # slack + 1 in the ring, and the pending token
    with pytest.raises(RollbackError, match="at most 7 can be dropped exactly"):
        session.truncate(9)
    session.truncate(5)
    with pytest.raises(RollbackError):
        session.truncate(4)  # what the first rollback used is not free again until re-fed
    session.truncate(3)
    assert session.rollback_limit == 0
    with pytest.raises(SessionError, match="send at least one token"):
        reply(session, [], 1)
    session.truncate(session.length)  # everything: a reset
    assert session.length == 0


# -- snapshots -----------------------------------------------------------------------------------------


def test_snapshot_round_trip_in_memory_and_on_disk(tied_bundle, tmp_path):
    system, user = rng_ids(11, 40), rng_ids(12, 9)
    session = Session(load(tied_bundle))
    session.prefill(system)
    snap = session.snapshot()
    snap.save(tmp_path / "system.snap")
    want = reply(session, user, 10)
    assert want == fresh_greedy(load(tied_bundle), system + user, 10)
    session.restore(snap)
    assert session.length == 40 and reply(session, user, 10) == want
    other = Session(load(tied_bundle))
    other.load(str(tmp_path / "system.snap"))
    assert other.length == 40 and reply(other, user, 10) == want


def test_snapshot_past_capacity_keeps_the_digest_and_rollback(tied_bundle, tmp_path):
    opts = LoadOptions(sinks=2, window=12, slack=6)
    session = Session(load(tied_bundle, opts))
    ids = rng_ids(13, 80)
    with pytest.warns(RingOverflowWarning):
        session.prefill(ids)
    session.save(str(tmp_path / "s"))
    other = Session(load(tied_bundle, opts))
    other.load(str(tmp_path / "s"))
    assert other.match([*ids, 5]) == [5]  # the evicted part still checks out
    other.truncate(3)
    session.truncate(3)
    assert reply(other, [4], 5) == reply(session, [4], 5)


def test_snapshot_of_another_bundle_or_geometry_is_refused(tied_bundle, tmp_path_factory, tmp_path):
    d = tmp_path_factory.mktemp("ckpt2")
    save_tiny_checkpoint("llama-tied", d, seed=1)
    other_bundle = tmp_path_factory.mktemp("b2") / "b"
    export(ExportOptions(checkpoint=d, out=other_bundle, window=200))
    session = Session(load(tied_bundle))
    session.prefill(rng_ids(14, 20))
    session.save(str(tmp_path / "s"))
    with pytest.raises(SnapshotMismatchError, match="another bundle"):
        Session(load(other_bundle)).load(str(tmp_path / "s"))
    with pytest.raises(SnapshotMismatchError, match=r"window=200.*window=48"):
        Session(load(tied_bundle, LoadOptions(window=48))).load(str(tmp_path / "s"))


def test_truncated_or_altered_snapshot_file_is_refused(tied_bundle, tmp_path):
    session = Session(load(tied_bundle))
    session.prefill(rng_ids(15, 20))
    path = tmp_path / "s"
    session.save(str(path))
    data = path.read_bytes()
    for cut, message in [(len(data) - 7, "truncated: .* payload bytes"), (40, "truncated"), (10, "not an edge")]:
        path.write_bytes(data[:cut])
        with pytest.raises(CorruptSnapshotError, match=message):
            Snapshot.load(path)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptSnapshotError, match="checksum"):
        Snapshot.load(path)
    with pytest.raises(CorruptSnapshotError, match="cannot read"):
        Snapshot.load(tmp_path / "missing")
    assert session.length == 20


# -- the sampling loop ---------------------------------------------------------------------------------


def test_logprobs_are_the_log_softmax_of_the_logits(tied_bundle):
    session = Session(load(tied_bundle))
    seen: list[np.ndarray] = []
    steps = list(
        session.send(rng_ids(16, 12), SamplingParams(temperature=0.8, seed=3), max_tokens=6, stop_ids=NO_STOP,
                     logprobs=4, logits_processors=[lambda _r, x: seen.append(x.copy()) or x])
    )  # fmt: skip
    for step, logits in zip(steps, seen, strict=True):
        want = log_softmax(logits.astype(np.float64))
        assert step.logprob == pytest.approx(want[step.token], abs=1e-9)
        best = np.argsort(-want, kind="stable")[:4]
        assert [t for t, _ in step.top_logprobs] == best.tolist()
        assert [lp for _, lp in step.top_logprobs] == pytest.approx(want[best].tolist(), abs=1e-9)
    fresh = load(tied_bundle)
    assert rel(seen[0], fresh.prefill(rng_ids(16, 12))) <= 1e-6  # the processor saw the model's logits


def test_a_logits_processor_that_bans_a_token_is_honoured(tied_bundle):
    prompt = rng_ids(17, 10)
    free = fresh_greedy(load(tied_bundle), prompt, 12)
    banned = max(set(free), key=free.count)

    def ban(_reply, logits):
        logits[banned] = -np.inf
        return logits

    session = Session(load(tied_bundle))
    got = reply(session, prompt, 12, logits_processors=[ban])
    assert banned not in got and got != free
    sampled = reply(Session(load(tied_bundle)), prompt, 40, sampling=SamplingParams(temperature=2.0, seed=1),
                    logits_processors=[ban])  # fmt: skip
    assert banned not in sampled


def test_greedy_without_processors_keeps_the_fused_argmax(tied_bundle):
    """A graph's fused argmax is used exactly when nothing needs the logits (faked here: the tiny fp32
    graph has none, so the pool's next_token stays 0)."""
    engine = load(tied_bundle)
    engine.pool.next_token = np.zeros((1, 1, 1), np.int64)
    prompt = rng_ids(18, 8)
    fast = fresh_greedy(engine, prompt, 5)
    assert fast[1:] == [0, 0, 0, 0]
    steps = generate_step(engine, prompt, Sampler(SamplingParams()), logits_processors=[lambda _r, x: x])
    assert [next(steps).token for _ in range(5)] != fast
    steps = generate_step(engine, prompt, Sampler(SamplingParams()), logprobs=0)
    assert [next(steps).token for _ in range(5)] != fast


def test_stream_generate_continues_a_session(tied_bundle):
    engine = load(tied_bundle)
    tok = Tokenizer(engine.bundle.tokenizer_file, engine.manifest.tokenizer)
    session = Session(engine)
    first = list(stream_generate(session, tok, "To be, or not", None))
    assert first[-1].stats is not None and session.length > 0
    cached = session.length
    list(stream_generate(session, tok, tok.encode(" that is"), None))
    assert session.last_cached == cached - 1  # everything but the pending reply token was in the ring


def test_a_session_owns_its_engine(tied_bundle):
    engine = load(tied_bundle)
    session = Session(engine)
    session.prefill([5, 6, 7])
    engine.prefill([8])  # behind the session's back
    with pytest.raises(SessionError, match="driven outside this session"):
        session.prefill([9])
    session.reset()
    old = session.send([5, 6], max_tokens=10, stop_ids=NO_STOP)
    next(old)
    new = session.send([7], max_tokens=3, stop_ids=NO_STOP)
    next(new)
    with pytest.raises(SessionError, match="superseded"):
        next(old)


@pytest.fixture(scope="module")
def demo_int4(tmp_path_factory):
    """The demo model as an int4 bundle; with edge-runtime's kernels its LM head leaves the fused argmax."""
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod

    kernel = MatMulKernel.EDGE if kernels.available() else MatMulKernel.MLAS
    out = tmp_path_factory.mktemp("demo") / "int4"
    export(ExportOptions(checkpoint=DEMO_CHECKPOINT, out=out, quant=QuantConfig(QuantMethod.INT4, 32, kernel=kernel)))
    return out


def test_demo_model_turns_equal_a_full_reprefill(demo_int4):
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer.from_file(str(DEMO_CHECKPOINT / "tokenizer.json"))
    turns = ["ROMEO.\nWhat light through yonder window breaks?\n", "JULIET.\nAy me!\n", "ROMEO.\nShe speaks.\n"]
    session, fresh = Session(load(demo_int4)), load(demo_int4)
    assert session.engine.fused_argmax == kernels.available()  # greedy replies take the graph's argmax
    conversation: list[int] = []
    for text in turns * 2:
        user = tok.encode(text).ids
        got = reply(session, user, 24)
        conversation += user
        assert got == fresh_greedy(fresh, conversation, 24)
        conversation += got
    assert session.length == len(conversation) and session.evicted == 0
