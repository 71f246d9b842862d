"""Gemma 3 text decoders (`gemma3_text`: 270M, 1B; the text tower of the larger ones).

Differences from the Llama block, each a field of `ModelArgs` the generic blocks read:
- RMSNorm scales by (1 + w): the weights are rewritten to w' = 1 + w at load (`_folds`), so every norm
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
    RopeConfig,
    WeightFolds,
    opt_bool,
    opt_float,
    opt_int,
    parse_common,
    parse_rope,
)
from .gguf_layout import GGUFLayout, GGUFMeta
from .qwen3 import WEIGHTS as QWEN3_WEIGHTS

DEFAULT_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}  # Gemma3TextConfig's
DEFAULT_PATTERN = 6  # every sixth layer global, when config.json lists no layer_types


def _plus_one(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else np.asarray(a, dtype=np.float32) + np.float32(1.0)


def _folds(_config: dict[str, Any]) -> WeightFolds:
    norms = ("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm", "q_norm", "k_norm")
    return WeightFolds(
        layer=lambda lw: replace(lw, **{f: _plus_one(getattr(lw, f)) for f in norms}), final_norm=_plus_one
    )


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


GGUF_SWA_PATTERN = 6  # llama.cpp's: every sixth layer global (the GGUF may say otherwise)
GGUF_LOCAL_THETA = 10_000.0  # llama.cpp's fixed RoPE base of Gemma 3's local layers


def gguf_config(meta: GGUFMeta, config: dict[str, Any]) -> dict[str, Any]:
    """What a Gemma 3 config.json has beyond the Llama keys, as llama.cpp runs the file: its window and
    layer pattern, the local layers' RoPE base, and the softmax scale it derives (head_dim ** -0.5, except
    the 27B shape's (hidden / heads) ** -0.5: llama.cpp's llm_load_hparams)."""
    layers, hidden, heads = config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]
    pattern = meta.int("gemma3.attention.sliding_window_pattern", GGUF_SWA_PATTERN)
    is_27b = layers == 62 and hidden == 5376
    return {
        **{k: v for k, v in config.items() if k != "hidden_act"},
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": meta.int("gemma3.attention.sliding_window"),
        "layer_types": ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)],
        "rope_local_base_freq": GGUF_LOCAL_THETA,
        "query_pre_attn_scalar": hidden // heads if is_27b else config["head_dim"],
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    }


# Its four norms a layer are stored as 1 + w, which the conversion undoes so the checkpoint is Hugging Face's.
GGUF = GGUFLayout(
    "gemma3",
    "Gemma3ForCausalLM",
    permuted_qk=False,
    layer_names={
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "ffn_norm.weight": "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    },
    norms_plus_one=True,
    config=gguf_config,
)
ARCH = Architecture(name="gemma3_text", parse=parse, weights=WEIGHTS, gguf=GGUF, folds=_folds)
