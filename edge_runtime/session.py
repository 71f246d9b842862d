"""Session: one conversation living in a KV cache's StreamingLLM ring across calls.

    session = Session(engine)            # the engine's cache; Session(engine.on(1)): the model's second one
    for step in session.send(turn_ids, max_tokens=64): ...   # feeds only turn_ids; the reply stays
    rest = session.match(conversation)   # a resent conversation: rolls back to what is reusable
    snap = session.snapshot(); ...; session.restore(snap)     # a prompt cache (save/load: to disk)
    session.truncate(3)                  # rollback, exact within the ring's slack rows

The conversation is every token fed to the ring plus at most one *pending* token: the last token of a
reply, shown to the caller but not fed yet (the loop feeds a token only when asked for the next one).
The next call feeds it first. Past capacity the ring evicts as StreamingLLM does (sinks kept), so a
conversation of any length runs in one ring; the session keeps a row's token id beside each K/V row
and a digest of the evicted ones, nothing that grows with the conversation.

A turn longer than the window is chunked, not refused (unless `overflow="refuse"`): it is exactly
the StreamingLLM stream of those tokens, but its first tokens leave the window before the reply
starts, so a RingOverflowWarning says how many. Messages are rendered to token ids elsewhere
(chat.py); a `send_messages` belongs beside `send` once they are.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .engine import Engine
from .errors import CorruptSnapshotError, EdgeRuntimeError, RingOverflowError, SessionError
from .generate import step_generator
from .interrupts import atomic
from .manifest import Manifest
from .sampling import LogitsProcessor, Sampler, SamplingParams, Step
from .snapshot import Snapshot, bundle_checksum

if TYPE_CHECKING:
    from .constrain import Grammar
    from .speculative import SpeculativeDecoder

_BLOCK = 256  # evicted ids per hashed block


class RingOverflowWarning(UserWarning):
    """A turn longer than the window: its first tokens were evicted before the reply began."""


class EvictedDigest:
    """A hash chain over the ids evicted from the ring, in stream order: lets `match` check that a resent
    conversation agrees with the part the ring no longer holds, in constant memory."""

    def __init__(self, count: int = 0, chain: bytes = b"", partial: Sequence[int] = ()):
        self.count, self.chain, self.partial = count, chain, list(partial)

    def copy(self) -> EvictedDigest:
        return EvictedDigest(self.count, self.chain, self.partial)

    def add(self, token: int) -> None:
        self.partial.append(token)
        self.count += 1
        if len(self.partial) == _BLOCK:
            self.chain, self.partial = _link(self.chain, self.partial), []

    def matches(self, ids: np.ndarray) -> bool:
        """Whether `ids` are exactly the evicted ones."""
        if ids.shape[0] != self.count:
            return False
        full = self.count - len(self.partial)
        chain = b""
        for b in range(0, full, _BLOCK):
            chain = _link(chain, ids[b : b + _BLOCK])
        return chain == self.chain and ids[full:].tolist() == self.partial


def _link(chain: bytes, block: Sequence[int] | np.ndarray) -> bytes:
    return hashlib.blake2b(chain + np.asarray(block, "<i8").tobytes(), digest_size=16).digest()


@dataclass
class Turn:
    """One reply in progress (decoding.Turn, for the decode loops): the first logits, then one token fed per
    step."""

    session: Session
    epoch: int
    logits: np.ndarray

    def context(self) -> list[int]:
        return self.session.recent_ids()

    def sampled(self, token: int) -> None:
        self.session._live(self.epoch)
        self.session._pending = token

    def decode(self, token: int) -> np.ndarray:
        self.session._live(self.epoch)
        return self.session._decode_pending(token)

    def feed(self, ids: Sequence[int]) -> np.ndarray:
        """Feed `ids` = [the pending token, *tokens a constraint forced after it] as one chunk (fast-forward,
        constrain.py); the logits of the last."""
        s = self.session
        s._live(self.epoch)
        if s._pending is None or not ids or ids[0] != s._pending:
            raise SessionError(f"a fast-forward chunk must start with the pending token {s._pending}")
        s._check_engine()
        return s._feed(np.asarray(ids, dtype=np.int64))

    def unsay(self, n: int) -> None:
        """Drop the last n tokens fed but never yielded (a forced run the caller stopped inside), while this
        reply is still the session's latest and the ring's slack allows; otherwise they stay said."""
        s = self.session
        if self.epoch == s._epoch and s._pending is None and n <= s.rollback_limit:
            s.truncate(n)

    def extend(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed the pending token and `tokens` in one graph call; the logits after each, [1 + len(tokens), V].
        Speculative verification (speculative.py): the caller keeps the agreeing prefix and `drop`s the rest."""
        self.session._live(self.epoch)
        s = self.session
        if s._pending is None:
            raise SessionError("extend needs the token sampled last (call sampled() first)")
        return s._feed(np.asarray([s._pending, *tokens], dtype=np.int64), all_logits=True)

    def drop(self, n: int) -> None:
        """Forget the last n tokens fed in this reply (a rejected speculation), keeping the reply alive;
        at most the session's rollback_limit (RollbackError)."""
        self.session._live(self.epoch)
        self.session._drop(n)


class Session:
    """Owns `engine`'s cache from here on (it starts afresh): drive that engine only through the session. A
    session is its cache plus the token ids it holds; another session beside it takes another of the model's
    caches (`engine.on(i)`)."""

    def __init__(self, engine: Engine, *, overflow: Literal["chunk", "refuse"] = "chunk"):
        if overflow not in ("chunk", "refuse"):
            raise EdgeRuntimeError(f"overflow must be 'chunk' or 'refuse', got {overflow!r}")
        self.engine, self.overflow = engine, overflow
        g = self.geometry = engine.geometry
        self._row_ids = np.full(g.capacity, -1, np.int64)  # token id held by each K/V row
        self._pending: int | None = None
        self._evicted = EvictedDigest()
        self._epoch = 0  # bumped by every change a reply in progress must not outlive
        self.last_fed = 0  # tokens the last turn ran through the model
        self.last_cached = 0  # tokens it found in the ring
        self.reset()

    # -- what the session holds --------------------------------------------------------------------

    @property
    def manifest(self) -> Manifest:
        """The engine's (stream_generate reads the EOS ids from it, whichever of the two it is given)."""
        return self.engine.manifest

    @property
    def length(self) -> int:
        """Tokens in the conversation since the last reset, evicted ones included."""
        return self.engine.ring.tokens + (self._pending is not None)

    @property
    def held(self) -> int:
        """Tokens the next one attends: the sinks and the W - 1 most recent (StreamingLLM)."""
        return min(self.length, self.geometry.logical_capacity - 1)

    @property
    def evicted(self) -> int:
        return self.length - self.held

    @property
    def position(self) -> int:
        """Absolute position the next token takes."""
        return self.engine.ring.position_offset + self.length

    @property
    def pending(self) -> int | None:
        return self._pending

    @property
    def rollback_limit(self) -> int:
        """Most tokens `truncate` drops exactly (all of them while the ring has not reused a row;
        after, slack + 1 less what earlier rollbacks used; dropping everything is always a reset). With
        local layers (e.g. Gemma 3) the smaller of both rings' limits: their ring wraps first."""
        return (self._pending is not None) + self.engine.ring.rollback_limit()

    def recent_ids(self) -> list[int]:
        """Ids of the tokens the next one attends, in order (the repetition penalty's history)."""
        g, t = self.geometry, self.engine.ring.tokens
        start = max(g.sinks, t - (g.window - 1))
        ids = self._ids(np.r_[np.arange(min(g.sinks, t)), np.arange(start, t)]).tolist()
        return ids + ([] if self._pending is None else [self._pending])

    # -- turns -------------------------------------------------------------------------------------

    def reset(self) -> None:
        with atomic():
            self.engine.reset()
            self._row_ids[:] = -1
            self._pending = None
            self._evicted = EvictedDigest()
            self._epoch += 1
            self._expect = 0

    def send(
        self,
        ids: Sequence[int],
        sampling: SamplingParams | Sampler | None = None,
        *,
        max_tokens: int | None = None,
        stop_ids: Sequence[int] | None = None,
        logits_processors: Sequence[LogitsProcessor] = (),
        logprobs: int | None = None,
        response_format: Mapping[str, Any] | None = None,
        grammar: Grammar | None = None,
        speculative: SpeculativeDecoder | str | None = None,
    ) -> Iterator[Step]:
        """Append `ids` (may be empty) to the conversation and stream the reply, one Step per token.

        A generator: the turn is fed on the first `next()`. Stops after a stop id (default: the bundle's
        EOS ids; the stop id is part of the conversation) or `max_tokens`; without either it runs until
        the caller stops. Every token yielded stays in the conversation. `response_format` (OpenAI's) or
        `grammar` (constrain.py) constrain the reply; a bad one raises ConstraintError at the call.
        `speculative`: see generate.step_generator.
        """
        if response_format is not None or grammar is not None:
            from . import constrain  # llguidance loads only for structured output

            logits_processors = (*logits_processors, *constrain.processors(self, response_format, grammar))
        sampler = sampling if isinstance(sampling, Sampler) else Sampler(sampling or SamplingParams())
        stops = set(self.manifest.tokenizer.eos_token_ids if stop_ids is None else stop_ids)
        steps = step_generator(
            self, ids, sampler, logits_processors=logits_processors, logprobs=logprobs, speculative=speculative
        )
        return _until(steps, stops, max_tokens)

    def prefill(self, ids: Sequence[int]) -> None:
        """Append `ids` without replying (a system prompt to snapshot, a tool result to read)."""
        if len(ids) or self._pending is not None:
            self.begin(ids)

    def begin(self, ids: Sequence[int]) -> Turn:
        """Feed the pending token and `ids`; the logits of the last one start the reply (decoding.Source)."""
        self._check_engine()
        ring = self.engine.ring
        feed = np.asarray([*([] if self._pending is None else [self._pending]), *ids], dtype=np.int64)
        if feed.size == 0:  # nothing new: re-run the last token for its logits
            if ring.tokens == 0:
                raise SessionError("nothing to reply to: the session is empty and the turn has no tokens")
            if ring.rollback_limit() < 1:
                raise SessionError(
                    "cannot reply without new tokens here: the last token's logits would need a rollback of "
                    "one more token than the slack allows; send at least one token"
                )
            feed = self._ids(np.array([ring.tokens - 1]))
            self.engine.truncate(1)
        self._check_overflow(feed.size)
        self.last_cached, self.last_fed = ring.tokens, int(feed.size)
        self._epoch += 1
        logits = self._feed(feed)
        return Turn(self, self._epoch, logits)

    def _check_overflow(self, n: int) -> None:
        g, t = self.geometry, self.engine.ring.tokens
        unseen = max(0, (t + n - g.window) - max(t, g.sinks))
        if unseen == 0:
            return
        message = (
            f"a turn of {n} tokens exceeds the window of {g.window}: its first {unseen} tokens leave the "
            f"window before the reply starts (StreamingLLM keeps the {g.sinks} sinks and the last {g.window})"
        )
        if self.overflow == "refuse":
            raise RingOverflowError(message + "; split the turn or load a larger --window")
        warnings.warn(message, RingOverflowWarning, stacklevel=4)

    # -- prefix match, rollback ----------------------------------------------------------------------

    def match(self, conversation: Sequence[int]) -> list[int]:
        """Keep the longest prefix of `conversation` the session can reuse; return the ids left to send.

        The rule: a prefix is reused only if it equals, token for token, the stream this session ran:
        the sinks and the tokens still in the ring are compared, the evicted ones through their digest.
        Where the conversation departs from the stream, the session rolls back to that point if the
        slack allows (`rollback_limit`), else it resets and the whole conversation is sent again. So a
        reused prefix gives what a fresh session fed the whole conversation would (StreamingLLM past
        capacity), up to the float noise of other prefill chunk boundaries.
        """
        conv = np.asarray(conversation, dtype=np.int64).reshape(-1)
        p = self._common_prefix(conv)
        drop = self.length - p
        if drop:
            if drop <= self.rollback_limit:
                self.truncate(drop)
            else:
                self.reset()
                p = 0
        return conv[p:].tolist()

    def resume(self, conversation: Sequence[int]) -> list[int]:
        """`match`, then the ids to send for a reply to the whole `conversation` (decoding.Source), so that
        `begin` has something to feed (the reply's first logits are the last token's): where the conversation is
        held whole, its last token is the pending one (fed by `begin`), or it is taken back (past the rollback
        limit: the session resets) to be fed again."""
        rest = self.match(conversation)
        if rest or self._pending is not None:
            return rest
        if self.rollback_limit >= 1:
            self.truncate(1)
        else:
            self.reset()
        return list(conversation[self.length :])

    def _common_prefix(self, conv: np.ndarray) -> int:
        g, ring = self.geometry, self.engine.ring
        t, n = ring.tokens, conv.shape[0]
        sinks = min(g.sinks, t)
        lo = ring.overwritten if ring.written > g.capacity else sinks
        if lo > sinks and (n < lo or not self._evicted.matches(conv[g.sinks : lo])):
            return 0  # departs inside the evicted part (or is shorter): nothing before it can be kept
        idx = np.r_[np.arange(sinks), np.arange(lo, t)]
        held = self._ids(idx)
        if self._pending is not None:
            idx, held = np.r_[idx, t], np.r_[held, self._pending]
        m = int(np.searchsorted(idx, n))  # held tokens the conversation reaches
        diff = np.flatnonzero(conv[idx[:m]] != held[:m])
        if diff.size:
            return int(idx[diff[0]])
        return min(n, self.length)

    def truncate(self, n: int) -> None:
        """Drop the last n tokens of the conversation; the next ones are those of a session that never
        saw them. Up to `rollback_limit` (RollbackError beyond); n = length is a reset."""
        self._check_engine()
        if not 0 <= n <= self.length:
            raise SessionError(f"cannot drop {n} tokens of a conversation of {self.length}")
        if n == self.length:
            self.reset()
            return
        drops_pending = self._pending is not None and n > 0
        with atomic():
            self.engine.truncate(n - drops_pending)  # RollbackError past the limit, before anything changes
            if drops_pending:
                self._pending = None
            self._epoch += 1
            self._expect = self.engine.ring.tokens

    # -- prompt cache --------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The session's state: the K/V rows it holds and the bookkeeping, copied."""
        self._check_engine()
        g, (tokens, written, row_pos) = self.geometry, self.engine.ring.state()
        rows = np.flatnonzero(row_pos >= 0)
        self.engine.backend.kv_to_host()  # a device backend's ring is not the pool's arrays (TensorRT)
        keys, values = self.engine.pool.gather_rows(rows)
        return Snapshot(
            bundle=bundle_checksum(self.manifest),
            geometry=(g.sinks, g.window, g.slack),
            position_offset=self.engine.ring.position_offset,
            tokens=tokens,
            written=written,
            pending=self._pending,
            row_pos=row_pos,
            row_ids=self._row_ids.copy(),
            evicted=(self._evicted.count, self._evicted.chain, tuple(self._evicted.partial)),
            rows=rows,
            keys=keys,
            values=values,
        )

    def restore(self, snap: Snapshot) -> None:
        """Put a snapshot back instead of running its prefill (SnapshotMismatchError: another bundle or
        geometry)."""
        g = self.geometry
        snap.check(bundle_checksum(self.manifest), (g.sinks, g.window, g.slack), self.engine.ring.position_offset)
        self._check_fits(snap)
        with atomic():
            self.engine.backend.kv_to_host()  # rows the snapshot lacks keep the cache's bytes, as on the CPU
            self.engine.pool.scatter_rows(snap.rows, snap.keys, snap.values)
            self.engine.backend.kv_from_host()
            self.engine.restore_state(snap.tokens, snap.written, snap.row_pos)
            self._row_ids[:] = snap.row_ids
            self._pending = snap.pending
            self._evicted = EvictedDigest(*snap.evicted)
            self._epoch += 1
            self._expect = snap.tokens

    def _check_fits(self, snap: Snapshot) -> None:
        """Refuse a snapshot whose arrays or bookkeeping this session's ring cannot hold (a crafted file with a
        valid checksum and this bundle's identity) before anything changes: a half-done restore is no state."""
        ring, pool = self.engine.ring, self.engine.pool

        def bad(why: str) -> CorruptSnapshotError:
            return CorruptSnapshotError(f"snapshot does not fit this session: {why}")

        for name, a, shape in (("row_pos", snap.row_pos, (ring.rows,)), ("row_ids", snap.row_ids, self._row_ids.shape)):
            if a.shape != shape or a.dtype.kind != "i":
                raise bad(f"{name} is {a.dtype}{list(a.shape)}, this ring's {list(shape)} int64")
        if snap.rows.dtype.kind != "i" or not np.array_equal(snap.rows, np.flatnonzero(snap.row_pos >= 0)):
            raise bad("its rows are not the rows holding a token")
        if not snap.tokens <= snap.written or len(snap.evicted[2]) >= _BLOCK or len(snap.evicted[1]) not in (0, 16):
            raise bad(f"tokens {snap.tokens}, written {snap.written} or its evicted digest are inconsistent")
        if snap.pending is not None and snap.pending >= self.manifest.model.vocab_size:
            raise bad(f"pending token {snap.pending} is outside the vocabulary")
        if len(snap.keys) != len(pool.keys) or len(snap.values) != len(pool.values):
            raise bad(f"{len(snap.keys)} layers of keys, this model has {len(pool.keys)}")
        for i, buffers in enumerate(zip(pool.keys, pool.values, snap.keys, snap.values, strict=True)):
            k = buffers[0]
            want = (*k.shape[:2], len(pool._layer_rows(i, snap.rows)), *k.shape[3:])
            for a in buffers[2:]:
                if a.shape != want or a.dtype != k.dtype:
                    raise bad(f"layer {i} holds {a.dtype}{list(a.shape)}, this cache {k.dtype}{list(want)}")

    def save(self, path: str | Path) -> None:
        self.snapshot().save(path)

    def load(self, path: str | Path) -> None:
        """Restore a snapshot file (CorruptSnapshotError, SnapshotMismatchError: nothing changed). The file is
        bounded by what this session's cache can hold: a larger one is refused before its payload is read."""
        ring = self.engine.ring
        bound = self.engine.pool.kv_nbytes() + 8 * (2 * ring.rows + self._row_ids.size)
        self.restore(Snapshot.load(path, max_payload=bound))

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _ids(self, tokens: np.ndarray) -> np.ndarray:
        """Ids of tokens (stream indices) still in their rows."""
        return self._row_ids[self.geometry.slots(tokens)]

    def _feed(self, ids: np.ndarray, *, all_logits: bool = False) -> np.ndarray:
        ring = self.engine.ring
        t0, written0 = ring.tokens, ring.written
        # A Ctrl-C during a long prompt stops it between chunks (engine.prefill polls); the chunks fed by
        # then are recorded, so the session always describes exactly what its ring holds.
        with atomic():
            try:
                return self.engine.prefill(ids, all_logits=all_logits)  # validates the ids before any change
            finally:
                self._record(ids[: ring.tokens - t0], t0, written0)

    def _record(self, ids: np.ndarray, t0: int, written0: int) -> None:
        """Bookkeeping of `ids` fed from token t0 (the ring's high-water mark was written0)."""
        if ids.size == 0:
            return
        g = self.geometry
        self._pending = None
        t1 = t0 + ids.size
        lo, hi = max(g.sinks, written0 - g.ring), max(g.sinks, max(written0, t1) - g.ring)
        if hi > lo:  # tokens whose rows this chunk reused: from the ring, or from this very chunk
            old = self._ids(np.arange(lo, min(hi, t0)))
            for token in (*old.tolist(), *ids[max(lo, t0) - t0 : hi - t0].tolist()):
                self._evicted.add(token)
        new = np.arange(t0, t1)
        keep = (new < g.sinks) | (new >= t1 - g.ring)  # the ids that stay in their rows
        self._row_ids[g.slots(new)[keep]] = ids[keep]
        self._expect = t1

    def _decode_pending(self, token: int) -> np.ndarray:
        """The decode hot path: feed the token sampled last."""
        ring, g = self.engine.ring, self.geometry
        t = ring.tokens
        if ring.tokens != self._expect:
            self._check_engine()
        row = g.slot(t)
        evicts = t >= ring.written and t - g.ring >= g.sinks  # reuses the row of token t - R
        with atomic():  # the step and its bookkeeping: a Ctrl-C lands before or after both
            logits = self.engine.decode(token)
            if evicts:
                self._evicted.add(int(self._row_ids[row]))
            self._row_ids[row] = token
            self._pending = None
            self._expect = t + 1
        return logits

    def _drop(self, n: int) -> None:
        """Rollback inside a reply: the pending token was fed (Turn.extend), so only fed tokens go."""
        self._check_engine()
        with atomic():
            self.engine.truncate(n)
            self._expect = self.engine.ring.tokens

    def _live(self, epoch: int) -> None:
        if epoch != self._epoch:
            raise SessionError("this reply was superseded: the session was sent, truncated, reset or restored since")

    def _check_engine(self) -> None:
        if self.engine.ring.tokens != self._expect:
            raise SessionError(
                f"the engine was driven outside this session (its ring holds {self.engine.ring.tokens} tokens, "
                f"the session {self._expect}); a Session owns its engine: call session.reset()"
            )


def _until(steps: Iterator[Step], stops: set[int], max_tokens: int | None) -> Iterator[Step]:
    try:
        for i, step in enumerate(steps):
            yield step
            if step.token in stops or (max_tokens is not None and i + 1 >= max_tokens):
                return
    finally:
        steps.close()
