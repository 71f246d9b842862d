"""IBM Granite 3.x dense decoders (`granite`: 2B, 8B): the Llama block with four scalar multipliers.

- `embedding_multiplier` scales the embedding rows and `attention_multiplier` is the softmax scale (Gemma 3's
  `ModelArgs.embed_scale` and `attn_scale`);
- `residual_multiplier` scales each block's output before its residual add and `logits_scaling` divides the
  logits: both are linear, so they are folded into the weights as each layer is read (o_proj and down_proj,
  and their biases, times the first; the final norm's weight over the second, which keeps a tied LM head
  tied), and no forward knows of them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from edge_runtime.errors import ConfigError

from .base import Architecture, LayerWeights, ModelArgs, WeightFolds, opt_bool, opt_float, parse_common
from .llama import WEIGHTS


def _positive(config: dict[str, Any], key: str) -> float:
    value = opt_float(config, key, 1.0)  # GraniteConfig's default for all four
    if value <= 0:
        raise ConfigError(f"config.json: granite '{key}' = {value!r} must be positive")
    return value


def parse(config: dict[str, Any]) -> ModelArgs:
    for key in ("residual_multiplier", "logits_scaling"):
        _positive(config, key)  # refused here, before any weight is read
    bias = opt_bool(config, "attention_bias", False)
    return parse_common(
        config,
        arch="granite",
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=opt_bool(config, "mlp_bias", False),
        embed_scale=_positive(config, "embedding_multiplier"),
        attn_scale=_positive(config, "attention_multiplier"),
    )


def _folds(config: dict[str, Any]) -> WeightFolds:
    r = np.float32(_positive(config, "residual_multiplier"))
    s = np.float32(_positive(config, "logits_scaling"))

    def scaled(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a, dtype=np.float32) * r

    def layer(lw: LayerWeights) -> LayerWeights:
        return replace(
            lw, o=scaled(lw.o), o_bias=scaled(lw.o_bias), down=scaled(lw.down), down_bias=scaled(lw.down_bias)
        )

    return WeightFolds(layer=layer, final_norm=lambda w: np.asarray(w, dtype=np.float32) / s, linear=True)


ARCH = Architecture(name="granite", parse=parse, weights=WEIGHTS, folds=_folds)
