"""Qwen3 (dense: 0.6B-32B): the Llama block with an RMSNorm over each head's q and k before RoPE.

`attention_bias` puts a bias on q, k, v and o (every released checkpoint has it off). As in Qwen2,
`use_sliding_window: true` makes the layers from `max_window_layers` on slide (`layer_types.py`); no
released dense Qwen3 checkpoint turns it on.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .base import Architecture, ModelArgs, opt_bool, parse_common
from .gguf_layout import GGUFLayout, GGUFMeta
from .layer_types import qwen_layer_types
from .llama import WEIGHTS as LLAMA_WEIGHTS

WEIGHTS = replace(
    LLAMA_WEIGHTS,
    layer={
        **LLAMA_WEIGHTS.layer,
        "q_norm": "model.layers.{i}.self_attn.q_norm.weight",
        "k_norm": "model.layers.{i}.self_attn.k_norm.weight",
    },
)

# Qwen3Config's class default: a config.json without `head_dim` gets 128, not hidden_size / heads.
DEFAULT_HEAD_DIM = 128


def parse(config: dict[str, Any]) -> ModelArgs:
    if config.get("head_dim") is None:
        config = {**config, "head_dim": DEFAULT_HEAD_DIM}
    bias = opt_bool(config, "attention_bias", False)
    args = parse_common(config, arch="qwen3", qkv_bias=bias, o_bias=bias, mlp_bias=False, qk_norm=True)
    return qwen_layer_types(args, config)


def gguf_config(meta: GGUFMeta, config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "use_sliding_window": False, "attention_bias": meta.has_tensor("blk.0.attn_q.bias")}


ARCH = Architecture(
    name="qwen3", parse=parse, weights=WEIGHTS, gguf=GGUFLayout("qwen3", "Qwen3ForCausalLM", False, config=gguf_config)
)
