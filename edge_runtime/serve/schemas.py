"""Request bodies checked into typed requests, and the OpenAI response objects built from results.

Parsing is by hand, not a schema library: each check names the parameter OpenAI names, so a client sees
`param: "temperature"` with the reason, and the server needs nothing beyond Starlette. Fields this
server does not know are ignored (SDKs and agent frameworks send `user`, `metadata`, `store`, ...);
known fields it cannot honour are refused when set to anything but their neutral value, rather than
silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from edge_runtime.chat import template_variables
from edge_runtime.errors import ChatTemplateError, EdgeRuntimeError
from edge_runtime.generate import MAX_STOP_CHARS
from edge_runtime.sampling import MIN_TEMPERATURE, SamplingParams
from edge_runtime.sampling_defaults import SamplingDefaults

from .errors import APIError, bad_request, invalid_type

MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class GenParams:
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    logprobs: int | None  # None: no logprobs; k: each token's logprob and its k best alternatives
    stream: bool
    include_usage: bool
    grammar: Any = None  # constrain.Grammar from response_format json_object / json_schema
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]); ids checked against the vocab


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: GenParams
    tool_choice: Any = None  # "auto" | "none" | "required" | {"type": "function", "function": {"name": ...}}
    parallel_tool_calls: bool = False  # OpenAI defaults to true; a 135M model allowed several repeats its call
    # The template's variables for this request (vLLM's and llama.cpp's server's chat_template_kwargs)
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompt: str | list[int]
    params: GenParams


class _Body:
    """Typed getters over a JSON object; each refusal is a 400 naming the field."""

    def __init__(self, data: Any):
        if not isinstance(data, dict):
            raise bad_request(f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
        self.data = data

    def get(self, name: str) -> Any:
        return self.data.get(name)

    def bool(self, name: str, default: bool) -> bool:
        v = self.data.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise invalid_type(name, "a boolean", v)
        return v

    def int(self, name: str, default: int | None, lo: int | None = None, hi: int | None = None) -> int | None:
        v = self.data.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise invalid_type(name, "an integer", v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise bad_request(f"'{name}' must be {bounds}, got {v}", param=name)
        return v

    def float(self, name: str, default: float | None) -> float | None:
        v = self.data.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise invalid_type(name, "a finite number", v)
        return float(v)

    def str(self, name: str) -> str | None:
        v = self.data.get(name)
        if v is not None and not isinstance(v, str):
            raise invalid_type(name, "a string", v)
        return v

    def neutral(self, name: str, ok: Callable[[Any], bool], what: str) -> None:
        """Refuse a known field this server cannot honour unless it has its neutral value."""
        v = self.data.get(name)
        if v is not None and not ok(v):
            raise APIError(
                400, f"'{name}' is not supported by this server ({what})", param=name, code="unsupported_value"
            )


def _logit_bias(body: _Body) -> tuple[tuple[int, float], ...]:
    """OpenAI's `{"token id": bias}`; JSON keys are strings, so "50256" names token 50256."""
    v = body.get("logit_bias")
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise invalid_type("logit_bias", "an object mapping token ids to biases", v)
    pairs = []
    for key, value in v.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 10):
            raise bad_request(
                f"'logit_bias' keys must be token ids (non-negative integers), got {key!r}", param="logit_bias"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise bad_request(
                f"'logit_bias' values must be numbers in [-100, 100], got {value!r} for token {key}", param="logit_bias"
            )
        pairs.append((int(key), float(value)))
    return tuple(pairs)


def _stop(body: _Body) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid_type("stop", "a string or a list of strings", v)
    if len(stops) > MAX_STOP:
        raise bad_request(f"'stop' takes at most {MAX_STOP} sequences, got {len(stops)}", param="stop")
    if any(not s for s in stops):
        raise bad_request("'stop' sequences must be non-empty", param="stop")
    longest = max(len(s) for s in stops) if stops else 0
    if longest > MAX_STOP_CHARS:  # each is compared with every token's text on the one engine thread
        raise bad_request(
            f"'stop' sequences are at most {MAX_STOP_CHARS} characters, got one of {longest}", param="stop"
        )
    return tuple(stops)


# OpenAI's meaning of absent fields (sampling at T = 1); the server passes the model's defaults instead
OPENAI_SAMPLING = SamplingDefaults(SamplingParams(temperature=1.0), "OpenAI's default")


def _sampling(body: _Body, defaults: SamplingDefaults) -> SamplingParams:
    """The request's fields over the model's defaults (sampling_defaults.py), as Ollama and llama-server do,
    not OpenAI's T = 1: a field left out means "as the model is meant to be run"."""
    temperature = body.float("temperature", None)
    if temperature is not None and not 0 <= temperature <= 2:
        raise bad_request(f"'temperature' must be in [0, 2], got {temperature}", param="temperature")
    if temperature is not None and temperature < MIN_TEMPERATURE:  # greedy in effect; the sampler refuses these
        temperature = 0.0
    top_p = body.float("top_p", None)
    if top_p is not None and not 0 < top_p <= 1:
        raise bad_request(f"'top_p' must be in (0, 1], got {top_p}", param="top_p")
    # llama.cpp's extensions, accepted under the same names.
    top_k = body.int("top_k", None, lo=0)
    min_p = body.float("min_p", None)
    penalty = body.float("repetition_penalty", None)
    seed = body.int("seed", None)
    if seed is not None and seed < 0:
        seed %= 2**64  # OpenAI takes any int64; numpy seeds must be >= 0
    try:
        return defaults.resolve(
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repetition_penalty=penalty, seed=seed
        )
    except EdgeRuntimeError as e:
        raise bad_request(str(e)) from None


def _common(body: _Body, max_tokens_limit: int, logprobs: int | None, defaults: SamplingDefaults) -> GenParams:
    n = body.int("n", 1)
    if n != 1:
        raise APIError(
            400,
            f"'n' must be 1 on this server (one completion per request), got {n}",
            param="n",
            code="unsupported_value",
        )
    body.neutral("frequency_penalty", lambda v: v == 0, "use repetition_penalty")
    body.neutral("presence_penalty", lambda v: v == 0, "use repetition_penalty")
    body.neutral("best_of", lambda v: v == 1, "one completion per request")
    limit = max_tokens_limit
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.int(name, limit, lo=1)
    assert max_tokens is not None
    if max_tokens > limit:
        raise bad_request(
            f"'{name}' is {max_tokens}; this server generates at most {limit} tokens per request (edge-serve "
            "--max-tokens)",
            param=name,
            code="max_tokens_exceeded",
        )
    stream = body.bool("stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid_type("stream_options", "an object", options)
    include_usage = False
    if options is not None:
        include_usage = _Body(options).bool("include_usage", False)
    sampling = _sampling(body, defaults)
    return GenParams(max_tokens, sampling, _stop(body), logprobs, stream, include_usage, logit_bias=_logit_bias(body))


def parse_chat(data: Any, max_tokens_limit: int, defaults: SamplingDefaults = OPENAI_SAMPLING) -> ChatRequest:
    body = _Body(data)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request(
            "'messages' must be a non-empty list of {role, content} objects",
            param="messages",
            code="invalid_type" if not isinstance(messages, list) else "invalid_value",
        )
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise invalid_type("tools", "a list of objects", tools)
    grammar = _response_format(body.get("response_format"))
    body.neutral("modalities", lambda v: v == ["text"], "text only")
    logprobs = None
    if body.bool("logprobs", False):
        logprobs = body.int("top_logprobs", 0, lo=0, hi=MAX_TOP_LOGPROBS)
    elif body.get("top_logprobs") is not None:
        raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    params = replace(_common(body, max_tokens_limit, logprobs, defaults), grammar=grammar)
    tool_choice = body.get("tool_choice")
    if tool_choice is not None and not tools:
        raise bad_request("'tool_choice' needs 'tools'", param="tool_choice")
    if tools and grammar is not None:
        raise bad_request("give 'tools' or a JSON 'response_format', not both", param="response_format")
    parallel = body.bool("parallel_tool_calls", False)
    kwargs = body.get("chat_template_kwargs")
    try:
        kwargs = {} if kwargs is None else template_variables(kwargs, "'chat_template_kwargs'")
    except ChatTemplateError as e:
        raise bad_request(str(e), param="chat_template_kwargs") from None
    return ChatRequest(body.str("model"), messages, tools or None, params, tool_choice or "auto", parallel, kwargs)


def _response_format(value: Any) -> Any:
    """OpenAI's response_format compiled (edge_runtime/constrain.py); a bad one is a 400 before any generation."""
    if value is None:
        return None
    from edge_runtime import constrain

    try:
        return constrain.from_response_format(value)
    except EdgeRuntimeError as e:
        raise bad_request(str(e), param="response_format") from None


def parse_completion(
    data: Any, max_tokens_limit: int, defaults: SamplingDefaults = OPENAI_SAMPLING
) -> CompletionRequest:
    body = _Body(data)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    ids = isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)
    if not (isinstance(prompt, str) or ids):
        raise bad_request(
            "'prompt' must be a string or a list of token ids (one prompt per request)",
            param="prompt",
            code="invalid_type",
        )
    body.neutral("echo", lambda v: v is False, "the prompt is not echoed")
    body.neutral("suffix", lambda v: v == "", "no insertion")
    logprobs = body.int("logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    return CompletionRequest(body.str("model"), prompt, _common(body, max_tokens_limit, logprobs, defaults))


# -- responses -------------------------------------------------------------------------------------

TokenText = Callable[[int], str]


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def _entry(text: TokenText, token: int, logprob: float) -> dict[str, Any]:
    s = text(token)
    return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8"))}


def chat_logprobs(items: Sequence[TokenLogprob], text: TokenText) -> dict[str, Any]:
    content = [
        {**_entry(text, it.token, it.logprob), "top_logprobs": [_entry(text, t, lp) for t, lp in it.top]}
        for it in items
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(items: Sequence[TokenLogprob], text: TokenText, offset: int = 0) -> dict[str, Any]:
    tokens = [text(it.token) for it in items]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": [it.logprob for it in items],
        "top_logprobs": [{text(t): lp for t, lp in it.top} for it in items],
        "text_offset": offsets,
    }


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def envelope(obj: str, rid: str, created: int, model: str, fingerprint: str) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": fingerprint}


def model_list(model: str, created: int, extra: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "edge-runtime", **extra}],
    }
