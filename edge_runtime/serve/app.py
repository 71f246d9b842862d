"""The ASGI app: routes, the API-key check, request metrics, and OpenAI error bodies for every refusal.

`create_app(state)` builds a Starlette app around a `ServerState` (the loaded engine, tokenizer, template,
scheduler and metrics); the CLI (cli.py) runs it under uvicorn. Nothing here touches the engine: that is
the scheduler's worker thread's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge_runtime.chat import ChatTemplate
from edge_runtime.conversation import ConversationCache
from edge_runtime.engine import Engine
from edge_runtime.sampling_defaults import SamplingDefaults, model_defaults
from edge_runtime.tokenizer import Tokenizer

from . import access, routes
from .errors import APIError
from .metrics import CONTENT_TYPE, Metrics
from .scheduler import Scheduler
from .schemas import model_list

log = logging.getLogger("edge_serve")

DEFAULT_MAX_BODY = 4 << 20  # bytes: a long conversation is ~100 KB of JSON; more is a mistake or an attack
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/")


@dataclass
class ServerState:
    engine: Engine
    tokenizer: Tokenizer
    template: ChatTemplate | None
    scheduler: Scheduler
    metrics: Metrics
    model_id: str  # the served name: what /v1/models lists and every response's `model` says
    fingerprint: str
    max_tokens: int
    api_key: str | None = None
    # Off: any requested model name gets this model, as llama-server does, so clients with a hard-coded name
    # (gpt-4o-mini, ...) work unchanged. On: another name is a 404 model_not_found.
    strict_model: bool = False
    max_body: int = DEFAULT_MAX_BODY
    # What a request's absent sampling fields mean: the model's defaults (sampling_defaults.py)
    sampling: SamplingDefaults = field(default_factory=lambda: model_defaults(None))
    created: int = field(default_factory=lambda: int(time.time()))
    extra: dict[str, Any] = field(default_factory=dict)  # /v1/models' extra fields (target, cache geometry)
    # Recent conversations' ids: a request re-encodes only what its conversation added (conversation.py).
    conversations: ConversationCache = field(init=False)

    def __post_init__(self) -> None:
        self.conversations = ConversationCache(self.tokenizer)

    def check_model(self, model: str | None) -> None:
        # An absent model means this one (curl users, llama.cpp's habit); another name too unless strict.
        if self.strict_model and model is not None and model != self.model_id:
            raise APIError(
                404,
                f"the model '{model}' does not exist here; this server serves '{self.model_id}'",
                param="model",
                code="model_not_found",
            )

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    async def read_json(self, request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise _too_large(self.max_body)
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > self.max_body:
                    raise _too_large(self.max_body)
        except ClientDisconnect:  # nobody reads the answer, but it is the client's doing: a 400, not a traceback
            cut = "the request body was cut off: the client closed the connection"
            raise APIError(400, cut, code="incomplete_body") from None
        try:
            data = json.loads(body, parse_constant=_no_constant)
        except RecursionError:
            raise _too_deep() from None
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
        _check_decoded(data)
        return data


MAX_JSON_DEPTH = 64  # a conversation with tools nests ~10 deep; past this, Python's recursion limit is near
_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_decoded(data: Any) -> None:
    """A parsed body nested past MAX_JSON_DEPTH, or with a lone surrogate (`"\\ud800"` is valid JSON but no
    text): refused here, before the template, the tokenizer or a regex engine fails on it with a 500."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise APIError(
                    400, f"the request body holds a lone surrogate ({value[:40]!a}...): not text", code="invalid_json"
                )
            continue
        if isinstance(value, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise _too_deep()
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items)


def _too_deep() -> APIError:
    return APIError(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json")


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes", code="body_too_large")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# -- small routes ----------------------------------------------------------------------------------


async def index(request: Request) -> Response:
    """A page for whoever opens the address in a browser or curls it: what is served, and where."""
    state: ServerState = request.app.state.serve
    lines = [
        "edge-serve: an OpenAI-compatible server",
        f"model: {state.model_id}",
        f"bundle: {state.engine.bundle.path}",
        "",
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "GET  /v1/models",
        "GET  /health",
        "GET  /metrics",
    ]
    if state.api_key is not None:
        lines.append("(/v1/* needs 'Authorization: Bearer KEY')")
    return PlainTextResponse("\n".join(lines) + "\n")


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.serve
    return JSONResponse(
        {
            "status": "ok",
            "model": state.model_id,
            "slots": len(state.scheduler.pool.slots),
            "queue_depth": state.scheduler.waiting,
        }
    )


async def models(request: Request) -> Response:
    state: ServerState = request.app.state.serve
    return JSONResponse(model_list(state.model_id, state.created, state.extra))


async def model(request: Request) -> Response:
    state: ServerState = request.app.state.serve
    state.check_model(request.path_params["model"])
    return JSONResponse(model_list(state.model_id, state.created, state.extra)["data"][0])


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.serve
    return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)


# -- errors ----------------------------------------------------------------------------------------


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return JSONResponse(
        APIError(exc.status_code, message, code=code).body(),
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


async def _server_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    body = APIError(500, f"internal server error ({type(exc).__name__}); see the server log").body()
    return JSONResponse(body, status_code=500)


# -- middleware ------------------------------------------------------------------------------------


class _Guard:
    """API-key check on /v1/*, requests/duration metrics by route and status, and the access log line (a pure
    ASGI middleware: it sees a stream's status at its start and its duration at its last byte)."""

    def __init__(self, app: ASGIApp, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = next((r for r in ROUTES if path == r or path.startswith(r + "/")), "other")
        status = 500
        started = False
        t0 = time.perf_counter()
        record = access.start(scope)

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
            await send(message)

        try:
            if path.startswith("/v1/") and not self._authorized(scope):
                error = APIError(
                    401, "missing or wrong API key: send 'Authorization: Bearer KEY'", code="invalid_api_key"
                )
                await JSONResponse(error.body(), status_code=401)(scope, receive, send_wrapper)
                return
            await self.app(scope, receive, send_wrapper)
        except asyncio.CancelledError:
            # uvicorn cancels what still runs when --shutdown-timeout is over (a request waiting in the queue, or
            # generating): its own answer would be a plain-text 500. A stream already begun just ends.
            if started:
                raise
            error = APIError(503, "the server is shutting down; retry the request", code="shutting_down")
            await JSONResponse(error.body(), status_code=503, headers={"Connection": "close"})(
                scope, receive, send_wrapper
            )
        finally:
            elapsed = time.perf_counter() - t0
            m = self.state.metrics
            m.requests.labels(route, str(status)).inc()
            m.request_seconds.labels(route).observe(elapsed)
            access.log_request(scope["method"], path, status, record, elapsed * 1e3)

    def _authorized(self, scope: Scope) -> bool:
        key = self.state.api_key
        if key is None:
            return True
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = auth.partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else headers.get(b"x-api-key", b"").decode("latin-1")
        return hmac.compare_digest(given.encode(), key.encode())


def create_app(state: ServerState) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        # uvicorn has stopped taking requests and waited for those in flight: stop the worker.
        state.scheduler.close()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model:path}", model, methods=["GET"]),
            Route("/", index, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _server_error},
        lifespan=lifespan,
    )
    app.state.serve = state
    app.add_middleware(_Guard, state=state)
    return app
