"""POST /v1/chat/completions and /v1/completions: one generation each, as JSON or as server-sent events.

The response waits for the worker's first event before it sends headers, so a request the engine refuses
(a turn longer than the window, a failing model) is still an HTTP error with OpenAI's error object; after
that, a failure is sent as an SSE `data: {"error": ...}` event (what the openai client raises on). Every
stream ends with `data: [DONE]`. A client that disconnects, while waiting or mid-stream, cancels its job.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from edge_runtime.chat import normalize_messages
from edge_runtime.conversation import Encoded
from edge_runtime.errors import ChatTemplateError

from .access import AccessRecord, record_of
from .errors import APIError
from .scheduler import Failure, Finished, Job, Piece
from .schemas import (
    ChatRequest,
    GenParams,
    TokenLogprob,
    chat_logprobs,
    completion_logprobs,
    envelope,
    parse_chat,
    parse_completion,
    usage,
)

if TYPE_CHECKING:
    from .app import ServerState

EXTENSION = "edge_runtime"  # our own fields (slot, timings, energy) live under this one key


# -- the two endpoints -----------------------------------------------------------------------------


async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.serve
    arrival = time.perf_counter()
    req = parse_chat(await state.read_json(request), state.max_tokens, state.sampling)
    state.check_model(req.model)
    _check_bias(state, req.params)
    encoded, params, tool_format = await run_in_threadpool(_chat_prompt, state, req)
    job = Job(encoded.ids, params, asyncio.get_running_loop(), arrival=arrival)

    def served(finished: Finished) -> None:  # only then is the conversation worth its memory
        if finished.completion_tokens:
            state.conversations.keep(encoded)

    return await _respond(request, state, job, _ChatFormat(state, params, tool_format), served)


async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.serve
    arrival = time.perf_counter()
    req = parse_completion(await state.read_json(request), state.max_tokens, state.sampling)
    state.check_model(req.model)
    _check_bias(state, req.params)
    if isinstance(req.prompt, str):
        ids = await run_in_threadpool(state.tokenizer.encode, req.prompt)
    else:
        vocab = state.engine.manifest.model.vocab_size
        if not all(0 <= i < vocab for i in req.prompt):
            raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt", code="invalid_value")
        ids = list(req.prompt)
    if not ids:
        raise APIError(
            422, "the prompt encodes to no tokens (and this tokenizer adds no BOS)", param="prompt", code="empty_prompt"
        )
    job = Job(ids, req.params, asyncio.get_running_loop(), arrival=arrival)
    return await _respond(request, state, job, _CompletionFormat(state, req.params))


def _check_bias(state: ServerState, params: GenParams) -> None:
    vocab = state.engine.manifest.model.vocab_size
    bad = [token for token, _ in params.logit_bias if token >= vocab]
    if bad:
        raise APIError(
            400,
            f"'logit_bias' names token {bad[0]}; token ids are in [0, {vocab})",
            param="logit_bias",
            code="invalid_value",
        )


def _chat_prompt(state: ServerState, req: ChatRequest) -> tuple[Encoded, GenParams, str | None]:
    """The prompt's ids (with what the conversation cache keeps once served), the generation parameters (with
    the tool-call constraint) and the tool-call format to parse the reply with (None: no tools, or tool_choice
    "none")."""
    if state.template is None:
        raise APIError(
            400,
            f"model '{state.model_id}' has no chat template (its checkpoint had none); use "
            "/v1/completions with a raw prompt, or re-export it with edge-export --chat-template FILE",
            param="messages",
            code="no_chat_template",
        )
    try:
        messages = normalize_messages(req.messages)  # roles, content types: the client's mistake, a 400
    except ChatTemplateError as e:
        raise APIError(400, str(e), param="messages", code="invalid_value") from None
    params, tool_format, tools = req.params, None, req.tools
    if req.tools:
        messages, params, tool_format, tools = _with_tools(state, req, messages)
    try:
        text = state.template.render(messages, add_generation_prompt=True, tools=tools, **req.template_kwargs)
    except ChatTemplateError as e:  # the template itself refused this conversation (raise_exception)
        raise APIError(422, str(e), param="messages", code="template_refused") from None
    # ids = tokenizer.encode(text, add_special_tokens=False), incrementally; cached only once served
    encoded = state.conversations.encode(text)
    if not encoded.ids:
        raise APIError(
            422,
            "the messages render to no tokens through this model's chat template",
            param="messages",
            code="empty_prompt",
        )
    return encoded, params, tool_format


def _with_tools(
    state: ServerState, req: ChatRequest, messages: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], GenParams, str | None, list[dict[str, Any]]]:
    """OpenAI tools through edge_runtime/tools.py: the call constrained to one of the functions (tool_choice), the
    tools prompt and earlier calls/results rendered for templates that ignore `tools`."""
    from dataclasses import replace

    from edge_runtime import tools as tool_calls
    from edge_runtime.errors import ConstraintError

    try:
        fns = tool_calls.functions(req.tools or [])
        fmt = tool_calls.detect_format(state.template)
        grammar = tool_calls.call_grammar(fns, req.tool_choice, fmt, req.parallel_tool_calls)
    except ConstraintError as e:
        param = "tool_choice" if "tool_choice" in str(e) else "tools"
        raise APIError(400, str(e), param=param, code="invalid_value") from None
    prepared = tool_calls.prepare_messages(messages, fns, state.template)
    rendered_tools = [{"type": "function", "function": f} for f in fns]
    parse = None if req.tool_choice == "none" else fmt
    return prepared, replace(req.params, grammar=grammar), parse, rendered_tools


# -- driving a job ---------------------------------------------------------------------------------


async def _respond(
    request: Request, state: ServerState, job: Job, fmt: _Format, served: Callable[[Finished], None] | None = None
) -> Response:
    """Submit `job` and answer with its events; `served` sees the closing event of a job that ran to its end."""
    state.scheduler.submit(job)  # APIError 503 when the queue is full
    record = record_of(request.scope)  # the access log's token counts
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    try:
        first = await job.events.get()
        if isinstance(first, Failure):
            raise first.error
        if job.params.stream:
            watcher.cancel()  # StreamingResponse listens for the disconnect from here on
            return _JobStream(
                job,
                _sse(job, first, fmt, record, served),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        pieces: list[Piece] = []
        event = first
        while not isinstance(event, Finished):
            if isinstance(event, Failure):
                raise event.error
            pieces.append(event)
            event = await job.events.get()
        record.finished(event)
        if served is not None:
            served(event)
        return JSONResponse(fmt.whole(pieces, event))
    except BaseException:
        job.cancel()  # an error response, or this handler cancelled: the worker stops at its next token
        raise
    finally:
        watcher.cancel()


class _JobStream(StreamingResponse):
    """A stream that cancels its job however it ends: finished, disconnected, or failed before the first byte."""

    def __init__(self, job: Job, content: AsyncIterator[bytes], **kwargs: Any):
        super().__init__(content, **kwargs)
        self.job = job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


async def _watch_disconnect(request: Request, job: Job) -> None:
    # The body has been read, so the next ASGI message is the disconnect (or none, until the response ends).
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


async def _sse(
    job: Job,
    first: Piece | Finished,
    fmt: _Format,
    record: AccessRecord,
    served: Callable[[Finished], None] | None = None,
) -> AsyncIterator[bytes]:
    try:
        for chunk in fmt.opening():
            yield _data(chunk)
        event: Piece | Finished | Failure = first
        while True:
            if isinstance(event, Piece):
                chunk = fmt.piece(event)
                if chunk is not None:
                    yield _data(chunk)
            elif isinstance(event, Finished):
                record.finished(event)
                if served is not None:
                    served(event)
                for chunk in fmt.closing(event):
                    yield _data(chunk)
                break
            else:
                yield _data(event.error.body())
                break
            event = await job.events.get()
        yield b"data: [DONE]\n\n"
    finally:
        job.cancel()  # a no-op once finished; stops the worker at its next token if the client left


def _data(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


# -- response shapes -------------------------------------------------------------------------------


class _Format:
    object_whole = ""
    object_chunk = ""
    prefix = ""

    def __init__(self, state: ServerState, params: GenParams):
        self.params = params
        self.text = state.token_text
        self.head = {"created": int(time.time()), "model": state.model_id, "fingerprint": state.fingerprint}
        self.rid = f"{self.prefix}-{uuid.uuid4().hex[:24]}"

    def _env(self, obj: str) -> dict[str, Any]:
        return envelope(obj, self.rid, self.head["created"], self.head["model"], self.head["fingerprint"])

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        out = {**self._env(self.object_chunk), "choices": [choice]}
        if self.params.include_usage:
            out["usage"] = None
        return out

    @staticmethod
    def _reason(f: Finished) -> str:
        return "length" if f.finish_reason == "cancelled" else f.finish_reason

    @staticmethod
    def _extension(f: Finished) -> dict[str, Any]:
        ext: dict[str, Any] = {"slot": f.slot, "timings": f.timings, "energy": f.energy}
        if f.finish_reason == "cancelled":
            ext["cancelled"] = True
        return ext

    def _usage(self, f: Finished) -> dict[str, Any]:
        return usage(f.prompt_tokens, f.completion_tokens, f.cached_tokens)

    def _closing_usage(self, f: Finished) -> list[dict[str, Any]]:
        if not self.params.include_usage:
            return []
        return [{**self._env(self.object_chunk), "choices": [], "usage": self._usage(f)}]

    def opening(self) -> list[dict[str, Any]]:
        return []

    def piece(self, p: Piece) -> dict[str, Any] | None:
        raise NotImplementedError

    def closing(self, f: Finished) -> list[dict[str, Any]]:
        raise NotImplementedError

    def whole(self, pieces: list[Piece], f: Finished) -> dict[str, Any]:
        raise NotImplementedError


def _logprob_items(pieces: list[Piece]) -> list[TokenLogprob]:
    return [p.logprob for p in pieces if p.logprob is not None]


class _ChatFormat(_Format):
    object_whole, object_chunk, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def __init__(self, state: ServerState, params: GenParams, tool_format: str | None = None):
        super().__init__(state, params)
        self.tool_format = tool_format  # with tools, a streamed reply is held back until it can be parsed
        self.held: list[str] = []

    def _tool_reply(self, text: str, f: Finished) -> tuple[dict[str, Any], str]:
        from edge_runtime.tools import parse_tool_calls

        content, calls = parse_tool_calls(text, self.tool_format or "hermes")
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        return message, "tool_calls" if calls and f.finish_reason == "stop" else self._reason(f)

    def opening(self) -> list[dict[str, Any]]:
        delta = {"role": "assistant", "content": ""}
        return [self._chunk({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})]

    def piece(self, p: Piece) -> dict[str, Any] | None:
        if self.tool_format is not None:
            self.held.append(p.text)
            return None
        if not p.text and p.logprob is None:
            return None
        logprobs = chat_logprobs([p.logprob], self.text) if p.logprob is not None else None
        return self._chunk({"index": 0, "delta": {"content": p.text}, "logprobs": logprobs, "finish_reason": None})

    def closing(self, f: Finished) -> list[dict[str, Any]]:
        out = []
        reason = self._reason(f)
        if self.tool_format is not None:
            message, reason = self._tool_reply("".join(self.held), f)
            delta: dict[str, Any] = {"content": message["content"]}
            if "tool_calls" in message:
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
            out.append(self._chunk({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}))
        last = self._chunk({"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason})
        out.append({**last, EXTENSION: self._extension(f)})
        return out + self._closing_usage(f)

    def whole(self, pieces: list[Piece], f: Finished) -> dict[str, Any]:
        text = "".join(p.text for p in pieces)
        logprobs = chat_logprobs(_logprob_items(pieces), self.text) if self.params.logprobs is not None else None
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        reason = self._reason(f)
        if self.tool_format is not None:
            message, reason = self._tool_reply(text, f)
        choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": reason}
        return {
            **self._env(self.object_whole),
            "choices": [choice],
            "usage": self._usage(f),
            EXTENSION: self._extension(f),
        }


class _CompletionFormat(_Format):
    object_whole = object_chunk = "text_completion"
    prefix = "cmpl"

    def __init__(self, state: ServerState, params: GenParams):
        super().__init__(state, params)
        self.offset = 0  # text_offset of the next token, in characters of the completion

    def piece(self, p: Piece) -> dict[str, Any] | None:
        if not p.text and p.logprob is None:
            return None
        logprobs = None
        if p.logprob is not None:
            logprobs = completion_logprobs([p.logprob], self.text, self.offset)
            self.offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
        return self._chunk({"text": p.text, "index": 0, "logprobs": logprobs, "finish_reason": None})

    def closing(self, f: Finished) -> list[dict[str, Any]]:
        last = self._chunk({"text": "", "index": 0, "logprobs": None, "finish_reason": self._reason(f)})
        return [{**last, EXTENSION: self._extension(f)}, *self._closing_usage(f)]

    def whole(self, pieces: list[Piece], f: Finished) -> dict[str, Any]:
        text = "".join(p.text for p in pieces)
        logprobs = None
        if self.params.logprobs is not None:
            logprobs = completion_logprobs(_logprob_items(pieces), self.text)
        choice = {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": self._reason(f)}
        return {
            **self._env(self.object_whole),
            "choices": [choice],
            "usage": self._usage(f),
            EXTENSION: self._extension(f),
        }
