"""edge-serve's bad-input sweep: each mistake gets its status and OpenAI's error object, and the server keeps
serving (a normal request succeeds right after every one). Plus the API key, and a graceful SIGTERM."""

from __future__ import annotations

import json
import signal

import pytest

openai = pytest.importorskip("openai")

from .serve_util import Server  # noqa: E402

CHAT = "/v1/chat/completions"
GOOD = {"model": "shakespeare", "messages": [{"role": "user", "content": "Hail!"}], "max_tokens": 2}
LONG = " ".join(["Now is the winter of our discontent made glorious summer by this sun of York;"] * 12)


def _chat(**changes):
    body = {**GOOD, **changes}
    return {k: v for k, v in body.items() if v is not None}


CASES = [
    # (name, path, body (an object, or raw bytes), status, code, param)
    ("malformed JSON", CHAT, b'{"messages": [', 400, "invalid_json", None),
    ("NaN is not JSON", CHAT, b'{"temperature": NaN}', 400, "invalid_json", None),
    ("body not an object", CHAT, [1, 2], 400, "invalid_json", None),
    ("messages missing", CHAT, _chat(messages=None), 400, "invalid_type", "messages"),
    ("messages not a list", CHAT, _chat(messages="hi"), 400, "invalid_type", "messages"),
    ("temperature a string", CHAT, _chat(temperature="hot"), 400, "invalid_type", "temperature"),
    ("temperature out of range", CHAT, _chat(temperature=7), 400, "invalid_value", "temperature"),
    ("max_tokens a string", CHAT, _chat(max_tokens="9"), 400, "invalid_type", "max_tokens"),
    ("max_tokens zero", CHAT, _chat(max_tokens=0), 400, "invalid_value", "max_tokens"),
    ("max_tokens over the limit", CHAT, _chat(max_tokens=10**6), 400, "max_tokens_exceeded", "max_tokens"),
    ("stream not a bool", CHAT, _chat(stream="yes"), 400, "invalid_type", "stream"),
    ("stop not strings", CHAT, _chat(stop=[1]), 400, "invalid_type", "stop"),
    ("stop too many", CHAT, _chat(stop=["a", "b", "c", "d", "e"]), 400, "invalid_value", "stop"),
    ("stop too long", CHAT, _chat(stop=["ok", "x" * 1_000_000]), 400, "invalid_value", "stop"),
    ("n > 1", CHAT, _chat(n=2), 400, "unsupported_value", "n"),
    ("logit_bias not an object", CHAT, _chat(logit_bias=[5, 1]), 400, "invalid_type", "logit_bias"),
    ("logit_bias key not an id", CHAT, _chat(logit_bias={"the": 1}), 400, "invalid_value", "logit_bias"),
    ("logit_bias out of range", CHAT, _chat(logit_bias={"5": 101}), 400, "invalid_value", "logit_bias"),
    ("logit_bias beyond the vocab", CHAT, _chat(logit_bias={"99999999": 1}), 400, "invalid_value", "logit_bias"),
    ("logit_bias key too long", CHAT, _chat(logit_bias={"9" * 5000: 1}), 400, "invalid_value", "logit_bias"),
    ("top_logprobs without logprobs", CHAT, _chat(top_logprobs=2), 400, "invalid_value", "top_logprobs"),
    ("top_logprobs too many", CHAT, _chat(logprobs=True, top_logprobs=50), 400, "invalid_value", "top_logprobs"),
    ("bad role", CHAT, _chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "invalid_value", "messages"),
    ("message without content", CHAT, _chat(messages=[{"role": "user"}]), 400, "invalid_value", "messages"),
    (
        "image content",
        CHAT,
        _chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        400,
        "invalid_value",
        "messages",
    ),
    (
        "template refuses",
        CHAT,
        _chat(messages=[{"role": "tool", "content": "42"}]),
        422,
        "template_refused",
        "messages",
    ),
    ("renders to nothing", CHAT, _chat(messages=[{"role": "user", "content": ""}]), 422, "empty_prompt", "messages"),
    (
        "prompt beyond the window",
        CHAT,
        _chat(messages=[{"role": "user", "content": LONG}]),
        413,
        "context_length_exceeded",
        "messages",
    ),
    ("template kwargs a list", CHAT, _chat(chat_template_kwargs=[1]), 400, "invalid_value", "chat_template_kwargs"),
    (
        "template kwargs set messages",
        CHAT,
        _chat(chat_template_kwargs={"messages": []}),
        400,
        "invalid_value",
        "chat_template_kwargs",
    ),
    ("completion prompt a dict", "/v1/completions", {"prompt": {"a": 1}}, 400, "invalid_type", "prompt"),
    ("completion ids out of vocab", "/v1/completions", {"prompt": [1, 99999999]}, 400, "invalid_value", "prompt"),
    ("completion echo", "/v1/completions", {"prompt": "A", "echo": True}, 400, "unsupported_value", "echo"),
    ("body too large", CHAT, b"{" + b" " * (5 << 20) + b"}", 413, "body_too_large", None),
]


@pytest.mark.parametrize("name,path,body,status,code,param", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_its_error_and_the_server_goes_on(edge_server, name, path, body, status, code, param):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got_status, headers, data = edge_server.request("POST", path, raw, {"Content-Type": "application/json"})
    assert got_status == status, data[:300]
    assert headers["content-type"].startswith("application/json")
    assert b"Traceback" not in data
    error = json.loads(data)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)
    ok, reply = edge_server.post(CHAT, GOOD)
    assert ok == 200 and reply["usage"]["completion_tokens"] == 2


def test_refused_large_requests_leave_the_servers_memory_flat(edge_server):
    """Requests refused for their length (413, beyond the window) are encoded first, but only served ones are
    kept by the conversation cache: after the first (the allocator's high-water mark), six more ~2 MB ones
    leave the server's RSS within allocator noise; a cache keeping them grows by tens of MiB each."""

    def rss_mib() -> float:
        with open(f"/proc/{edge_server.proc.pid}/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))

    def refused(i: int) -> None:
        body = _chat(messages=[{"role": "user", "content": f"{i} " + LONG * (2_000_000 // len(LONG))}])
        status, _, data = edge_server.request("POST", CHAT, json.dumps(body).encode())
        assert status == 413 and json.loads(data)["error"]["code"] == "context_length_exceeded"

    refused(0)
    before = rss_mib()
    for i in range(1, 7):
        refused(i)
    assert rss_mib() - before < 120
    ok, reply = edge_server.post(CHAT, GOOD)
    assert ok == 200 and reply["usage"]["completion_tokens"] == 2


def test_routes_and_methods(edge_server):
    status, _, data = edge_server.request("GET", "/v1/nothing-here")
    assert status == 404 and json.loads(data)["error"]["code"] == "not_found"
    status, _, data = edge_server.request("GET", CHAT)
    assert status == 405 and json.loads(data)["error"]["code"] == "method_not_allowed"


def test_openai_client_sees_typed_errors(edge_server):
    client = openai.OpenAI(base_url=edge_server.base + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="shakespeare", messages=[{"role": "wizard", "content": "x"}])
    assert e.value.param == "messages"
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="shakespeare", messages=[{"role": "user", "content": LONG}], stream=True)
    assert e.value.status_code == 413


@pytest.fixture(scope="module")
def keyed_server(serve_bundle, tmp_path_factory):
    server = Server(
        serve_bundle,
        "--target",
        "x86",
        "--window",
        "100",
        "--threads",
        "1",
        "--slots",
        "1",
        "--no-energy",
        "--api-key",
        "s3cret",
        log=tmp_path_factory.mktemp("keyed") / "server.log",
    )
    yield server
    server.stop()


def test_api_key(keyed_server):
    base = keyed_server.base + "/v1"
    client = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as e:
        client.models.list()
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    status, _, data = keyed_server.request("POST", CHAT, json.dumps(GOOD).encode())  # no Authorization at all
    assert status == 401 and json.loads(data)["error"]["code"] == "invalid_api_key"
    client = openai.OpenAI(base_url=base, api_key="s3cret", max_retries=0, timeout=30)
    assert client.models.list().data[0].id == "shakespeare"
    assert keyed_server.get("/health")[0] == 200  # health and metrics stay open to the local scraper
    assert keyed_server.get("/metrics")[0] == 200


def test_sigterm_finishes_the_stream_in_flight_then_exits(keyed_server):
    client = openai.OpenAI(base_url=keyed_server.base + "/v1", api_key="s3cret", max_retries=0, timeout=60)
    stream = client.completions.create(
        model="shakespeare", prompt="ROMEO.\n", max_tokens=40, temperature=0, stream=True
    )
    chunks = iter(stream)
    first = next(chunks)
    keyed_server.proc.send_signal(signal.SIGTERM)
    rest = list(chunks)
    assert (rest[-1] if rest else first).choices[0].finish_reason == "length"
    assert keyed_server.proc.wait(30) == 0
    assert "Application shutdown complete" in keyed_server.output()


def test_refuses_a_public_address_without_a_key(serve_bundle):
    from click.testing import CliRunner

    from edge_runtime.serve.cli import main

    result = CliRunner().invoke(
        main, ["--bundle", str(serve_bundle), "--host", "0.0.0.0"], env={"EDGE_SERVE_API_KEY": None}
    )
    assert result.exit_code != 0 and "--api-key" in result.output


def test_full_queue_is_a_503_with_retry_after(edge_server, serve_bundle):
    """One generation running and --queue 4 waiting: the next request is refused at once; clients that leave
    while waiting are dropped from the queue, and the server is idle again."""
    import http.client
    import time

    from .serve_util import metric_samples, sample_value

    def gauge(name):
        return sample_value(metric_samples(edge_server.get("/metrics")[1].decode()), name)

    # EOS banned: every job that fills the queue runs its 4,000 tokens (seconds), whatever the CPU's rounding
    # does to the sampled path (one seed in twelve stops by itself before 4,000 tokens here).
    eos = json.loads((serve_bundle / "manifest.json").read_text())["tokenizer"]["eos_token_ids"]
    assert eos
    body = json.dumps(
        {
            "prompt": "Now is the winter",
            "max_tokens": 4000,
            "stream": True,
            "temperature": 0.9,
            "seed": 3,
            "logit_bias": {str(t): -100 for t in eos},
        }
    ).encode()

    def until(done, seconds: float = 60) -> float:  # bounded; a loaded 2-core machine parses requests slowly
        start = time.monotonic()
        while not done() and time.monotonic() - start < seconds:
            time.sleep(0.05)
        return time.monotonic() - start

    def idle() -> bool:
        until(lambda: gauge("edge_serve_queue_depth") == 0 and gauge("edge_serve_slots_busy") == 0)
        return gauge("edge_serve_queue_depth") == 0 and gauge("edge_serve_slots_busy") == 0

    def post() -> http.client.HTTPConnection:  # nothing is read from it
        conn = http.client.HTTPConnection("127.0.0.1", edge_server.port, timeout=30)
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        return conn

    # The first job is sent alone and seen running before four more fill the queue: sent together, the five can
    # reach the server before the engine takes the first one, which then still counts as waiting and the fifth
    # is refused (the depth stays at 3). Up to three tries: a running job that ends between the last poll and
    # the probe lets a waiting one start and the probe in.
    assert idle()  # no job of an earlier test is what the first poll sees running
    parallel = int(gauge("edge_serve_parallel"))  # workers, each taking a job off the queue
    refused, seen = None, []
    for _attempt in range(3):
        conns = []
        try:
            conns.append(post())
            started = until(lambda: gauge("edge_serve_slots_busy") == 1 and gauge("edge_serve_queue_depth") == 0)
            for running in range(2, parallel + 1):  # every worker busy (--parallel), one job at a time
                conns.append(post())
                started += until(lambda n=running: gauge("edge_serve_slots_busy") == n)
            conns += [post() for _ in range(4)]
            waited = until(lambda: gauge("edge_serve_queue_depth") >= 4)
            depth = gauge("edge_serve_queue_depth")
            try:  # a refusal comes at once; a probe let in waits behind 4,000-token jobs
                status, headers, data = edge_server.request(
                    "POST", CHAT, json.dumps(GOOD).encode(), {"Content-Type": "application/json"}, timeout=10
                )
            except TimeoutError:
                status = None
            seen.append(
                f"first job running after {started:.1f} s, queue depth {depth} after {waited:.1f} s, "
                f"probe answered {status}"
            )
        finally:
            for conn in conns:
                conn.close()
        assert idle()  # clients that left while waiting were dropped from the queue
        if status == 503:
            refused = (headers, data)
            break
    assert refused is not None, f"the queue never refused a request while full: {seen}\n{edge_server.output()}"
    headers, data = refused
    assert int(headers["retry-after"]) >= 1 and json.loads(data)["error"]["code"] == "queue_full"
    ok, reply = edge_server.post(CHAT, GOOD)
    assert ok == 200 and reply["usage"]["completion_tokens"] == 2
