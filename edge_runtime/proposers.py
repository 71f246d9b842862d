"""Where speculative decoding's proposals come from (speculative.py verifies them).

- `PromptLookup`: n-gram prompt lookup. The last n tokens of the stream (n = 4 down to 1) are looked up
  among the earlier tokens of the conversation (the ones the target's ring attends, plus the reply), and
  the tokens that followed their latest occurrence are proposed. Free: no model runs. Wins where the
  output re-emits its context (a JSON document being edited, a plan being refined, quoted text).
- `DraftModel`: a second, smaller bundle with the same tokenizer (the target pruned and INT4, say) running
  its own ring in step with the target's: it decodes k tokens, the target verifies them in one call.

A proposer sees the stream through `start` (the tokens the target holds when a reply begins) and
`advance` (what the target emitted since); `propose(budget)` asks the decoder how many tokens an *arm*
(an n-gram size, the draft) may propose right now (0: that arm is switched off) and returns them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .engine import Engine
from .errors import DraftMismatchError
from .manifest import Manifest
from .sampling import Sampler, SamplingParams

Budget = Callable[[Hashable], int]  # arm -> tokens it may propose now (0: none)


@dataclass
class Proposal:
    tokens: list[int]
    arm: Hashable = None  # which source proposed them (acceptance is tracked per arm)
    q: list[np.ndarray] | None = None  # the draft's distribution of each token when it sampled them; None: chosen
    # Seconds of the proposing spent catching a draft up on tokens it missed (the prompt, a pause): a cost
    # of having paused, not of this step, so the decoder leaves it out of the step's measured gain.
    catch_up_s: float = 0.0


NONE = Proposal([])


class Proposer(Protocol):
    def start(self, target: Engine, context: Sequence[int], sampling: SamplingParams) -> None:
        """A reply begins: the target holds `context` (its ring's tokens); its first token comes next."""

    def advance(self, emitted: Sequence[int], accepted: int) -> None:
        """The target emitted `emitted` (the first `accepted` of them proposed by the last `propose`)."""

    def propose(self, budget: Budget) -> Proposal:
        """The tokens likely to follow the stream so far (at most `budget(arm)` of them)."""


class PromptLookup:
    """N-gram prompt lookup over the conversation's tokens, in O(1) per token (an index of every n-gram's
    latest continuation, rebuilt when the history doubles past `history`)."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, history: int = 8192):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.sizes = range(max_ngram, min_ngram - 1, -1)  # the longest match first: it predicts best
        self.history = history
        self._ids: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], int]] = {}

    def start(self, target: Engine, context: Sequence[int], sampling: SamplingParams) -> None:
        self._rebuild(list(context))

    def advance(self, emitted: Sequence[int], accepted: int) -> None:
        for token in emitted:
            self._push(int(token))
        if len(self._ids) > 2 * self.history:
            self._rebuild(self._ids[-self.history :])

    def propose(self, budget: Budget) -> Proposal:
        ids = self._ids
        for n in self.sizes:
            if len(ids) <= n:
                continue
            at = self._index[n].get(tuple(ids[-n:]))
            if at is None:
                continue
            k = budget(n)
            if k > 0:
                return Proposal(ids[at : at + k], arm=n)
        return NONE

    def _rebuild(self, ids: list[int]) -> None:
        self._ids, self._index = [], {n: {} for n in self.sizes}
        for token in ids:
            self._push(token)

    def _push(self, token: int) -> None:
        # Index the n-grams ending just before this token: their continuation (this token) is now known.
        ids, p = self._ids, len(self._ids)
        for n in self.sizes:
            if p >= n:
                self._index[n][tuple(ids[p - n : p])] = p
        ids.append(token)


def check_draft(target: Manifest, draft: Manifest, draft_name: str = "the draft") -> None:
    """A draft must share the target's token ids: the same tokenizer.json (by checksum) and vocabulary size."""
    t, d = target.model.vocab_size, draft.model.vocab_size
    if t != d:
        raise DraftMismatchError(
            f"{draft_name} has a vocabulary of {d} tokens, the target {t}; use a draft of the same model family"
        )
    tf, df = target.files.get(target.tokenizer.file), draft.files.get(draft.tokenizer.file)
    if tf is None or tf != df:
        raise DraftMismatchError(
            f"{draft_name}'s tokenizer differs from the target's (tokenizer.json sha256 {str(df)[:12]} vs "
            f"{str(tf)[:12]}); a draft must use the same tokenizer"
        )


class DraftModel:
    """Proposals from a draft bundle's own engine, kept in step with the target's stream.

    The draft is fed lazily: the target's tokens it has not seen wait in `_unfed` and go in as one chunk
    when it next drafts, so the steps the decoder runs without speculation cost the draft nothing."""

    ARM = "draft"

    def __init__(self, engine: Engine):
        self.engine = engine
        self._unfed: list[int] = []
        self._drafted = 0  # tokens of the last proposal fed to the draft (all but its last)
        self._sampler: Sampler | None = None

    def start(self, target: Engine, context: Sequence[int], sampling: SamplingParams) -> None:
        check_draft(target.manifest, self.engine.manifest, f"draft bundle '{self.engine.bundle.path}'")
        # The draft's own distribution q: the target's temperature and cuts, no repetition penalty (any
        # q keeps rejection sampling exact; this one is close to the target's). Its own random stream.
        seed = None if sampling.seed is None else sampling.seed + 1
        cuts = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, seed=seed)
        self._sampler = Sampler(cuts)
        self.engine.reset()
        self._unfed, self._drafted = list(context), 0

    def advance(self, emitted: Sequence[int], accepted: int) -> None:
        if self._drafted:  # the draft fed d1..d(k-1) of its proposal: keep the accepted ones
            keep = min(accepted, self._drafted)
            self.engine.truncate(self._drafted - keep)
            emitted = emitted[keep:]
            self._drafted = 0
        self._unfed.extend(int(t) for t in emitted)

    def propose(self, budget: Budget) -> Proposal:
        k = budget(self.ARM)
        if k <= 0 or not self._unfed:
            return NONE
        assert self._sampler is not None
        e, sampler = self.engine, self._sampler
        t0 = time.perf_counter()
        logits = e.decode(self._unfed[0]) if len(self._unfed) == 1 else e.prefill(self._unfed)
        # In step, the draft has 1-2 new tokens (the last accepted ones and the target's own); more is a
        # catch-up after the prompt or a pause.
        catch_up = time.perf_counter() - t0 if len(self._unfed) > 2 else 0.0
        self._unfed = []
        tokens: list[int] = []
        q: list[np.ndarray] | None = None if sampler.params.greedy else []
        for j in range(k):
            if q is None:
                tokens.append(int(np.argmax(logits)))
            else:
                probs = sampler.probabilities(logits)
                q.append(probs)
                tokens.append(sampler.draw(probs))
            if j < k - 1:
                logits = e.decode(tokens[-1])
        self._drafted = k - 1
        return Proposal(tokens, arm=self.ARM, q=q, catch_up_s=catch_up)
