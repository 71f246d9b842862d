"""The access log: one `key=value` line per request, logged by the middleware (app.py) once the response's last
byte is sent, with the token counts a generation route records on the way.

    INFO: edge_serve.access: method=POST route=/v1/chat/completions status=200 prompt_tokens=17 cached_tokens=0
    generated_tokens=8 ttft_ms=10.4 total_ms=35.2          (one line; '-' where a request generated nothing)

At info level on the `edge_serve.access` logger, so `--log-level warning` silences it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlette.types import Scope

from .scheduler import Finished

log = logging.getLogger("edge_serve.access")

_SCOPE_KEY = "edge_serve.access"


@dataclass
class AccessRecord:
    """What a generation route knows and the middleware does not: the generation's token counts and TTFT."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    generated_tokens: int | None = None
    ttft_ms: float | None = None

    def finished(self, f: Finished) -> None:
        self.prompt_tokens, self.cached_tokens, self.generated_tokens = (
            f.prompt_tokens,
            f.cached_tokens,
            f.completion_tokens,
        )
        self.ttft_ms = f.timings.get("ttft_ms")  # absent when the job was cancelled before it ran


def start(scope: Scope) -> AccessRecord:
    """A fresh record, kept in the request's scope for the route to fill."""
    record = scope[_SCOPE_KEY] = AccessRecord()
    return record


def record_of(scope: Scope) -> AccessRecord:
    """The request's record (a throwaway one when no middleware started it)."""
    return scope.get(_SCOPE_KEY) or AccessRecord()


def log_request(method: str, path: str, status: int, record: AccessRecord, total_ms: float) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    # Quoted: a percent-decoded path may hold spaces or line breaks, which would split or forge a line.
    log.info(
        "method=%s route=%s status=%d prompt_tokens=%s cached_tokens=%s generated_tokens=%s ttft_ms=%s total_ms=%.1f",
        quote(method, safe=""),
        quote(path, safe="/"),
        status,
        _value(record.prompt_tokens),
        _value(record.cached_tokens),
        _value(record.generated_tokens),
        _value(record.ttft_ms),
        total_ms,
    )


def _value(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if isinstance(v, float) else str(v)
