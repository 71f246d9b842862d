"""edge-serve end to end: a real server process on a loopback port, driven by the official openai client."""

from __future__ import annotations

import time

import pytest

openai = pytest.importorskip("openai")

from edge_runtime.chat import encode_messages  # noqa: E402
from edge_runtime.engine import LoadOptions, load  # noqa: E402
from edge_runtime.generate import GenerationConfig, generate  # noqa: E402
from edge_runtime.tokenizer import Tokenizer  # noqa: E402

from .serve_util import metric_samples, sample_value  # noqa: E402

MODEL = "shakespeare"  # the bundle directory's name: the default model id


@pytest.fixture(scope="module")
def client(edge_server):
    return openai.OpenAI(base_url=edge_server.base + "/v1", api_key="unused", max_retries=0, timeout=60)


def _metrics(server):
    status, body = server.get("/metrics")
    assert status == 200
    return metric_samples(body.decode())


def _user(text):
    return [{"role": "user", "content": text}]


def test_greedy_equals_the_python_api(client, serve_bundle):
    """Runs first, on a fresh server: chat and completion greedy output equal generate()'s on the same prompt."""
    engine = load(serve_bundle, LoadOptions(window=100, threads=1), target="x86")
    tok = Tokenizer.for_engine(engine)
    messages = _user("What say you to this, good Capulet?")
    expected = generate(engine, tok, encode_messages(engine, tok, messages), GenerationConfig(max_tokens=16))
    got = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    assert got.choices[0].message.content == expected.text
    assert got.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert got.usage.completion_tokens == len(expected.token_ids)

    prompt = "KING HENRY.\nOnce more unto the breach"
    expected = generate(engine, tok, prompt, GenerationConfig(max_tokens=12))
    got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert got.choices[0].text == expected.text
    assert got.choices[0].finish_reason == "length"


def test_logit_bias_moves_tokens_as_the_python_api_does(client, serve_bundle):
    """OpenAI's logit_bias: the greedy first token banned by -100, another raised a little; +100 forces one."""
    from itertools import islice

    from edge_runtime.generate import generate_step
    from edge_runtime.sampling import LogitBias, Sampler, SamplingParams

    engine = load(serve_bundle, LoadOptions(window=100, threads=1), target="x86")
    tok = Tokenizer.for_engine(engine)
    prompt = "KING HENRY.\nOnce more unto the breach"
    ids = tok.encode(prompt)

    def greedy(bias):
        steps = generate_step(engine, ids, Sampler(SamplingParams()), logits_processors=[LogitBias(bias)])
        return [s.token for s in islice(steps, 6)]

    plain = greedy({})
    other = tok.encode(" the", add_special_tokens=False)[0]
    for bias in ({plain[0]: -100, other: 4}, {other: 100}):
        want = greedy(bias)
        assert not set(want) & set(engine.manifest.tokenizer.eos_token_ids)
        got = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logit_bias={str(k): v for k, v in bias.items()}
        )
        assert got.choices[0].text == tok.decode(want)
    assert want == [other] * 6 and plain[0] != other


def test_models_and_health(client, edge_server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    status, body = edge_server.get("/health")
    assert status == 200 and b'"ok"' in body


def test_chat_stream_matches_non_stream(client):
    messages = _user("Speak, what news from Verona?")
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert whole.model_extra["edge_runtime"]["timings"]["ttft_ms"] > 0


def test_completion_stream(client):
    prompt = "JULIET.\nO Romeo, Romeo"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == whole.choices[0].text
    assert whole.usage.completion_tokens == 8


def test_stop_cuts_the_text_before_the_stop_string(client):
    prompt = "MERCUTIO.\nA plague o' both"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), f"no usable stop string in {full!r}"
    got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
    assert got.choices[0].text == full[: full.find(stop)]
    assert got.choices[0].finish_reason == "stop"


def test_seed_reproduces_a_sampled_reply(client):
    args = dict(model=MODEL, messages=_user("Tell me of the queen."), max_tokens=16, temperature=1.0, top_p=0.95)
    a = client.chat.completions.create(seed=1234, **args).choices[0].message.content
    b = client.chat.completions.create(seed=1234, **args).choices[0].message.content
    streamed = client.chat.completions.create(seed=1234, stream=True, **args)
    c = "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices)
    assert a == b == c
    others = {client.chat.completions.create(seed=s, **args).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {a}) > 1  # the seed matters


def test_logprobs(client):
    got = client.chat.completions.create(
        model=MODEL,
        messages=_user("Good morrow, cousin."),
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = got.choices[0].logprobs.content
    assert len(content) == got.usage.completion_tokens
    assert "".join(t.token for t in content) == got.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob)  # greedy takes the most likely token
    legacy = client.completions.create(model=MODEL, prompt="ROMEO.\n", max_tokens=4, temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert lp.text_offset[0] == 0 and all(len(d) == 2 for d in lp.top_logprobs)


def test_resent_conversation_reuses_its_slot(client):
    """Two conversations on 2 slots, interleaved: each resent one finds its own ring (cached_tokens > 0)."""

    def turn(history, text):
        history.append({"role": "user", "content": text})
        got = client.chat.completions.create(model=MODEL, messages=history, max_tokens=8, temperature=0)
        history.append({"role": "assistant", "content": got.choices[0].message.content})
        return got

    a, b = [{"role": "system", "content": "Thou art a player at the Globe."}], [{"role": "user", "content": "Hark!"}]
    a1 = turn(a, "What play is this?")
    b1 = turn(b, "Who goes there?")
    a2 = turn(a, "And who wrote it?")
    b2 = turn(b, "Stand and unfold thyself.")
    for first, second in ((a1, a2), (b1, b2)):
        cached = second.usage.prompt_tokens_details.cached_tokens
        ext = second.model_extra["edge_runtime"]
        assert cached >= first.usage.prompt_tokens - 2, (first.usage, second.usage)  # a re-tokenized boundary
        assert ext["slot"] == first.model_extra["edge_runtime"]["slot"]
        assert ext["timings"]["prefill_tokens"] <= second.usage.prompt_tokens - cached + 1
    assert a2.model_extra["edge_runtime"]["slot"] != b2.model_extra["edge_runtime"]["slot"]
    assert a1.usage.prompt_tokens_details.cached_tokens == 0


def test_metrics_parse(client, edge_server):
    client.chat.completions.create(model=MODEL, messages=_user("Once more."), max_tokens=3, temperature=0)
    m = _metrics(edge_server)
    assert (
        sample_value(m, "edge_serve_requests", "edge_serve_requests_total", route="/v1/chat/completions", status="200")
        >= 1
    )
    assert sample_value(m, "edge_serve_generated_tokens", "edge_serve_generated_tokens_total") >= 3
    assert sample_value(m, "edge_serve_cached_tokens", "edge_serve_cached_tokens_total") > 0
    assert (
        sample_value(m, "edge_serve_time_to_first_token_seconds", "edge_serve_time_to_first_token_seconds_count") >= 1
    )
    assert (
        sample_value(m, "edge_serve_inter_token_latency_seconds", "edge_serve_inter_token_latency_seconds_count") >= 2
    )
    assert sample_value(m, "edge_serve_slots") == 2 and sample_value(m, "edge_serve_queue_capacity") == 4
    assert sample_value(m, "process_resident_memory_bytes") > 0
    energy = m["edge_serve_energy_joules"]
    assert energy and {"sensor", "boundary", "estimate", "phase"} <= set(energy[0].labels)
    assert m["edge_serve_tokens_per_joule"][0].value > 0


def test_disconnect_mid_stream_frees_the_slot(client, edge_server, serve_bundle):
    import json

    # EOS banned: a sampled reply that ended by itself before the disconnect reached the worker would count
    # as "stop", not "cancelled" (the sampled path depends on the CPU's rounding)
    eos = json.loads((serve_bundle / "manifest.json").read_text())["tokenizer"]["eos_token_ids"]
    assert eos
    before = _metrics(edge_server)
    cancelled0 = sample_value(
        before, "edge_serve_generations", "edge_serve_generations_total", finish_reason="cancelled"
    )
    tokens0 = sample_value(before, "edge_serve_generated_tokens", "edge_serve_generated_tokens_total")
    stream = client.completions.create(
        model=MODEL,
        prompt="A long tale of two households",
        max_tokens=4000,
        temperature=0.8,
        seed=5,
        stream=True,
        logit_bias={str(t): -100 for t in eos},
    )
    for i, _chunk in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # bounded: the worker notices at its next token
        m = _metrics(edge_server)
        cancelled = sample_value(m, "edge_serve_generations", "edge_serve_generations_total", finish_reason="cancelled")
        if cancelled > cancelled0 and sample_value(m, "edge_serve_slots_busy") == 0:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the generation went on after its client disconnected")
    generated = sample_value(m, "edge_serve_generated_tokens", "edge_serve_generated_tokens_total") - tokens0
    assert 4 <= generated < 4000
    after = client.completions.create(model=MODEL, prompt="ROMEO.\n", max_tokens=2, temperature=0)
    assert after.usage.completion_tokens == 2


def test_routing_takes_a_slot_only_when_it_gains_more_than_it_loses(serve_bundle):
    """In process (route reads only each slot's token list): a shared template head does not evict a
    conversation while an empty slot remains; a resent or edited conversation finds its own slot."""
    from edge_runtime.serve.slots import SlotPool

    pool = SlotPool(load(serve_bundle, LoadOptions(window=100, threads=1, caches=3), target="x86"), 3)
    head = list(range(10, 22))  # 12 tokens every prompt starts with (the template, a system prompt)
    a = [*head, *range(100, 110), *range(200, 208)]  # a's prompt and reply
    pool.slots[0].tokens, pool.slots[0].last_used = a, 1
    slot, shared = pool.route([*head, *range(300, 312)])  # another conversation, same head
    assert slot is not pool.slots[0] and not slot.tokens and shared == 0
    assert pool.route([*a, *range(400, 405)]) == (pool.slots[0], len(a))  # a resent, grown
    assert pool.route([*a[:-3], 7, 8]) == (pool.slots[0], len(a) - 3)  # a, its last turn edited
    pool.slots[1].tokens, pool.slots[1].last_used = [*range(500, 540)], 2
    pool.slots[2].tokens, pool.slots[2].last_used = [*range(600, 640)], 3
    pool.slots[0].last_used = 4
    assert pool.route([*head, 1, 2, 3]) == (pool.slots[1], 0)  # all full, nothing worth it: the least recent


def test_speculative_server_replies_as_plain_greedy_and_counts_its_proposals(serve_bundle, tmp_path):
    """edge-serve --speculative lookup: the same greedy text as generate() without speculation (this fp32
    bundle's chunks round unlike decode steps, so greedy decodes plainly, said once in the log), sampled
    replies speculate and count their proposals and acceptances in /metrics, the setting in /v1/models;
    bad options fail at start-up."""
    import subprocess

    from edge_runtime.serve.process import serve_command

    from .conftest import SERVE_ARGS
    from .serve_util import Server

    engine = load(serve_bundle, LoadOptions(window=100, threads=1), target="x86")
    tok = Tokenizer.for_engine(engine)
    # A line said three times: the reply's continuation of it is in the prompt, so lookup proposes.
    messages = _user("Once more unto the breach, dear friends, once more. " * 3)
    expected = generate(engine, tok, encode_messages(engine, tok, messages), GenerationConfig(max_tokens=40))
    server = Server(serve_bundle, *SERVE_ARGS, "--speculative", "lookup", log=tmp_path / "spec.log")
    try:
        c = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        got = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0)
        assert got.choices[0].message.content == expected.text
        assert got.usage.completion_tokens == len(expected.token_ids)
        assert c.models.retrieve(MODEL).model_extra["speculative"] == "prompt lookup, k <= 8"

        def counted() -> tuple[float, float, float]:
            m, p = _metrics(server), "edge_serve_"
            names = ("speculative_proposed_tokens", "speculative_accepted_tokens", "target_calls")
            a, b, n = (sample_value(m, p + name, p + name + "_total") for name in names)
            return a, b, n

        assert engine.exact_rows > 1 or counted()[0] == 0  # exact greedy: nothing verified where one row is exact
        sampled = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0.3, seed=1)
        proposed, accepted, calls = counted()
        assert proposed > 0 and 0 <= accepted <= proposed
        assert 0 < calls <= len(expected.token_ids) + sampled.usage.completion_tokens
    finally:
        server.stop()
    if engine.exact_rows == 1:
        assert (tmp_path / "spec.log").read_text().count("speculation is off under greedy decoding") == 1
    bad = subprocess.run(
        [
            *serve_command(),
            "--bundle",
            str(serve_bundle),
            *SERVE_ARGS,
            "--speculative",
            "lookup",
            "--draft-tokens",
            "999",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "slack rows" in bad.stderr.strip().splitlines()[-1] and "Traceback" not in bad.stderr


def test_chat_template_kwargs_reach_the_template(client, serve_bundle, tmp_path):
    """A request's chat_template_kwargs (vLLM's and llama.cpp's field) render the template with its variables;
    edge-serve --chat-template-kwargs sets every request's, and a request's own win."""
    from edge_runtime.chat import ChatTemplate

    from .conftest import SERVE_ARGS
    from .serve_util import Server

    engine = load(serve_bundle, LoadOptions(window=100, threads=1), target="x86")
    tok = Tokenizer.for_engine(engine)
    messages = _user("Speak, good nurse.")
    template = ChatTemplate.for_bundle(engine.bundle)
    plain = len(tok.encode(template.render(messages), add_special_tokens=False))
    off = len(tok.encode(template.render(messages, enable_thinking=False), add_special_tokens=False))
    assert off > plain

    def prompt_tokens(c, kwargs=None):
        extra = {} if kwargs is None else {"extra_body": {"chat_template_kwargs": kwargs}}
        reply = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, temperature=0, **extra)
        return reply.usage.prompt_tokens

    assert prompt_tokens(client) == plain
    assert prompt_tokens(client, {"enable_thinking": False}) == off
    server = Server(
        serve_bundle, *SERVE_ARGS, "--chat-template-kwargs", '{"enable_thinking": false}', log=tmp_path / "s.log"
    )
    try:
        c = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert prompt_tokens(c) == off
        assert prompt_tokens(c, {"enable_thinking": True}) == plain
    finally:
        server.stop()
