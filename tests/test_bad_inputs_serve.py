"""edge-serve: client mistakes that used to be 500s are 400s with OpenAI's error object, and a request still
waiting when the server stops gets a JSON 503, not uvicorn's plain-text 500."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import pytest

pytest.importorskip("starlette")

from .serve_util import Server

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Hail!"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _with_call(function: object) -> list[dict]:
    call = {"id": "c1", "type": "function", "function": function}
    return [*HI, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "user", "content": "And?"}]


CASES = [
    # (name, raw body, code, a needle of the message)
    ("deeply nested array", b"[" * 100_000 + b"]" * 100_000, "invalid_json", "nests deeper"),
    ("nested messages", b'{"messages": ' + b"[" * 500 + b"]" * 500 + b"}", "invalid_json", "nests deeper"),
    ("lone surrogate in content", {"messages": [{"role": "user", "content": "\ud800"}]}, "invalid_json", "surrogate"),
    ("lone surrogate in stop", {"messages": HI, "stop": ["\udc80"]}, "invalid_json", "surrogate"),
    (
        "tool-call arguments not JSON",
        {"messages": _with_call({"name": "f", "arguments": "{x"}), "tools": TOOLS},
        "invalid_value",
        "'arguments' is not JSON",
    ),
    (
        "tool-call arguments not JSON, no tools",
        {"messages": _with_call({"name": "f", "arguments": "{x"})},
        "invalid_value",
        "'arguments' is not JSON",
    ),
    ("tool call not an object", {"messages": _with_call("f"), "tools": TOOLS}, "invalid_value", "tool call 0"),
    (
        "tool-call arguments a list",
        {"messages": _with_call({"name": "f", "arguments": "[1]"}), "tools": TOOLS},
        "invalid_value",
        "JSON object",
    ),
]


@pytest.mark.parametrize(("name", "body", "code", "needle"), CASES, ids=[c[0] for c in CASES])
def test_client_mistakes_are_400s(edge_server, name, body, code, needle):
    raw = body if isinstance(body, bytes) else json.dumps({"max_tokens": 2, **body}).encode()
    status, data = edge_server.post(CHAT, raw=raw)
    assert status == 400, data
    assert data["error"]["code"] == code and needle in data["error"]["message"], data
    assert edge_server.post(CHAT, {"messages": HI, "max_tokens": 2})[0] == 200


def test_a_body_cut_off_mid_send_is_a_400_not_a_traceback(edge_server):
    before = edge_server.log.stat().st_size
    with socket.create_connection(("127.0.0.1", edge_server.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        s.sendall(b'Content-Length: 1000\r\n\r\n{"messages": [')
        s.shutdown(socket.SHUT_WR)
        s.recv(100)  # the server closes its side: nobody is left to answer
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the access line comes once the handler is done
        with edge_server.log.open("rb") as f:
            f.seek(before)
            written = f.read().decode(errors="replace")
        if "status=400" in written:
            break
        time.sleep(0.1)
    assert "status=400" in written and "Traceback" not in written, written


def test_requests_still_waiting_at_shutdown_get_a_json_503(serve_bundle, tmp_path):
    server = Server(
        serve_bundle, "--target", "x86", "--window", "100", "--threads", "1", "--slots", "1", "--queue", "4",
        "--max-tokens", "100000", "--shutdown-timeout", "1", log=tmp_path / "log",
    )  # fmt: skip
    got: dict[str, tuple] = {}

    def send(name: str) -> None:  # one generating (long), one waiting behind it in the queue
        body = {"messages": HI, "max_tokens": 100_000, "ignore_eos": True}
        status, headers, data = server.request("POST", CHAT, json.dumps(body).encode(), timeout=60)
        got[name] = (status, headers.get("content-type"), data)

    try:
        threads = [threading.Thread(target=send, args=(n,)) for n in ("running", "queued")]
        for t in threads:
            t.start()
            time.sleep(0.5)
        server.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert server.proc.wait(60) == 0
    finally:
        server.stop()
    for name in ("running", "queued"):
        status, kind, data = got[name]
        assert status == 503 and kind == "application/json", (name, data)
        assert json.loads(data)["error"]["code"] == "shutting_down"
