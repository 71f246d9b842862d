"""OpenAI-shaped errors: every refusal is `{"error": {"message", "type", "param", "code"}}` with its status.

A client mistake is a 4xx naming the offending parameter, never a 500 and never a traceback; a server
fault is a 500 whose message says what failed (the traceback goes to the server's log only).

| status | type                  | when                                                              |
| 400    | invalid_request_error | malformed JSON, a wrong type or value, `n > 1`, unsupported value |
| 401    | invalid_request_error | a missing or wrong API key (code `invalid_api_key`)                |
| 404    | invalid_request_error | an unknown route, or model if strict (`model_not_found`)         |
| 405    | invalid_request_error | a route asked with the wrong method                                |
| 413    | invalid_request_error | a body over the size limit, or a prompt a slot cannot take         |
| 422    | invalid_request_error | messages the chat template refuses, or that render to no tokens    |
| 503    | server_error          | the queue is full (with Retry-After), or the server is stopping    |
| 500    | server_error          | the model failed (corrupt output, ...): the server's own fault    |
"""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error the client gets as OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,  # OpenAI's field name
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ("server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def invalid_type(param: str, expected: str, value: Any) -> APIError:
    return APIError(400, f"'{param}' must be {expected}, got {_show(value)}", param=param, code="invalid_type")


def _show(value: Any) -> str:
    text = repr(value)
    kind = type(value).__name__ if value is not None else "null"
    return f"{kind} {text[:60]}{'...' if len(text) > 60 else ''}"
