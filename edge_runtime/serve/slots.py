"""Slots: N conversations kept beside one model, each a `Session` on a cache of its own, routed to by the
longest shared prefix.

The model was loaded with N caches (LoadOptions.caches: preallocated, counted against the memory budget at
load), one per slot, so a slot's conversation stays in its own ring while another slot runs: switching slots
copies nothing. A request goes to the slot whose conversation shares the longest token prefix with its prompt
(as llama.cpp's server routes by prompt similarity), when that prefix is more than the slot would lose of its
conversation; otherwise to an empty or the least recently used slot, so the other conversations keep their
caches. `Session.match` then keeps exactly what it can reuse (rolling back where the prompt departs, resetting
where the rollback would go too deep).

With `--parallel` several worker threads run generations at once, each on a slot of its own: `acquire` routes
among the slots no generation holds and marks the one chosen until `release`, under a lock.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from edge_runtime.engine import Engine
from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.session import Session


@dataclass
class Slot:
    index: int
    session: Session
    tokens: list[int] = field(default_factory=list)  # the conversation the session holds, token for token
    last_used: int = 0
    busy: bool = False  # a generation runs on it (acquire .. release)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def memory_needed(engine: Engine) -> int:
    """Bytes the model and all its caches hold (what the load checked against the memory budget)."""
    return engine.weight_bytes + len(engine.model.caches) * engine.model.kv_bytes + engine.model.batch_bytes


class SlotPool:
    def __init__(self, engine: Engine, n: int):
        """`n` slots on `engine`'s model, one per cache (the model must have been loaded with n caches)."""
        if n < 1:
            raise ValueError(f"slots must be >= 1, got {n}")
        have = len(engine.model.caches)
        if have < n:
            raise EdgeRuntimeError(f"{n} slots need {n} KV caches but the model was loaded with {have}")
        # "refuse": a turn longer than the window would lose its start before the reply; a 413, not a warning.
        self.engine = engine
        self.slots = [Slot(i, Session(engine.on(i), overflow="refuse")) for i in range(n)]
        self._clock = itertools.count(1)
        self._lock = threading.Lock()

    def acquire(self, prompt: Sequence[int]) -> tuple[Slot, int]:
        """`route` among the slots no generation holds, the one chosen held until `release` (the scheduler runs
        at most as many generations as there are slots, so one is always free)."""
        with self._lock:
            slot, shared = self.route(prompt, [s for s in self.slots if not s.busy])
            slot.busy = True
            self.activate(slot)
            return slot, shared

    def release(self, slot: Slot) -> None:
        with self._lock:
            slot.busy = False

    def route(self, prompt: Sequence[int], free: Sequence[Slot] | None = None) -> tuple[Slot, int]:
        """The slot for `prompt` among `free` (default: all) and the shared prefix that chose it (0: an empty or the
        least recent slot).

        A slot is worth taking when the prompt reuses more of its conversation than it throws away: the
        shared prefix saves that many tokens now, and the slot's tokens past it are lost to whoever comes back
        for them. So conversations that merely share a template's first tokens or a system prompt do not
        evict each other while an empty slot remains, and a resent or edited conversation finds its own.
        """
        slots = self.slots if free is None else free
        if not slots:
            raise EdgeRuntimeError("every slot is busy")  # a scheduler bug: it runs at most one generation a slot
        scored = [(2 * common_prefix(s.tokens, prompt) - len(s.tokens), -s.last_used, s) for s in slots]
        net, _, slot = max(scored, key=lambda p: (p[0], p[1]))
        if net > 0:
            return slot, common_prefix(slot.tokens, prompt)
        return min(slots, key=lambda s: (len(s.tokens) > 0, s.last_used)), 0  # an empty one, else the LRU

    def activate(self, slot: Slot) -> None:
        """`slot` runs next (its cache is its own: nothing moves); the least recently used goes first on eviction."""
        slot.last_used = next(self._clock)

    def forget(self, slot: Slot) -> None:
        """After a failure mid-turn: the slot starts afresh (its session may be half fed)."""
        slot.tokens = []
        slot.session.reset()

    def used(self) -> int:
        return sum(1 for s in self.slots if s.tokens)
