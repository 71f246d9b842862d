"""Refuse garbage model output instead of printing it: NaN/Inf logits, a row of equal logits, an argmax
outside the vocabulary.

A corrupted weight file that slips past the load's sampled check (verified.py) most often shows as
non-finite logits (a flipped exponent bit in a scale block); greedy argmax over them picks the first
NaN, often a special token, and the run "succeeds" with empty text. What is checked, and what it costs:

- prefill: the last row's logits, in full (one pass over V floats per request).
- every decode step: the token chosen must be in the vocabulary and its own logit finite (a scalar
  read). numpy's argmax returns the first NaN and an Inf wins it, so on the host greedy path this
  alone catches any NaN or +Inf in the row; sampling's normaliser (a sum it computes anyway) catches
  the rest there.
- every CHECK_EVERY-th decode step: the whole row, as at prefill. This covers the fused-argmax path,
  whose kernel may skip NaNs, at ~1/CHECK_EVERY of a row read (reading the row was 1% of a 135M
  decode step, so this is ~0.03%).
"""

from __future__ import annotations

import math

import numpy as np

from .errors import CorruptOutputError

CHECK_EVERY = 32

_ADVICE = "the bundle's weights are likely corrupted; check it with `edge-export inspect BUNDLE` or re-export it"


def check_row(logits: np.ndarray, where: str) -> None:
    """Raise CorruptOutputError unless `logits` [V] are all finite and not all equal."""
    hi, lo = logits.max(), logits.min()  # NaN propagates through both; +-Inf shows as itself
    if not (np.isfinite(hi) and np.isfinite(lo)):
        raise CorruptOutputError(f"the model produced non-finite logits (NaN or Inf) at {where}; {_ADVICE}")
    if hi == lo:
        raise CorruptOutputError(f"the model produced logits that are all equal ({float(hi):g}) at {where}; {_ADVICE}")


def check_token(token: int, logit: float, vocab_size: int, where: str) -> None:
    """The chosen token is in [0, vocab_size) and its logit finite."""
    if not 0 <= token < vocab_size:
        raise CorruptOutputError(
            f"the model chose token {token}, outside the vocabulary of {vocab_size}, at {where}; {_ADVICE}"
        )
    if not math.isfinite(logit):
        raise CorruptOutputError(f"the model produced non-finite logits (NaN or Inf) at {where}; {_ADVICE}")
