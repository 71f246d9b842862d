"""Encoding a conversation that grows turn by turn, in time proportional to the turn, not to the conversation.

A chat turn renders the whole conversation through its template (templates may depend on any message, so
rendering is the one safe way) and needs its ids to find what the session's ring already holds. Rendering
is cheap; encoding is not: 635,000 tokens of conversation (5,000 exchanges, a robot's afternoon) took 3.4 s
a turn to encode on a 2-core AMD EPYC against 0.09 s to render. So each turn re-encodes only the text from
the last special token the previous ids hold (ChatML's `<|im_start|>`, Llama 3's `<|start_header_id|>`)
and keeps the ids before it.

Exact, not approximate: the tokenizers library splits its input at added special tokens before
normalising, pre-tokenising or merging, so the ids of `A + S + B` (S a special token) are `ids(A)`, then
S, then `ids(B)`, whatever A and B are. So the ids up to the last special token inside the text both
renderings share stay valid; an edited message early on, or old ids with no special token, mean encoding
the whole text.
"""

from __future__ import annotations

import threading

from tokenizers import Tokenizer as HFTokenizer

from .tokenizer import Tokenizer


class ConversationEncoder:
    """`encode(text)`: the ids of the rendered conversation, `add_special_tokens=False` (template text)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok: HFTokenizer = tokenizer._tok
        self._special = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        self.text = ""
        self.ids: list[int] = []
        self._starts: list[int] = []  # character offset in `text` where each id's span starts
        self.reencoded = 0  # characters encoded by the last call (for tests and --debug)

    def encode(self, text: str) -> list[int]:
        start, keep = self._resume_point(text)
        enc = self._tok.encode(text[start:], add_special_tokens=False)
        self.ids = self.ids[:keep] + enc.ids
        self._starts = self._starts[:keep] + [start + a for a, _ in enc.offsets]
        self.text, self.reencoded = text, len(text) - start
        return list(self.ids)

    def _resume_point(self, text: str) -> tuple[int, int]:
        """(character offset, ids kept before it): the last special token of the old ids that lies wholly in
        the text the old and new conversations share (a generation prompt rendered last turn and not this
        one ends the shared part early); (0, 0) where there is none."""
        if not self.ids:
            return 0, 0
        shared = len(self.text) if text.startswith(self.text) else _common_prefix(self.text, text)
        for k in range(len(self.ids) - 1, -1, -1):
            token = self._tok.id_to_token(self.ids[k])
            if token in self._special and self._starts[k] + len(token) <= shared:
                return self._starts[k], k
        return 0, 0


class ConversationCache:
    """Several conversations at once (edge-serve: each request carries its whole conversation): `encode(text)`
    continues the cached conversation that shares the most text with it, else the least recently used one.
    Thread-safe: requests are prepared in a thread pool."""

    def __init__(self, tokenizer: Tokenizer, size: int = 8):
        self._encoders = [ConversationEncoder(tokenizer) for _ in range(max(1, size))]  # most recent last
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        with self._lock:
            # A conversation this one continues shares most of its text; sharing only a system prompt or the
            # first header makes it another client's, which the least recently used encoder is given instead.
            shared = [(_common_prefix(e.text, text), e) for e in self._encoders if e.text]
            continued = [(n, e) for n, e in shared if n >= len(e.text) // 2]
            best = max(continued, key=lambda ne: ne[0])[1] if continued else self._encoders[0]
            self._encoders.remove(best)
            self._encoders.append(best)
            return best.encode(text)


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix, by bisection on slice equality (C comparisons, not a Python loop)."""
    if b.startswith(a):
        return len(a)
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
