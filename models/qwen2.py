"""Qwen2 / Qwen2.5: the Llama block with a bias on q, k and v (not on o, not in the MLP).

With `use_sliding_window: true` the layers from `max_window_layers` on (or those `layer_types` lists) attend
a sliding window (`layer_types.py`); every released Qwen2/2.5 checkpoint has it off.
"""

from __future__ import annotations

from typing import Any

from .base import Architecture, ModelArgs, parse_common
from .gguf_layout import GGUFLayout, GGUFMeta
from .layer_types import qwen_layer_types
from .llama import WEIGHTS


def parse(config: dict[str, Any]) -> ModelArgs:
    return qwen_layer_types(parse_common(config, arch="qwen2", qkv_bias=True, o_bias=False, mlp_bias=False), config)


def gguf_config(_meta: GGUFMeta, config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "use_sliding_window": False}


# llama.cpp's plain TextModel path (NeoX rope): the Q/K rows are stored as Hugging Face has them.
ARCH = Architecture(
    name="qwen2", parse=parse, weights=WEIGHTS, gguf=GGUFLayout("qwen2", "Qwen2ForCausalLM", False, config=gguf_config)
)
