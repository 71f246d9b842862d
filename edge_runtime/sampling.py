"""Token selection: greedy, or temperature / top-k / top-p / min-p sampling with a repetition penalty.

All numpy on one logits row; a seeded `numpy.random.Generator` makes sampling reproducible.
Order (as in transformers): repetition penalty -> temperature -> top-k -> top-p -> min-p -> sample.
Logits processors (`LogitsProcessor`) run before all of that, in generate.py's loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .errors import EdgeRuntimeError

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
        checks = [
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p < 1, f"min_p must be in [0, 1), got {self.min_p}"),
            (self.repetition_penalty > 0, f"repetition_penalty must be > 0, got {self.repetition_penalty}"),
        ]
        for ok, message in checks:
            if not ok:
                raise EdgeRuntimeError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        p = self.params
        if p.repetition_penalty != 1.0 and len(history):
            logits = logits.astype(np.float64)  # a copy: the caller's logits may be a pool view
            seen = np.unique(np.asarray(history))
            vals = logits[seen]
            logits[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if p.greedy:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / p.temperature
        if p.top_k and p.top_k < z.size:
            kth = np.partition(z, -p.top_k)[-p.top_k]
            z = np.where(z < kth, -np.inf, z)
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            cut = int(np.searchsorted(cum, p.top_p)) + 1  # smallest set whose mass reaches top_p
            keep = np.zeros_like(probs, dtype=bool)
            keep[order[:cut]] = True
            probs = np.where(keep, probs, 0.0)
        if p.min_p > 0:
            probs = np.where(probs >= p.min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
        return int(self.rng.choice(probs.size, p=probs))
