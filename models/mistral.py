"""Mistral and Ministral: the Llama block, whose layers each attend a sliding window or the whole context.

Mistral 7B v0.1 slides every layer over `sliding_window` tokens (later Mistral checkpoints set null; a
config.json without the key slides over 4096, MistralConfig's default).
Ministral 8B interleaves sliding-window and full-attention layers (`layer_types`; `transformers` reads a
`mistral` config that lists them as `ministral`, and so do we), all with one RoPE: `layer_types.py` makes
its sliding layers the runtime's local layers.
"""

from __future__ import annotations

from typing import Any

from .base import Architecture, ModelArgs, parse_common
from .layer_types import sliding_window, with_layer_types
from .llama import WEIGHTS


def parse(config: dict[str, Any]) -> ModelArgs:
    # No biases: MistralAttention's and MinistralAttention's projections have none, whatever the config says.
    args = parse_common(config, arch="mistral")
    return with_layer_types(args, config.get("layer_types"), sliding_window(config))


ARCH = Architecture(name="mistral", parse=parse, weights=WEIGHTS)
