"""Gemma 3 text decoders (`gemma3_text`: 270M, 1B; the text tower of the larger ones).

Differences from the Llama block, each a field of `ModelArgs` the generic blocks read:
- RMSNorm scales by (1 + w): the weights are rewritten to w' = 1 + w at load (`_adapt`), so every norm
  stays the plain one; a norm on the attention and on the MLP output before each residual add
  (`sandwich_norms`), and a per-head q/k norm (`qk_norm`, as Qwen3);
- a GELU-tanh gated MLP (GeGLU), embeddings multiplied by sqrt(hidden), softmax scale
  `query_pre_attn_scalar ** -0.5`;
- local layers (`layer_types` "sliding_attention", by default five of every six) attend their last
  `sliding_window` tokens with their own RoPE base (`rope_local_base_freq`); the others are global.
Logit soft-capping (Gemma 2) is refused: no Gemma 3 checkpoint sets it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from edge_runtime.errors import ConfigError

from .base import (
    Activation,
    Architecture,
    ModelArgs,
    ModelWeights,
    RopeConfig,
    opt_bool,
    opt_float,
    opt_int,
    parse_common,
    parse_rope,
)
from .qwen3 import WEIGHTS as QWEN3_WEIGHTS

DEFAULT_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}  # Gemma3TextConfig's
DEFAULT_PATTERN = 6  # every sixth layer global, when config.json lists no layer_types


def _adapt(w: ModelWeights) -> ModelWeights:
    def plus_one(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a, dtype=np.float32) + np.float32(1.0)

    norms = ("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm", "q_norm", "k_norm")
    layers = [replace(lw, **{f: plus_one(getattr(lw, f)) for f in norms}) for lw in w.layers]
    return replace(w, final_norm=plus_one(w.final_norm), layers=layers)


# Llama's names (Qwen3's q/k norms included); the norm after attention is Gemma's post-attention norm, and
# the MLP's input norm is pre_feedforward_layernorm.
WEIGHTS = replace(
    QWEN3_WEIGHTS,
    layer={
        **QWEN3_WEIGHTS.layer,
        "post_attn_norm": "model.layers.{i}.post_attention_layernorm.weight",
        "mlp_norm": "model.layers.{i}.pre_feedforward_layernorm.weight",
        "post_mlp_norm": "model.layers.{i}.post_feedforward_layernorm.weight",
    },
    adapt=_adapt,
)


def _ropes(cfg: dict[str, Any]) -> tuple[RopeConfig, RopeConfig]:
    """(global, local) RoPE from either vintage: transformers >= 5 nests `rope_parameters` by layer type;
    older configs have `rope_theta` (+ `rope_scaling`, global only) and `rope_local_base_freq`."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        by_type = {t: {"rope_theta": DEFAULT_THETA[t], **(params.get(t) or {})} for t in DEFAULT_THETA}
    else:
        full = dict(cfg.get("rope_scaling") or {})
        full["rope_theta"] = opt_float(cfg, "rope_theta", DEFAULT_THETA["full_attention"])
        local = {"rope_theta": opt_float(cfg, "rope_local_base_freq", DEFAULT_THETA["sliding_attention"])}
        by_type = {"full_attention": full, "sliding_attention": local}
    return parse_rope({"rope_parameters": by_type["full_attention"]}), parse_rope(
        {"rope_parameters": by_type["sliding_attention"]}
    )


def parse(config: dict[str, Any]) -> ModelArgs:
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if config.get(key) is not None:
            raise ConfigError(f"config.json: gemma3 '{key}' = {config[key]!r} is not supported (Gemma 3 has none)")
    if opt_bool(config, "use_bidirectional_attention", False):
        raise ConfigError("config.json: gemma3 'use_bidirectional_attention' = true is an encoder, not a decoder")
    act = config.get("hidden_activation") or config.get("hidden_act") or Activation.GELU_TANH.value
    if act != Activation.GELU_TANH.value:
        raise ConfigError(f"config.json: gemma3 'hidden_activation' = {act!r} is not supported; "
                          f"supported: {Activation.GELU_TANH.value}")  # fmt: skip
    layers = opt_int(config, "num_hidden_layers", 1) or 1
    pattern = opt_int(config, "_sliding_window_pattern", None) or opt_int(config, "sliding_window_pattern", None)
    types = config.get("layer_types") or [
        "sliding_attention" if (i + 1) % (pattern or DEFAULT_PATTERN) else "full_attention" for i in range(layers)
    ]
    if len(types) != layers or not set(types) <= set(DEFAULT_THETA):
        raise ConfigError(f"config.json: gemma3 'layer_types' must list {layers} of {sorted(DEFAULT_THETA)}")
    local = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    window = opt_int(config, "sliding_window", 4096) if local else None
    rope, local_rope = _ropes(config)
    cfg = {**config, "head_dim": config.get("head_dim") or 256}
    bias = opt_bool(config, "attention_bias", False)
    args = parse_common(
        {k: v for k, v in cfg.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")},
        arch="gemma3_text",
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        activation=Activation.GELU_TANH,
        embed_scale=float(np.float32(cfg["hidden_size"] ** 0.5)) if isinstance(cfg.get("hidden_size"), int) else 1.0,
        attn_scale=opt_float(config, "query_pre_attn_scalar", 256.0) ** -0.5,
        sandwich_norms=True,
        local_layers=local,
        local_window=window,
        local_rope=local_rope,
    )
    return replace(args, rope=rope, tie_word_embeddings=opt_bool(config, "tie_word_embeddings", True))


ARCH = Architecture(name="gemma3_text", parse=parse, weights=WEIGHTS)
