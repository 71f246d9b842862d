"""Sampling defaults taken from the model, as transformers' `generate` and Ollama take them.

A bundle's manifest keeps the sampling keys of the checkpoint's `generation_config.json` (its `generation`
record). `edge-run` and `edge-serve` start from them; flags and request fields win.

- The record names sampling settings: transformers' reading of them. `do_sample: true` samples at the
  given temperature / top_k / top_p / min_p (transformers' own defaults where one is missing: 1.0, 50, 1.0,
  off); otherwise decoding is greedy, with the record's repetition penalty.
- The record names none (SmolLM2, most GGUFs): Ollama's defaults, temperature 0.8, top-k 40, top-p 0.9,
  repetition penalty 1.1. Not greedy: greedy decoding of a small model loops on open prompts (a phrase
  repeated until the window is full), and a chat that loops is the first thing a new user sees. The
  measurement behind the choice: docs/decisions/sampling-defaults.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .sampling import SamplingParams

FALLBACK = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1)
FALLBACK_SOURCE = "edge-runtime's default: the model names none"
MODEL_SOURCE = "from the model's generation_config.json"
_KEYS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty")
# transformers' GenerationConfig defaults, for keys a do_sample record leaves out
_HF = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}


@dataclass(frozen=True)
class SamplingDefaults:
    params: SamplingParams
    source: str  # MODEL_SOURCE or FALLBACK_SOURCE: what `edge-export inspect` and `--verbose` say

    def resolve(self, **given: Any) -> SamplingParams:
        """These defaults with every value given (not None) in its place: flags and request fields win. Asking
        for greedy decoding (temperature 0) over edge-runtime's fallback gets plain greedy decoding: the
        fallback's repetition penalty belongs to its sampling recipe, not to the model (a model's own
        record keeps its penalty under greedy, as transformers does)."""
        values = {k: v for k, v in given.items() if v is not None}
        base = self.params
        if self.source == FALLBACK_SOURCE and values.get("temperature") == 0:
            base = SamplingParams()
        return replace(base, **values)

    def describe(self) -> str:
        p = self.params
        if p.greedy:
            what = "greedy"
            if p.repetition_penalty != 1.0:
                what += f", repetition penalty {p.repetition_penalty:g}"
        else:
            parts = [f"temperature {p.temperature:g}"]
            parts += [f"top-k {p.top_k}"] if p.top_k else []
            parts += [f"top-p {p.top_p:g}"] if p.top_p < 1 else []
            parts += [f"min-p {p.min_p:g}"] if p.min_p > 0 else []
            parts += [f"repetition penalty {p.repetition_penalty:g}"] if p.repetition_penalty != 1.0 else []
            what = ", ".join(parts)
        return f"{what} ({self.source})"


def model_defaults(generation: Mapping[str, Any] | None) -> SamplingDefaults:
    """The defaults a bundle's `generation` record implies (see the module docstring). Values of the wrong
    type or out of range are ignored, key by key: an edited manifest must not stop a bundle from running."""
    record = {k: v for k, v in (generation or {}).items() if k in _KEYS and _usable(k, v)}
    if not record:
        return SamplingDefaults(FALLBACK, FALLBACK_SOURCE)
    penalty = float(record.get("repetition_penalty", 1.0))
    if not record.get("do_sample", False):
        return SamplingDefaults(SamplingParams(repetition_penalty=penalty), MODEL_SOURCE)
    values = {**_HF, **{k: v for k, v in record.items() if k != "do_sample"}}
    params = SamplingParams(
        temperature=float(values["temperature"]),
        top_k=int(values["top_k"]),
        top_p=float(values["top_p"]),
        min_p=float(values["min_p"] or 0.0),
        repetition_penalty=float(values["repetition_penalty"]),
    )
    return SamplingDefaults(params, MODEL_SOURCE)


def _usable(key: str, value: Any) -> bool:
    if key == "do_sample":
        return isinstance(value, bool)
    if key == "min_p" and value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    if key == "top_k":
        return float(value).is_integer() and value >= 0
    if key == "top_p":
        return 0 < value <= 1
    if key == "min_p":
        return 0 <= value < 1
    if key == "temperature":
        return value == 0 or value >= 1e-6
    return value > 0  # repetition_penalty
