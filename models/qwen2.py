"""Qwen2 / Qwen2.5: the Llama block with a bias on q, k and v (not on o, not in the MLP).

With `use_sliding_window: true` the layers from `max_window_layers` on (or those `layer_types` lists) attend
a sliding window (`layer_types.py`); every released Qwen2/2.5 checkpoint has it off.
"""

from __future__ import annotations

from typing import Any

from .base import Architecture, ModelArgs, parse_common
from .layer_types import qwen_layer_types
from .llama import WEIGHTS


def parse(config: dict[str, Any]) -> ModelArgs:
    return qwen_layer_types(parse_common(config, arch="qwen2", qkv_bias=True, o_bias=False, mlp_bias=False), config)


ARCH = Architecture(name="qwen2", parse=parse, weights=WEIGHTS)
