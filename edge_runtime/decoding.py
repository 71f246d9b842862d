"""What both decode loops share: the state they advance, and how a token is chosen from a logits row.

generate.py's `generate_step` and speculative.py's `speculative_generate_step` are siblings with one contract;
neither imports the other. What they share lives here, below both:

- `Source` / `Turn`: the state a loop advances, taken as a value. `source.begin(ids)` feeds a reply's prompt and
  returns its `Turn`, which feeds the reply's tokens one at a time (or as a chunk: forced tokens, a proposal to
  verify) and can take fed tokens back. `Engine.begin` starts a fresh stream; `Session.begin` continues a
  conversation (session.py). The loops never ask which one they were given.
- `Selector`: the token choice of one reply: logits processors, then the sampler with the repetition penalty's
  history (bounded, like the cache), and logprobs when asked for; `fused_argmax` says when greedy decoding may
  take the graph's own argmax instead of reading the logits back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .sampling import LogitsProcessor, Sampler, Step, token_logprobs

if TYPE_CHECKING:
    from .engine import Engine


class Turn(Protocol):
    """One reply in progress. `logits`: the prompt's last row, from which the reply's first token is chosen."""

    logits: np.ndarray

    def context(self) -> Sequence[int]:
        """The tokens the reply's first token attends (the penalty's history; a proposer's starting point)."""
        ...

    def sampled(self, token: int) -> None:
        """`token` was chosen and handed to the caller: it is said, though not fed yet."""

    def decode(self, token: int) -> np.ndarray:
        """Feed the token chosen last; its logits row."""
        ...

    def feed(self, ids: Sequence[int]) -> np.ndarray:
        """Feed [the token chosen last, *tokens a constraint forced after it] as one chunk; the last row."""
        ...

    def extend(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed the token chosen last and `tokens` in one call; the row after each, [1 + len(tokens), V]."""
        ...

    def drop(self, n: int) -> None:
        """Take back the last n tokens fed (a rejected proposal); the reply goes on."""

    def unsay(self, n: int) -> None:
        """The caller stopped with the last n tokens fed but never handed out: take them back where possible."""


class Source(Protocol):
    """What a decode loop is given: the engine it runs on (its geometry, fused argmax, exact rows: read before
    anything is fed) and a way to begin a reply. An Engine is its own engine."""

    @property
    def engine(self) -> Engine: ...

    def begin(self, ids: Sequence[int]) -> Turn:
        """Feed a reply's prompt `ids`; the reply, its first logits row ready."""
        ...

    def resume(self, conversation: Sequence[int]) -> list[int]:
        """Of a whole conversation (rendered messages), the ids `begin` must still feed: all of them for a fresh
        stream; for a session, what its cache does not already hold (Session.resume)."""
        ...


class Selector:
    """Token choice for one reply: processors and the penalty history see the reply's tokens before each row.

    `took(token)` records a token the caller was handed. `ahead` (speculation) are tokens accepted in the
    step being verified, not handed out yet: each later row is chosen as if they had been."""

    def __init__(
        self,
        sampler: Sampler,
        processors: Sequence[LogitsProcessor],
        context: Sequence[int],
        capacity: int,
        logprobs: int | None,
        unpenalized: frozenset[int] = frozenset(),
    ):
        self.sampler, self.processors, self.logprobs = sampler, tuple(processors), logprobs
        # Repetition penalty looks at the tokens the cache can still hold: bounded, like the cache. The end
        # of turn is not a repetition: a chat template writes it after every message, and penalizing it made
        # sampled replies of a small model run past their end (5 of 18 at 512 tokens against 2 without).
        self.unpenalized = unpenalized
        self.history: deque[int] | None = None
        if sampler.params.repetition_penalty != 1.0:
            self.history = deque((t for t in context if t not in unpenalized), maxlen=capacity)
        self.reply: list[int] = []  # what processors see; only kept when there are some
        # Whether `took` has anything to record: the plain greedy loop then skips the call per token.
        self.tracks = self.history is not None or bool(self.processors)

    def fused_argmax(self, engine: Engine) -> bool:
        """Whether each decode step's token may be the graph's own argmax: greedy, nothing reshaping the
        logits, no logprobs. Reading the logits back, just written by the other core, was 1% of a 135M
        decode step."""
        return (
            engine.fused_argmax
            and self.sampler.params.greedy
            and self.history is None
            and not self.processors
            and self.logprobs is None
        )

    def took(self, token: int) -> None:
        if self.history is not None and token not in self.unpenalized:
            self.history.append(token)
        if self.processors:
            self.reply.append(token)

    def select(self, logits: np.ndarray, ahead: Sequence[Step] = ()) -> Step:
        logits, history = self._row(logits, ahead)
        return self._step(logits, self.sampler(logits, history))

    def judge(self, logits: np.ndarray, proposed: int, q: np.ndarray, ahead: Sequence[Step]) -> tuple[bool, Step]:
        """The rejection rule for a sampled proposal: (True, its Step), or (False, the residual's token)."""
        logits, history = self._row(logits, ahead)
        p = self.sampler.probabilities(logits, history)
        accepted, token = rejection_sample(p, q, proposed, self.sampler)
        return accepted, self._step(logits, token)

    def _row(self, logits: np.ndarray, ahead: Sequence[Step]) -> tuple[np.ndarray, Sequence[int]]:
        """The row as the sampler sees it, and the penalty history, with `ahead` counted."""
        extra = [s.token for s in ahead] if ahead else ()
        if self.processors:
            logits = np.array(logits, dtype=np.float32)  # a copy: the pool's logits are bound to the graph
            reply = self.reply + extra if extra else self.reply
            for process in self.processors:
                logits = process(reply, logits)
        history: Sequence[int] = ()
        if self.history is not None:
            if extra:
                kept = [t for t in extra if t not in self.unpenalized]
                history = [*self.history, *kept][-self.history.maxlen :]  # type: ignore[index]
            else:
                history = self.history
        return logits, history

    def _step(self, logits: np.ndarray, token: int) -> Step:
        return Step(token) if self.logprobs is None else Step(token, *token_logprobs(logits, token, self.logprobs))


def rejection_sample(p: np.ndarray, q: np.ndarray, proposed: int, sampler: Sampler) -> tuple[bool, int]:
    """Keep `proposed` (drawn from q) with probability min(1, p/q) at it, else draw from norm(max(p - q, 0)):
    the token is then distributed exactly as p."""
    if sampler.rng.random() * q[proposed] < p[proposed]:
        return True, proposed
    residual = np.maximum(p - q, 0.0)
    if not residual.sum() > 0:  # p == q up to rounding: any rejection was rounding; p is the residual
        residual = p
    return False, sampler.draw(residual)
