"""Generation layers: sampling, stop conditions, incremental detokenization, cancellation, the CLI."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime.cli.run import main as run_cli
from edge_runtime.engine import load
from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.generate import GenerationCancelled, GenerationConfig, StopMatcher, generate, stream_generate
from edge_runtime.sampling import Sampler, SamplingParams
from edge_runtime.tokenizer import StreamingDetokenizer, Tokenizer


@pytest.fixture(scope="module")
def bundle(tied_bundle):
    return tied_bundle


@pytest.fixture
def engine_tok(bundle):
    engine = load(bundle)
    return engine, Tokenizer(engine.bundle.tokenizer_file, engine.manifest.tokenizer)


# -- sampling ------------------------------------------------------------------------------------


def test_greedy_and_top_k_1_agree():
    logits = np.random.default_rng(0).normal(size=50)
    assert Sampler(SamplingParams())(logits) == int(np.argmax(logits))
    assert Sampler(SamplingParams(temperature=1.5, top_k=1, seed=3))(logits) == int(np.argmax(logits))


def test_seed_makes_sampling_reproducible():
    logits = np.random.default_rng(1).normal(size=200)
    a = [Sampler(SamplingParams(temperature=1.0, seed=7)) for _ in range(2)]
    assert [a[0](logits) for _ in range(20)] == [a[1](logits) for _ in range(20)]
    s1, s2 = Sampler(SamplingParams(temperature=1.0, seed=1)), Sampler(SamplingParams(temperature=1.0, seed=2))
    assert [s1(logits) for _ in range(20)] != [s2(logits) for _ in range(20)]


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    s = Sampler(SamplingParams(temperature=1.0, top_p=0.7, seed=0))
    assert set(s(logits) for _ in range(300)) == {0, 1}


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    logits = np.log(np.array([0.6, 0.3, 0.07, 0.03]))
    s = Sampler(SamplingParams(temperature=1.0, min_p=0.2, seed=0))
    assert set(s(logits) for _ in range(300)) == {0, 1}


def test_repetition_penalty_discourages_seen_tokens():
    logits = np.array([2.0, 1.9, -1.0])
    assert Sampler(SamplingParams())(logits, history=[0]) == 0
    assert Sampler(SamplingParams(repetition_penalty=1.5))(logits, history=[0]) == 1
    assert logits[0] == 2.0  # the caller's logits (a pool view at run time) are not modified


@pytest.mark.parametrize(
    "kwargs", [{"temperature": -1}, {"top_p": 0}, {"min_p": 1.0}, {"top_k": -2}, {"repetition_penalty": 0}]
)
def test_bad_sampling_values_are_named(kwargs):
    with pytest.raises(EdgeRuntimeError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)


# -- stop strings and detokenizer ----------------------------------------------------------------


def test_stop_string_across_pieces_is_held_back_and_cut():
    m = StopMatcher(["END"])
    assert m.push("hello E") == ("hello ", False)  # "E" may start "END": held back
    assert m.push("N") == ("", False)
    assert m.push("D and more") == ("", True)
    m = StopMatcher(["END"])
    assert m.push("hello E") == ("hello ", False)
    assert m.push("X") == ("EX", False)  # not a stop after all: released


def test_detokenizer_never_emits_broken_utf8(engine_tok):
    _, tok = engine_tok
    text = "naïve café — 東京 🙂 done"
    ids = tok._tok.encode(text, add_special_tokens=False).ids
    detok = StreamingDetokenizer(tok)
    pieces = [detok.add(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids) == text
    assert len(detok.ids) == 0
    assert sum(1 for p in pieces if p == "") > 0  # some tokens were partial characters, held back


def test_detokenizer_memory_stays_bounded(engine_tok):
    _, tok = engine_tok
    detok = StreamingDetokenizer(tok)
    ids = tok._tok.encode("to be or not to be " * 200, add_special_tokens=False).ids
    for i in ids:
        detok.add(i)
    assert len(detok.ids) < 8


def test_detokenizer_stays_bounded_on_tokens_that_decode_to_nothing(engine_tok):
    _, tok = engine_tok
    special = [i for i in tok.spec.eos_token_ids if tok.decode([i]) == ""]  # skipped by decode
    assert special
    ids = tok._tok.encode("naïve café 東京", add_special_tokens=False).ids
    detok = StreamingDetokenizer(tok)
    pieces = [detok.add(ids[0])]
    for _ in range(500):  # a long run of skipped specials mid-stream, between a word and the rest
        pieces.append(detok.add(special[0]))
        assert len(detok.ids) < 8
    pieces += [detok.add(i) for i in ids[1:]] + [detok.flush()]
    assert "".join(pieces) == tok.decode(ids)


# -- generate / stream_generate ------------------------------------------------------------------


def test_max_tokens_and_stats(engine_tok):
    engine, tok = engine_tok
    r = generate(engine, tok, "To be", GenerationConfig(max_tokens=12, stop_on_eos=False))
    assert len(r.token_ids) == 12 and r.stats.finish_reason == "length"
    assert r.prompt_token_ids[0] == 0 and r.stats.prompt_tokens == len(r.prompt_token_ids)
    assert r.text == tok.decode(r.token_ids)
    s = r.stats
    assert s.ttft_s > 0 and s.decode_tps > 0 and s.itl_ms["p50"] <= s.itl_ms["p90"] <= s.itl_ms["p99"]
    assert s.peak_rss_bytes > 10 * 2**20


def test_stream_events_carry_text_and_timings(engine_tok):
    engine, tok = engine_tok
    events = list(stream_generate(engine, tok, "To be", GenerationConfig(max_tokens=6, stop_on_eos=False)))
    assert [e.index for e in events] == list(range(6))
    assert all(e.finish_reason is None for e in events[:-1]) and events[-1].stats is not None
    assert all(b.elapsed_s >= a.elapsed_s for a, b in itertools.pairwise(events))


def test_eos_stops_generation(engine_tok, monkeypatch):
    engine, tok = engine_tok
    greedy = generate(engine, tok, "To be", GenerationConfig(max_tokens=8, stop_on_eos=False)).token_ids
    m = engine.manifest
    monkeypatch.setattr(engine, "manifest", replace(m, tokenizer=replace(m.tokenizer, eos_token_ids=[greedy[2]])))
    r = generate(engine, tok, "To be", GenerationConfig(max_tokens=8))
    assert r.stats.finish_reason == "eos" and r.token_ids == greedy[: greedy.index(greedy[2]) + 1]


def test_eos_releases_the_text_held_back_for_a_stop_string(engine_tok, monkeypatch):
    """The reply's last character, held back as the possible start of a stop string, is still part of the reply
    when EOS comes instead (as when max_tokens does)."""
    engine, tok = engine_tok
    ids = generate(engine, tok, "To be", GenerationConfig(max_tokens=12, stop_on_eos=False)).token_ids
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])  # EOS from here on: the first of its kind
    said = generate(engine, tok, "To be", GenerationConfig(max_tokens=k, stop_on_eos=False)).text
    m = engine.manifest
    monkeypatch.setattr(engine, "manifest", replace(m, tokenizer=replace(m.tokenizer, eos_token_ids=[ids[k]])))
    r = generate(engine, tok, "To be", GenerationConfig(max_tokens=12, stop_strings=(said[-1] + "\x00",)))
    assert r.stats.finish_reason == "eos" and r.text == said


def test_stop_string_stops_and_is_not_emitted(engine_tok):
    engine, tok = engine_tok
    full = generate(engine, tok, "To be", GenerationConfig(max_tokens=30, stop_on_eos=False)).text
    stop = full[5:8]
    r = generate(engine, tok, "To be", GenerationConfig(max_tokens=30, stop_on_eos=False, stop_strings=(stop,)))
    assert r.stats.finish_reason == "stop" and r.text == full[: full.find(stop)]


def test_same_seed_same_text(engine_tok):
    engine, tok = engine_tok
    cfg = GenerationConfig(max_tokens=20, stop_on_eos=False, sampling=SamplingParams(temperature=1.0, seed=11))
    assert generate(engine, tok, "To be", cfg).token_ids == generate(engine, tok, "To be", cfg).token_ids


def test_ctrl_c_is_re_raised_with_the_partial_output_and_stats(engine_tok, monkeypatch):
    engine, tok = engine_tok
    real, calls = engine.decode, []

    def decode(token):
        calls.append(token)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(token)

    monkeypatch.setattr(engine, "decode", decode)
    with pytest.raises(KeyboardInterrupt) as info:  # never swallowed: a caller's loop must stop too
        generate(engine, tok, "To be", GenerationConfig(max_tokens=50, stop_on_eos=False))
    assert isinstance(info.value, GenerationCancelled)
    r = info.value.result
    assert r.stats.finish_reason == "cancelled" and len(r.token_ids) == 5
    assert r.stats.generated_tokens == 5


# -- edge-run --------------------------------------------------------------------------------------


def test_edge_run_json(bundle):
    r = CliRunner().invoke(
        run_cli, ["--bundle", str(bundle), "--target", "x86", "--prompt", "To be", "--max-tokens", "7", "--json"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out) >= {"text", "token_ids", "prompt_token_ids", "stats"}
    assert len(out["token_ids"]) <= 7 and out["prompt_token_ids"][0] == 0
    assert out["stats"]["generated_tokens"] == len(out["token_ids"])


def test_edge_run_streams_with_stats(bundle):
    r = CliRunner().invoke(
        run_cli,
        [
            "--bundle",
            str(bundle),
            "--target",
            "x86",
            "--prompt",
            "To be",
            "--max-tokens",
            "5",
            "--stats",
            "--seed",
            "1",
            "--temperature",
            "0.7",
        ],
    )
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("To be") and "TTFT" in r.stderr and "ITL p50/p90/p99" in r.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--bundle", "/nonexistent"], "does not exist"),
        (["--target", "no-such-board"], "no-such-board"),
        (["--target", "orin-nano"], "tensorrt backend"),
        (["--temperature", "-1"], "temperature"),
    ],
)
def test_edge_run_errors_are_one_line(bundle, args, message):
    if "--bundle" not in args:
        args = ["--bundle", str(bundle), *args]
    r = CliRunner().invoke(run_cli, args)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert message in r.output.strip().splitlines()[-1]


def test_edge_run_with_no_bundle_exports_the_demo_model_once(tmp_path, monkeypatch):
    """The README's main job: the demo model, exported on first use in the target's quantization."""
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(tmp_path))
    args = ["--target", "x86", "--max-tokens", "4", "--temperature", "0", "--json"]
    r = CliRunner().invoke(run_cli, args)
    assert r.exit_code == 0, r.output
    (bundle,) = (tmp_path / "bundles").iterdir()
    assert "shakespeare-llama-5m-ort-int8-" in bundle.name  # x86's default quantization
    assert json.loads(r.stdout)["bundle"] == str(bundle)
    again = CliRunner().invoke(run_cli, args)
    assert again.exit_code == 0 and "exporting" not in again.stderr
    assert json.loads(again.stdout)["token_ids"] == json.loads(r.stdout)["token_ids"]


def test_generate_on_a_session_given_messages_feeds_only_what_its_cache_lacks(serve_bundle):
    """`messages` are the whole conversation: a Session feeds the part its cache does not hold (Session.resume),
    not the whole rendering again after what it holds; the reply is a fresh engine's, the stats count the
    whole prompt."""
    from edge_runtime.chat import encode_messages
    from edge_runtime.session import Session

    greedy = GenerationConfig(max_tokens=8, sampling=SamplingParams(temperature=0))
    engine = load(serve_bundle)
    tok = Tokenizer.for_engine(engine)
    session = Session(engine)
    history = [{"role": "user", "content": "Who is there?"}]
    first = generate(session, tok, messages=history, config=greedy)
    history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And then?"}]
    whole = encode_messages(session, tok, history)
    second = generate(session, tok, messages=history, config=greedy)
    assert session.last_cached > 0 and session.last_cached + session.last_fed == len(whole)
    assert session.length == len(whole) + len(second.token_ids)
    assert second.prompt_token_ids == whole and second.stats.prompt_tokens == len(whole)
    fresh = generate(load(serve_bundle), tok, messages=history, config=greedy)
    assert second.token_ids == fresh.token_ids
    # Resent whole: the reply's last token is still pending (begin feeds it); with nothing pending, the last
    # token is taken back to be fed again.
    resent = [*whole, *second.token_ids]
    assert session.resume(resent) == [] and session.pending == resent[-1]
    session.prefill([])  # feeds the pending token
    assert session.pending is None and session.resume(resent) == resent[-1:] and session.length == len(resent) - 1
