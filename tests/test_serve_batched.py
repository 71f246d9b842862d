"""edge-serve --parallel 4 on a bundle whose graph takes a batch: a real server driven by the official openai client.

Concurrent greedy streams get the text each gets alone (the demo int4 edge bundle's rows round as one row alone up
to Model.exact_rows, at least 4 on every kernel ISA); the model calls were shared (the batch occupancy histogram);
a stream cancelled mid-batch leaves the others whole; a constrained and an unconstrained request in one batch each
get theirs.
"""

from __future__ import annotations

import json
import threading

import pytest

from edge_runtime import kernels

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.skipif(not kernels.available(), reason="the edge kernels are not built here")

MODEL = "shakespeare"
ARGS = ("--target", "x86", "--window", "100", "--threads", "2", "--slots", "4", "--parallel", "4", "--queue", "8")
PROMPTS = ["Now is the winter", "To be, or not", "Friends, Romans", "O Romeo, Romeo"]


@pytest.fixture(scope="module")
def batched_server(tmp_path_factory):
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod

    from .serve_util import SERVE_TEMPLATE, Server
    from .tiny_models import demo_with_template

    ck = demo_with_template(tmp_path_factory.mktemp("batched-ck") / "demo", SERVE_TEMPLATE)
    out = tmp_path_factory.mktemp("batched-b") / MODEL
    export(
        ExportOptions(checkpoint=ck, out=out, window=100, quant=QuantConfig(QuantMethod.INT4, kernel=MatMulKernel.EDGE))
    )
    server = Server(out, *ARGS, log=tmp_path_factory.mktemp("batched-log") / "server.log")
    yield server
    server.stop()


def _client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


def _stream(client, prompt: str, n: int, out: dict, key, *, stop_after: int | None = None, **kw) -> None:
    text, chunks = [], 0
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0, stream=True, **kw)
    for chunk in stream:
        text.append(chunk.choices[0].text if chunk.choices else "")
        chunks += 1
        if stop_after is not None and chunks >= stop_after:
            stream.close()  # the client goes away mid-batch
            break
    out[key] = "".join(text)


def _together(jobs) -> dict:
    out: dict = {}
    threads = [threading.Thread(target=_stream, args=(*args, out, key), kwargs=kw) for key, args, kw in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def _batch_counts(server) -> tuple[float, float]:
    from .serve_util import metric_samples, sample_value

    m = metric_samples(server.get("/metrics")[1].decode())
    name = "edge_serve_batch_rows"
    return sample_value(m, name, name + "_count"), sample_value(m, name, name + "_bucket", le="1.0")


def test_concurrent_streams_equal_each_alone_and_share_calls(batched_server):
    c = _client(batched_server)
    assert c.models.retrieve(MODEL).model_extra["parallel"] == 4
    together = _together([(i, (c, p, 40), {}) for i, p in enumerate(PROMPTS)])
    calls, single = _batch_counts(batched_server)
    assert calls > 0 and single < calls  # some model calls decoded several streams
    from .serve_util import metric_samples, sample_value

    m = metric_samples(batched_server.get("/metrics")[1].decode())
    assert sample_value(m, "edge_serve_aggregate_tokens_per_second") > 0
    # the busy period's energy (sampled while any stream ran; the x86 profile's meter, else its estimate)
    assert sample_value(m, "edge_serve_tokens_per_joule") > 0
    alone = {i: _together([(i, (c, p, 40), {})])[i] for i, p in enumerate(PROMPTS)}
    assert together == alone and all(alone.values())


def test_a_cancel_mid_batch_leaves_the_others_whole(batched_server):
    c = _client(batched_server)
    jobs = [(i, (c, p, 40), {}) for i, p in enumerate(PROMPTS[:3])]
    jobs.append((3, (c, PROMPTS[3], 40), {"stop_after": 3}))
    got = _together(jobs)
    alone = {i: _together([(i, (c, p, 40), {})])[i] for i, p in enumerate(PROMPTS[:3])}
    assert {i: got[i] for i in range(3)} == alone
    health = json.loads(batched_server.get("/health")[1])
    assert health  # the server still answers after the cancel


def test_a_constrained_and_an_unconstrained_request_in_one_batch(batched_server):
    pytest.importorskip("llguidance")
    c = _client(batched_server)
    answer = {"enum": ["yes", "no"]}  # short: the object closes well within max_tokens
    schema = {"type": "object", "properties": {"a": answer}, "required": ["a"], "additionalProperties": False}
    out: dict = {}

    def constrained() -> None:
        r = c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Yes or no?"}],
            max_tokens=120,
            temperature=1.0,  # greedy, this tiny model pads the object with whitespace past any budget
            seed=0,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        )
        out["json"], out["reason"] = r.choices[0].message.content, r.choices[0].finish_reason

    t = threading.Thread(target=constrained)
    t.start()
    plain = _together([(i, (c, p, 40), {}) for i, p in enumerate(PROMPTS[:2])])
    t.join(120)
    assert out["reason"] == "stop" and json.loads(out["json"])["a"] in ("yes", "no"), out
    alone = {i: _together([(i, (c, p, 40), {})])[i] for i, p in enumerate(PROMPTS[:2])}
    assert plain == alone


def test_logprobs_and_stop_strings_per_stream_in_one_batch(batched_server):
    """Each stream's own options in a shared batch: logprobs on one, a stop string on another, as each alone."""
    c = _client(batched_server)

    def ask(prompt: str, **kw) -> tuple:
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, **kw)
        lp = r.choices[0].logprobs
        return r.choices[0].text, r.choices[0].finish_reason, None if lp is None else (lp.tokens, lp.token_logprobs)

    jobs = {
        0: (PROMPTS[0], {}),
        1: (PROMPTS[1], {"logprobs": 2}),
        2: (PROMPTS[2], {"stop": ["e"]}),
        3: (PROMPTS[3], {}),
    }
    out: dict = {}
    threads = [
        threading.Thread(target=lambda k=k, p=p, kw=kw: out.__setitem__(k, ask(p, **kw))) for k, (p, kw) in jobs.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    alone = {k: ask(p, **kw) for k, (p, kw) in jobs.items()}
    assert out == alone
    assert out[1][2] is not None and len(out[1][2][0]) == 24
    assert out[2][1] == "stop" and "e" not in out[2][0]
