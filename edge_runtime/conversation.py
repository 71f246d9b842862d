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

import sys
import threading
from array import array
from dataclasses import dataclass

from tokenizers import Tokenizer as HFTokenizer

from .tokenizer import Tokenizer

# What edge-serve's ConversationCache keeps at most, in bytes of text and ids together. A request's body is
# at most 4 MiB (serve/app.py), so this holds several of the longest conversations a client can send, and a
# server's memory does not grow with what its clients send: 8 conversations of up to 64 MiB in all.
CACHE_BYTES = 64 << 20


@dataclass(frozen=True)
class _Encoding:
    """A rendered conversation and its ids, kept compact: 4 bytes an id and 8 a span start (a list of ints
    is 36 bytes an id, ten times the text it came from)."""

    text: str
    ids: array  # "I": the ids of `text`, add_special_tokens=False
    starts: array  # "q": character offset in `text` where each id's span starts

    @property
    def nbytes(self) -> int:
        return sys.getsizeof(self.text) + self.ids.itemsize * len(self.ids) + self.starts.itemsize * len(self.starts)


_EMPTY = _Encoding("", array("I"), array("q"))


def _special_tokens(tok: HFTokenizer) -> set[str]:
    return {t.content for t in tok.get_added_tokens_decoder().values() if t.special}


def _extend(tok: HFTokenizer, special: set[str], old: _Encoding, text: str) -> tuple[_Encoding, int]:
    """(`text`'s encoding, characters encoded): `old`'s ids kept up to its last special token that lies wholly
    in the text both share, the rest encoded. `old` is not changed."""
    start, keep = _resume_point(tok, special, old, text)
    enc = tok.encode(text[start:], add_special_tokens=False)
    ids = old.ids[:keep]
    ids.extend(enc.ids)
    starts = old.starts[:keep]
    starts.extend(start + a for a, _ in enc.offsets)
    return _Encoding(text, ids, starts), len(text) - start


def _resume_point(tok: HFTokenizer, special: set[str], old: _Encoding, text: str) -> tuple[int, int]:
    """(character offset, ids kept before it): the last special token of the old ids that lies wholly in the
    text the old and new conversations share (a generation prompt rendered last turn and not this one ends
    the shared part early); (0, 0) where there is none."""
    if not old.ids:
        return 0, 0
    shared = len(old.text) if text.startswith(old.text) else _common_prefix(old.text, text)
    for k in range(len(old.ids) - 1, -1, -1):
        token = tok.id_to_token(old.ids[k])
        if token in special and old.starts[k] + len(token) <= shared:
            return old.starts[k], k
    return 0, 0


class ConversationEncoder:
    """`encode(text)`: the ids of the rendered conversation, `add_special_tokens=False` (template text)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok: HFTokenizer = tokenizer._tok
        self._special = _special_tokens(self._tok)
        self._last = _EMPTY
        self.reencoded = 0  # characters encoded by the last call (for tests and --debug)

    @property
    def text(self) -> str:
        return self._last.text

    def encode(self, text: str) -> list[int]:
        self._last, self.reencoded = _extend(self._tok, self._special, self._last, text)
        return self._last.ids.tolist()


@dataclass(frozen=True)
class Encoded:
    """One request's conversation, from `ConversationCache.encode`: its ids, and what `keep` caches once it
    was served."""

    ids: list[int]
    reencoded: int  # characters encoded (the rest came from a cached conversation)
    _encoding: _Encoding
    _continues: _Encoding | None  # the cached conversation it continues, which `keep` replaces


class ConversationCache:
    """Several conversations at once (edge-serve: each request carries its whole conversation): `encode(text)`
    starts from the cached conversation that shares the most text with it; `keep(encoded)` caches the result,
    in place of the conversation it continues, once the request was served. Only served requests are kept: a
    refused one (a prompt beyond the window, a full queue) leaves the cache as it was, so large refused
    requests cannot grow the server. At most `size` conversations and `max_bytes` of text and ids in all,
    the least recently kept evicted first; one larger than `max_bytes` is not kept. Thread-safe: requests
    are prepared in a thread pool."""

    def __init__(self, tokenizer: Tokenizer, size: int = 8, max_bytes: int = CACHE_BYTES):
        self._tok: HFTokenizer = tokenizer._tok
        self._special = _special_tokens(self._tok)
        self._size, self._max_bytes = max(1, size), max_bytes
        self._kept: list[_Encoding] = []  # most recently kept last
        self._lock = threading.Lock()

    def encode(self, text: str) -> Encoded:
        with self._lock:
            shared = [(_common_prefix(e.text, text), e) for e in self._kept]
        # Any cached text's shared prefix saves encoding it (another client's system prompt, say); but a
        # conversation this one continues shares most of its text, and only that one is replaced by `keep`.
        n, base = max(shared, key=lambda ne: ne[0], default=(0, None))
        continued = [(n, e) for n, e in shared if n >= len(e.text) // 2]
        continues = max(continued, key=lambda ne: ne[0])[1] if continued else None
        # Outside the lock: cached encodings are never changed, and requests encode in parallel.
        encoding, reencoded = _extend(self._tok, self._special, base if base is not None and n else _EMPTY, text)
        return Encoded(encoding.ids.tolist(), reencoded, encoding, continues)

    def keep(self, encoded: Encoded) -> None:
        """Cache a served request's conversation (evicting the least recently kept beyond the bounds)."""
        new = encoded._encoding
        with self._lock:
            self._kept = [e for e in self._kept if e is not encoded._continues and e.text != new.text]
            if new.nbytes <= self._max_bytes:
                self._kept.append(new)
            while len(self._kept) > self._size or sum(e.nbytes for e in self._kept) > self._max_bytes:
                self._kept.pop(0)

    @property
    def nbytes(self) -> int:
        """Bytes of text and ids cached."""
        with self._lock:
            return sum(e.nbytes for e in self._kept)

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)


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
