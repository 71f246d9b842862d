"""Token selection: greedy, or temperature / top-k / top-p / min-p sampling with a repetition penalty.

All numpy on one logits row; a seeded `numpy.random.Generator` makes sampling reproducible.
Order (as in transformers): repetition penalty -> temperature -> top-k -> top-p -> min-p -> sample.
Logits processors (`LogitsProcessor`) run before all of that, in generate.py's loop.

A sampling step allocates nothing vocabulary-sized: the Sampler keeps float64 work rows (allocated at
its first step, 26 bytes per vocabulary entry: 3.3 MB at 128k) and every operation writes into them,
so a long stream does not churn ~6 MB of temporaries per token at a 150k vocabulary. The arithmetic is
the same operations in the same order as the straightforward version (np.where, argsort, rng.choice),
so a seed gives the same tokens (tests/test_sampling_buffers.py checks that on fixed logits).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .errors import CorruptOutputError, EdgeRuntimeError

# Below this, temperature sampling is greedy in effect (float32 logits resolve ~1e-6 apart near 10),
# and far below it logits / temperature overflows float64 into NaN probabilities.
MIN_TEMPERATURE = 1e-6

# (tokens generated so far in this reply, logits [V]) -> logits [V]: the hook of constrained decoding.
# It gets a float32 copy it may modify and return; it must not keep or modify the token list.
LogitsProcessor = Callable[[Sequence[int], np.ndarray], np.ndarray]


class Step(NamedTuple):
    """One generated token; with logprobs asked for, its log-probability and the top alternatives.

    Log-probabilities are log_softmax of the logits the sampler saw: after the logits processors,
    before repetition penalty, temperature and the top-k/p/min-p cuts (the model's distribution as
    constrained, as in the OpenAI `logprobs` fields)."""

    token: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


def token_logprobs(logits: np.ndarray, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """log_softmax(logits)[token] and the `top` most likely (token, logprob) pairs (ties: lower id first)."""
    z = logits.astype(np.float64)
    z -= z.max()
    logp = z - np.log(np.exp(z).sum())
    top = min(top, logp.size)
    if top <= 0:
        return float(logp[token]), ()
    best = np.argpartition(-logp, top - 1)[:top]
    best = best[np.lexsort((best, -logp[best]))]
    return float(logp[token]), tuple((int(i), float(logp[i])) for i in best)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off
    seed: int | None = None

    def __post_init__(self) -> None:
        seed_ok = self.seed is None or (isinstance(self.seed, (int, np.integer)) and not isinstance(self.seed, bool))
        checks = [
            (
                self.temperature == 0 or (math.isfinite(self.temperature) and self.temperature >= MIN_TEMPERATURE),
                f"temperature must be 0 (greedy) or a finite value >= {MIN_TEMPERATURE:g} (smaller ones are greedy "
                f"in effect; use 0), got {self.temperature}",
            ),
            (self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p < 1, f"min_p must be in [0, 1), got {self.min_p}"),
            (
                math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0,
                f"repetition_penalty must be a finite value > 0, got {self.repetition_penalty}",
            ),
            (seed_ok and (self.seed is None or self.seed >= 0), f"seed must be an integer >= 0, got {self.seed}"),
        ]
        for ok, message in checks:
            if not ok:
                raise EdgeRuntimeError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class LogitBias:
    """OpenAI's `logit_bias` as a logits processor: each listed token's logit moved by its bias (-100..100).

    Additive, as OpenAI describes it: -100 makes a token practically never chosen and +100 practically always,
    but a constraint that allows only biased-away tokens still gets one (a ban is not a mask)."""

    LIMIT = 100.0

    def __init__(self, bias: Mapping[int, float]):
        for token, value in bias.items():
            if not (isinstance(token, (int, np.integer)) and token >= 0):
                raise EdgeRuntimeError(f"logit_bias keys must be token ids >= 0, got {token!r}")
            if not (math.isfinite(value) and -self.LIMIT <= value <= self.LIMIT):
                raise EdgeRuntimeError(f"logit_bias values must be in [-100, 100], got {value} for token {token}")
        self.ids = np.fromiter(bias.keys(), np.int64, len(bias))
        self.values = np.fromiter(bias.values(), np.float32, len(bias))
        self._top = int(self.ids.max()) if bias else -1  # checked against each row's size without a pass per token

    def __call__(self, reply: Sequence[int], logits: np.ndarray) -> np.ndarray:
        if self._top >= logits.size:
            raise EdgeRuntimeError(f"logit_bias names token {self._top}; the vocabulary has {logits.size}")
        logits[self.ids] += self.values
        return logits


class _Rows:
    """A Sampler's work rows for one vocabulary size."""

    def __init__(self, n: int):
        self.probs = np.empty(n, np.float64)  # penalized logits -> logits / T -> probabilities
        self.work = np.empty(n, np.float64)  # partition / sort scratch (and its int64 view)
        self.cdf = np.empty(n, np.float64)
        self.mask = np.empty(n, bool)
        self.mask2 = np.empty(n, bool)


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self._rows: _Rows | None = None

    def _rows_for(self, n: int) -> _Rows:
        if self._rows is None or self._rows.probs.size != n:
            self._rows = _Rows(n)
        return self._rows

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        if self.params.greedy:
            return self._argmax(logits, history)
        return self.draw(self._distribution(logits, history), normalised=True)

    def probabilities(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The distribution a call samples from, as a new float64 array (speculative decoding's rejection
        rule compares the target's and the draft's); greedy: one-hot at the argmax."""
        if self.params.greedy:
            probs = np.zeros(logits.size, np.float64)
            probs[self._argmax(logits, history)] = 1.0
            return probs
        return self._distribution(logits, history).copy()

    def draw(self, probs: np.ndarray, *, normalised: bool = False) -> int:
        """One token from `probs` (non-negative, summing to more than 0) with this sampler's random stream."""
        rows = self._rows_for(probs.size)
        if not normalised:
            total = float(probs.sum())
            if not (math.isfinite(total) and total > 0):
                raise CorruptOutputError(_NON_FINITE)
        # Generator.choice(n, p=probs), without its vocabulary-sized validation temporaries.
        np.cumsum(probs, out=rows.cdf)
        rows.cdf /= rows.cdf[-1]
        return int(rows.cdf.searchsorted(self.rng.random(), side="right"))

    def _penalized(self, logits: np.ndarray, history: Sequence[int]) -> tuple[np.ndarray, _Rows | None]:
        p = self.params
        if p.repetition_penalty != 1.0 and len(history):
            rows = self._rows_for(logits.size)
            np.copyto(rows.probs, logits)  # float64: the caller's logits may be a pool view
            seen = np.unique(np.asarray(history))  # history-sized (bounded by the cache), not vocabulary-sized
            vals = rows.probs[seen]
            rows.probs[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            return rows.probs, rows
        return logits, None

    def _argmax(self, logits: np.ndarray, history: Sequence[int]) -> int:
        src, _ = self._penalized(logits, history)
        token = int(np.argmax(src))
        if not math.isfinite(src[token]):  # argmax returns the first NaN, and an Inf wins it
            raise CorruptOutputError(_NON_FINITE)
        return token

    def _distribution(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """The sampling distribution, in the work row `probs` (valid until the next call)."""
        p = self.params
        src, rows = self._penalized(logits, history)
        rows = rows or self._rows_for(logits.size)
        z = rows.probs
        if src is not z:
            np.copyto(z, src)
        np.divide(z, p.temperature, out=z)
        if p.top_k and p.top_k < z.size:
            np.copyto(rows.work, z)
            rows.work.partition(z.size - p.top_k)
            np.less(z, rows.work[z.size - p.top_k], out=rows.mask)
            np.copyto(z, -np.inf, where=rows.mask)
        top = z.max()
        if not math.isfinite(top):  # a NaN or +Inf logit: no distribution to sample
            raise CorruptOutputError(_NON_FINITE)
        probs = z
        np.subtract(z, top, out=probs)
        np.exp(probs, out=probs)
        probs /= probs.sum()
        if p.top_p < 1.0:
            self._top_p(rows, p.top_p)
        if p.min_p > 0:
            np.less(probs, p.min_p * probs.max(), out=rows.mask)
            np.copyto(probs, 0.0, where=rows.mask)
        probs /= probs.sum()
        return probs

    @staticmethod
    def _top_p(rows: _Rows, top_p: float) -> None:
        """Zero all but the smallest set of most likely tokens whose mass reaches `top_p`, ties broken
        by lower id first (what a stable argsort of -probs keeps)."""
        probs, n = rows.probs, rows.probs.size
        np.copyto(rows.work, probs)
        rows.work.sort()
        np.cumsum(rows.work[::-1], out=rows.cdf)  # the descending masses, summed in the same order
        cut = min(int(np.searchsorted(rows.cdf, top_p)) + 1, n)
        threshold = rows.work[n - cut]  # the cut-th largest probability
        keep, ties = rows.mask, rows.mask2
        np.greater(probs, threshold, out=keep)
        need = cut - int(np.count_nonzero(keep))  # >= 1 tokens of probability == threshold
        np.equal(probs, threshold, out=ties)
        if int(np.count_nonzero(ties)) > need:  # keep only the first `need` ties, in id order
            rank = rows.work.view(np.int64)  # the sorted values are no longer needed
            np.cumsum(ties, out=rank)
            first = rows.cdf.view(bool)[:n]  # nor the masses
            np.less_equal(rank, need, out=first)
            np.logical_and(ties, first, out=ties)
        np.logical_or(keep, ties, out=keep)
        np.logical_not(keep, out=ties)
        np.copyto(probs, 0.0, where=ties)


_NON_FINITE = (
    "the model produced non-finite logits (NaN or Inf) while sampling; the bundle's weights are likely "
    "corrupted; check it with `edge-export inspect BUNDLE` or re-export it"
)
