"""KVCache: one conversation's state beside a loaded model.

A model (engine.Model: graph, weights, backend, geometry) holds no stream; each cache holds one:
its K/V rows and step buffers (a StaticPool), the ring's bookkeeping (RingState: tokens fed, rows written,
each row's position) and the backend's binding over those buffers. The model runs a step *on* a cache
(`model.prefill(cache, ids)`, `model.decode(cache, token)`); several caches live beside one model (edge-serve's
slots, a conversation and an exactness probe), all preallocated at load, so the pool stays static.

A cache knows nothing of token ids: the session above it keeps those (session.py); snapshots copy a cache's
rows and bookkeeping (Session.snapshot).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .interrupts import atomic
from .pool import StaticPool
from .ring import RingState

if TYPE_CHECKING:
    import numpy as np

    from .backends import Backend


class KVCache:
    def __init__(self, pool: StaticPool, ring: RingState, backend: Backend, index: int = 0):
        """`index`: this cache's place among its model's (`Model.caches`), its row_cache in a batched step."""
        self.pool, self.ring, self.backend, self.index = pool, ring, backend, index
        # Whether the pool's incremental decode inputs (mask, sink angles) are in step with the ring: a prefill
        # or a rollback moves the ring without them, and the next decode step rebuilds them once.
        self.decoding = False
        self.decode_steps = 0  # counts to the next whole-row output check (logits_check.CHECK_EVERY)

    @property
    def tokens(self) -> int:
        return self.ring.tokens

    def reset(self) -> None:
        """Start a new stream (the buffers stay; every row is masked until rewritten)."""
        with atomic():
            self.decoding = False
            self.ring.reset()

    def truncate(self, n: int) -> None:
        """Drop the last n tokens fed (at most `ring.rollback_limit()`, else RollbackError); the stream
        continues as if they had never been fed."""
        with atomic():  # the global and the local ring move together
            self.decoding = False  # the incremental decode mask still shows the dropped rows
            self.ring.truncate(n)

    def restore_state(self, tokens: int, written: int, row_pos: np.ndarray) -> None:
        """Set the ring's bookkeeping (after the caller put the matching K/V rows back into the pool)."""
        with atomic():
            self.decoding = False
            self.ring.set_state(tokens, written, row_pos)
