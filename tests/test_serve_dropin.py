"""edge-serve as a drop-in for clients written against another server: any model name is served unless
--strict-model-name, --served-model-name renames the model, GET / describes the server, and each request leaves
one access-log line. Through real server processes, driven by the official openai client."""

from __future__ import annotations

import json
import time

import pytest

openai = pytest.importorskip("openai")

from .conftest import SERVE_ARGS  # noqa: E402
from .serve_util import Server  # noqa: E402

MODEL = "shakespeare"  # the bundle directory's name: the default served name
SERVED = "gpt-4o-mini"  # a name a client may have hard-coded
CHAT = "/v1/chat/completions"
HAIL = [{"role": "user", "content": "Hail, noble Capulet!"}]


def _client(server, timeout=60):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=timeout)


@pytest.fixture(scope="module")
def client(edge_server):
    return _client(edge_server)


@pytest.fixture(scope="module")
def named_server(serve_bundle, tmp_path_factory):
    """One server for both name options, at --log-level warning: the access log's off switch is checked on it."""
    server = Server(
        serve_bundle,
        *SERVE_ARGS,
        "--no-energy",
        "--served-model-name",
        SERVED,
        "--strict-model-name",
        "--log-level",
        "warning",
        log=tmp_path_factory.mktemp("named") / "server.log",
    )
    yield server
    server.stop()


def _access_lines(server, offset):
    """The access-log lines the server wrote past byte `offset` of its log, each as its key=value dict."""
    text = server.log.read_bytes()[offset:].decode(errors="replace")
    marker = "edge_serve.access: "
    return [
        dict(pair.split("=", 1) for pair in line.split(marker, 1)[1].split())
        for line in text.splitlines()
        if marker in line
    ]


def _wait_for_line(server, offset, **expected):
    """The first access line past `offset` with these values (polled, bounded: the server logs a request once
    its last byte is sent, which can be just after the client has read it)."""
    deadline = time.monotonic() + 10
    while True:
        lines = _access_lines(server, offset)
        found = [line for line in lines if all(line.get(k) == str(v) for k, v in expected.items())]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            pytest.fail(f"no access line with {expected} among {lines}")
        time.sleep(0.05)


def test_any_model_name_is_served_by_default(client):
    got = client.chat.completions.create(model="gpt-4o-mini", messages=HAIL, max_tokens=3, temperature=0)
    assert got.usage.completion_tokens == 3 and got.model == MODEL  # the served name, not the requested one
    got = client.completions.create(model="some/other-model", prompt="ROMEO.\n", max_tokens=2, temperature=0)
    assert got.usage.completion_tokens == 2 and got.model == MODEL
    assert client.models.retrieve("gpt-4o-mini").id == MODEL
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_served_model_name_is_listed_and_answered(named_server):
    client = _client(named_server)
    assert [m.id for m in client.models.list().data] == [SERVED]
    assert client.models.retrieve(SERVED).id == SERVED
    got = client.chat.completions.create(model=SERVED, messages=HAIL, max_tokens=2, temperature=0)
    assert got.model == SERVED
    chunks = list(client.completions.create(model=SERVED, prompt="ROMEO.\n", max_tokens=2, temperature=0, stream=True))
    assert chunks and {c.model for c in chunks} == {SERVED}


def test_strict_model_name_refuses_other_names(named_server):
    client = _client(named_server)
    for other in (MODEL, "gpt-9"):  # the bundle's own name is another name once the server is renamed
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model=other, messages=HAIL, max_tokens=2)
        assert e.value.status_code == 404 and e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
    status, headers, data = named_server.request(
        "POST", CHAT, json.dumps({"model": "gpt-9", "messages": HAIL}).encode(), {"Content-Type": "application/json"}
    )
    error = json.loads(data)["error"]
    assert status == 404 and headers["content-type"].startswith("application/json")
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "model_not_found", "model")
    assert SERVED in error["message"]
    ok, reply = named_server.post(CHAT, {"messages": HAIL, "max_tokens": 2})  # no model named: this one
    assert ok == 200 and reply["model"] == SERVED


def test_index_page_names_the_model_and_the_endpoints(edge_server, serve_bundle):
    status, headers, body = edge_server.request("GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    text = body.decode()
    assert MODEL in text and str(serve_bundle) in text
    for endpoint in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"):
        assert endpoint in text


def test_access_log_line_per_request(client, edge_server):
    offset = edge_server.log.stat().st_size
    got = client.chat.completions.create(model=MODEL, messages=HAIL, max_tokens=5, temperature=0)
    u = got.usage
    line = _wait_for_line(
        edge_server,
        offset,
        method="POST",
        route=CHAT,
        status=200,
        prompt_tokens=u.prompt_tokens,
        cached_tokens=u.prompt_tokens_details.cached_tokens,
        generated_tokens=u.completion_tokens,
    )
    assert 0 < float(line["ttft_ms"]) <= float(line["total_ms"])

    stream = client.completions.create(
        model=MODEL,
        prompt="JULIET.\nO Romeo",
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    u = list(stream)[-1].usage
    _wait_for_line(
        edge_server,
        offset,
        route="/v1/completions",
        status=200,
        prompt_tokens=u.prompt_tokens,
        generated_tokens=u.completion_tokens,
    )

    # Routes that generate nothing log '-' for the token fields; errors log their status.
    assert edge_server.get("/v1/nothing-here")[0] == 404
    line = _wait_for_line(edge_server, offset, method="GET", route="/v1/nothing-here", status=404)
    assert line["prompt_tokens"] == line["generated_tokens"] == line["ttft_ms"] == "-"
    float(line["total_ms"])


def test_log_level_warning_drops_the_access_log(named_server):
    client = _client(named_server)
    client.chat.completions.create(model=SERVED, messages=HAIL, max_tokens=2, temperature=0)
    client.models.list()  # answered after the chat request's line would have been written
    assert named_server.get("/health")[0] == 200
    assert _access_lines(named_server, 0) == []
