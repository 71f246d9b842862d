"""SmolLM3 (3B): the Llama block, where every `no_rope_layer_interval`-th layer (by default the fourth)
has no RoPE (NoPE): its q and k attend unrotated (`ModelArgs.nope_layers`).

`no_rope_layers` lists a 1 (RoPE) or 0 (NoPE) per layer and wins over the interval, as in
SmolLM3Config. Sliding-window layers (`use_sliding_window: true` with a `sliding_window`, which
transformers applies to the NoPE layers) are refused: the released checkpoint has them off.
"""

from __future__ import annotations

from typing import Any

from edge_runtime.errors import ConfigError

from .base import Architecture, ModelArgs, opt_bool, opt_int, parse_common
from .gguf_layout import GGUFLayout, GGUFMeta, bias_from_tensors
from .llama import WEIGHTS

DEFAULT_THETA = 2_000_000.0  # SmolLM3Config's, for a config.json that names none
DEFAULT_INTERVAL = 4
# llama.cpp fixes SmolLM3's NoPE layers at every fourth (hparams.n_no_rope_layer_step); the file has no key.
GGUF_NO_ROPE_STEP = 4


def nope_layers(config: dict[str, Any], layers: int) -> tuple[int, ...]:
    flags = config.get("no_rope_layers")
    if flags is None:
        interval = opt_int(config, "no_rope_layer_interval", DEFAULT_INTERVAL) or 0
        if interval < 1:
            raise ConfigError(f"config.json: smollm3 'no_rope_layer_interval' = {interval} must be 1 or more")
        return tuple(i for i in range(layers) if (i + 1) % interval == 0)
    if not isinstance(flags, list) or len(flags) < layers or any(f not in (0, 1) or isinstance(f, bool) for f in flags):
        raise ConfigError(f"config.json: smollm3 'no_rope_layers' must list a 0 or 1 for each of the {layers} layers")
    return tuple(i for i in range(layers) if flags[i] == 0)


def parse(config: dict[str, Any]) -> ModelArgs:
    if opt_bool(config, "use_sliding_window", False) and config.get("sliding_window") is not None:
        raise ConfigError("config.json: smollm3 'use_sliding_window' = true is not supported; set it to false")
    layer_types = config.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise ConfigError(f"config.json: smollm3 'layer_types' {sorted(set(layer_types))} is not supported; "
                          "only full_attention layers are")  # fmt: skip
    params = config.get("rope_parameters")
    if config.get("rope_theta") is None and not (isinstance(params, dict) and params.get("rope_theta") is not None):
        config = {**config, "rope_theta": DEFAULT_THETA}  # parse_rope falls back to the top-level key
    bias = opt_bool(config, "attention_bias", False)
    return parse_common(
        config,
        arch="smollm3",
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=opt_bool(config, "mlp_bias", False),
        nope_layers=nope_layers(config, opt_int(config, "num_hidden_layers", 0) or 0),
    )


def gguf_config(meta: GGUFMeta, config: dict[str, Any]) -> dict[str, Any]:
    return {**bias_from_tensors(meta, config), "use_sliding_window": False, "no_rope_layer_interval": GGUF_NO_ROPE_STEP}


ARCH = Architecture(
    name="smollm3",
    parse=parse,
    weights=WEIGHTS,
    gguf=GGUFLayout("smollm3", "SmolLM3ForCausalLM", permuted_qk=True, config=gguf_config),
)
