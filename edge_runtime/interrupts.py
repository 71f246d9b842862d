"""Sections a Ctrl-C cannot split: the ring and the bookkeeping beside it change together or not at all.

    with atomic():          # a SIGINT that lands in here is raised when the outermost section ends
        ring advances; the graph writes the row; the session records the token
    poll()                  # inside a section: raise a deferred Ctrl-C now (between prefill chunks)

Python raises KeyboardInterrupt between any two bytecodes, so a Ctrl-C could land after the ring advanced
and before the session recorded the token, and the conversation was lost on the next turn. The first
section entered on the main thread wraps the SIGINT handler in place (whatever it is, Python's default or
the application's own) with one that defers the call while a section is open and passes it on unchanged
otherwise; entering a section afterwards costs a counter, not a system call. Handlers that are not Python
callables (SIG_IGN, SIG_DFL) are left alone: with them no KeyboardInterrupt is raised to split anything.
Other threads never receive SIGINT, so sections there are no-ops.
"""

from __future__ import annotations

import signal
import threading
from signal import SIGINT, getsignal
from threading import get_ident
from types import FrameType
from typing import Any

_MAIN = threading.main_thread().ident
_depth = 0
_deferred: tuple[int, FrameType | None] | None = None
_previous: Any = None  # the handler ours wraps


def _handler(signum: int, frame: FrameType | None) -> None:
    global _deferred
    if _depth:
        _deferred = (signum, frame)
        return
    if callable(_previous):
        _previous(signum, frame)


def _deliver() -> None:
    global _deferred
    if _deferred is not None:
        signum, frame = _deferred
        _deferred = None
        if callable(_previous):
            _previous(signum, frame)


class atomic:
    """A section no Ctrl-C splits (re-entrant; a no-op off the main thread)."""

    __slots__ = ("active",)

    def __enter__(self) -> None:
        global _depth, _previous
        self.active = get_ident() == _MAIN
        if not self.active:
            return
        if not _depth:  # nested sections (the engine's step inside the session's) skip the handler check
            current = getsignal(SIGINT)
            if current is not _handler and callable(current):
                _previous = current
                signal.signal(SIGINT, _handler)
        _depth += 1

    def __exit__(self, *exc: object) -> None:
        global _depth
        if not self.active:
            return
        _depth -= 1
        if _depth == 0:
            _deliver()


def poll() -> None:
    """Inside a section: raise a Ctrl-C deferred so far now (the caller's `finally` still runs deferred)."""
    if get_ident() == _MAIN:
        _deliver()
