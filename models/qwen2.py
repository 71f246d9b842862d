"""Qwen2 / Qwen2.5: the Llama block with a bias on q, k and v (not on o, not in the MLP).

Qwen2's optional sliding-window layers (`use_sliding_window: true`) are not supported; every
released Qwen2/2.5 checkpoint has it off.
"""

from __future__ import annotations

from typing import Any

from edge_runtime.errors import ConfigError

from .base import Architecture, ModelArgs, opt_bool, parse_common
from .llama import WEIGHTS


def parse(config: dict[str, Any]) -> ModelArgs:
    if opt_bool(config, "use_sliding_window", False):
        raise ConfigError("config.json: qwen2 'use_sliding_window' = true is not supported; set it to false")
    return parse_common(config, arch="qwen2", qkv_bias=True, o_bias=False, mlp_bias=False)


ARCH = Architecture(name="qwen2", parse=parse, weights=WEIGHTS)
