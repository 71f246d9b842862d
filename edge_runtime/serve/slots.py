"""Slots: N conversations kept on one engine, each a `Session`, routed to by longest shared prefix.

One engine runs one stream at a time, so N slots are N rings' worth of K/V, of which the active one lives
in the engine's pool and the others in `Snapshot`s (session.py's prompt cache): switching slots copies the
outgoing ring out and the incoming one back (gather/scatter of the rows held, not a re-prefill). A request
goes to the slot whose conversation shares the longest token prefix with its prompt (as llama.cpp's server
routes by prompt similarity), when that prefix is more than the slot would lose of its conversation; otherwise
to an empty or the least recently used slot, so the other conversations keep their caches. `Session.match`
then keeps exactly what it can reuse (rolling back where the prompt departs, resetting where the rollback
would go too deep).

Not thread-safe: the scheduler's one worker thread is the only caller.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from edge_runtime.engine import Engine, MemoryBudgetError
from edge_runtime.pool import StaticPool
from edge_runtime.session import Session
from edge_runtime.snapshot import Snapshot


@dataclass
class Slot:
    index: int
    session: Session
    tokens: list[int] = field(default_factory=list)  # the conversation the session holds, token for token
    saved: Snapshot | None = None  # the ring while another slot has the engine
    last_used: int = 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def memory_needed(engine: Engine, slots: int) -> tuple[int, int]:
    """(bytes for `slots` slots, KV bytes of one ring): weights + the pool + one snapshot per slot (at a switch
    the outgoing ring is copied out before the incoming one's copy is dropped, so all N exist at once)."""
    kv = StaticPool.estimate_kv_bytes(engine.manifest, engine.geometry, engine.local_geometry)
    return engine.weight_bytes + kv + slots * kv, kv


def check_budget(engine: Engine, slots: int, budget: int | None) -> None:
    need, kv = memory_needed(engine, slots)
    if budget is not None and need > budget:
        mib = 2**20
        raise MemoryBudgetError(
            f"{slots} slots need {need / mib:.1f} MiB (weights {engine.weight_bytes / mib:.1f} MiB + pool and "
            f"{slots} ring copies of {kv / mib:.1f} MiB each, capacity {engine.geometry.capacity}) but the target's "
            f"memory budget is {budget / mib:.1f} MiB; use fewer --slots or a smaller --window"
        )


class SlotPool:
    def __init__(self, engine: Engine, n: int):
        if n < 1:
            raise ValueError(f"slots must be >= 1, got {n}")
        # "refuse": a turn longer than the window would lose its start before the reply; a 413, not a warning.
        self.slots = [Slot(i, Session(engine, overflow="refuse")) for i in range(n)]
        self.owner: Slot | None = self.slots[-1]  # the last Session created reset the engine last
        self._clock = itertools.count(1)

    def route(self, prompt: Sequence[int]) -> tuple[Slot, int]:
        """The slot for `prompt` and the shared prefix that chose it (0: an empty or the least recent slot).

        A slot is worth taking when the prompt reuses more of its conversation than it throws away: the
        shared prefix saves that many tokens now, and the slot's tokens past it are lost to whoever comes back
        for them. So conversations that merely share a template's first tokens or a system prompt do not
        evict each other while an empty slot remains, and a resent or edited conversation finds its own.
        """
        scored = [(2 * common_prefix(s.tokens, prompt) - len(s.tokens), -s.last_used, s) for s in self.slots]
        net, _, slot = max(scored, key=lambda p: (p[0], p[1]))
        if net > 0:
            return slot, common_prefix(slot.tokens, prompt)
        return min(self.slots, key=lambda s: (len(s.tokens) > 0, s.last_used)), 0  # an empty one, else the LRU

    def activate(self, slot: Slot) -> None:
        """Give `slot` the engine: the current owner's ring is copied out, `slot`'s copied back in."""
        slot.last_used = next(self._clock)
        if self.owner is slot:
            return
        if self.owner is not None:
            self.owner.saved = self.owner.session.snapshot() if self.owner.tokens else None
        self.owner = None  # until the restore below succeeds, nobody's ring is in the engine
        if slot.saved is not None:
            slot.session.restore(slot.saved)
            slot.saved = None
        else:
            slot.session.reset()
            slot.tokens = []
        self.owner = slot

    def forget(self, slot: Slot) -> None:
        """After a failure mid-turn: the slot starts afresh (its session may be half fed)."""
        slot.tokens = []
        slot.saved = None
        if self.owner is slot:
            slot.session.reset()

    def used(self) -> int:
        return sum(1 for s in self.slots if s.tokens)
