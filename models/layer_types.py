"""`layer_types`: which layers attend a sliding window and which the whole context, for models with one RoPE.

`transformers` lists each layer as `full_attention` or `sliding_attention` (Ministral, and Qwen2/Qwen3 with
`use_sliding_window`). Where every layer slides, the window is the model's (`ModelArgs.sliding_window`: the one
ring is that window, no sinks, as for Mistral v0.1); where some do, they are local layers with the model's own
RoPE, each keeping a ring of the window beside the global layers' sinks + window ring (docs/architecture.md
§5.2). Gemma 3, whose local layers have their own RoPE, parses its list itself.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edge_runtime.errors import ConfigError

from .base import ModelArgs, opt_bool, opt_int

SLIDING, FULL = "sliding_attention", "full_attention"
DEFAULT_WINDOW = 4096  # MistralConfig's, MinistralConfig's, Qwen2Config's and Qwen3Config's, for a missing key


def sliding_window(config: dict[str, Any]) -> int | None:
    """The window as those config classes read it: 4096 where the key is missing, none where it is null."""
    return opt_int(config, "sliding_window", None) if "sliding_window" in config else DEFAULT_WINDOW


def with_layer_types(args: ModelArgs, types: Any, window: int | None) -> ModelArgs:
    """`args` with the sliding layers that `types` names, each attending `window` tokens back (itself
    included). `types` None: every layer slides where there is a window, none where there is not."""
    n, arch = args.num_layers, args.model_type
    if types is None:
        types = [SLIDING if window is not None else FULL] * n
    if not isinstance(types, list) or len(types) != n or not set(types) <= {SLIDING, FULL}:
        raise ConfigError(f"config.json: {arch} 'layer_types' must list {n} of {[FULL, SLIDING]}")
    sliding = tuple(i for i, t in enumerate(types) if t == SLIDING)
    if sliding and window is None:
        raise ConfigError(f"config.json: {arch} 'layer_types' has sliding_attention layers but no sliding window")
    if not sliding:
        return replace(args, sliding_window=None)
    if len(sliding) == n:
        return replace(args, sliding_window=window)
    return replace(args, sliding_window=None, local_layers=sliding, local_window=window, local_rope=args.rope)


def qwen_layer_types(args: ModelArgs, config: dict[str, Any]) -> ModelArgs:
    """Qwen2/Qwen3's: a window only with `use_sliding_window`, and then (without a `layer_types` list) on the
    layers from `max_window_layers` on, as their `transformers` configs decide it."""
    window = sliding_window(config) if opt_bool(config, "use_sliding_window", False) else None
    types = config.get("layer_types")
    if types is None:
        first = config.get("max_window_layers")
        first = 28 if first is None else first  # Qwen2Config's and Qwen3Config's default; 0: every layer
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ConfigError(f"config.json: 'max_window_layers' = {first!r} must be an integer >= 0")
        types = [SLIDING if window is not None and i >= first else FULL for i in range(args.num_layers)]
    return with_layer_types(args, types, window)
