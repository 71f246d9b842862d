"""`layer_types` with one RoPE (models/layer_types.py): Ministral's interleaving, Qwen2/Qwen3's
`use_sliding_window`, parsed as `transformers` decides them (end to end: test_architectures.py)."""

from __future__ import annotations

import json

import pytest

from edge_runtime.errors import ConfigError
from edge_runtime.models import get_arch

from .tiny_models import TINY_CONFIGS

S, F = "sliding_attention", "full_attention"
DROP = object()  # an override that removes the key from config.json


def config(name: str, **overrides) -> dict:
    return {k: v for k, v in {**TINY_CONFIGS[name], **overrides}.items() if v is not DROP}


def parse(name: str, **overrides):
    cfg = config(name, **overrides)
    return get_arch(cfg).parse(cfg)


def theirs(cfg: dict, tmp_path) -> tuple[list[str], int | None]:
    """(layer types, window) as `transformers` reads the same config.json (AutoConfig.from_pretrained, which
    also turns a `mistral` config listing `layer_types` into Ministral)."""
    transformers = pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    c = transformers.AutoConfig.from_pretrained(tmp_path)
    if c.sliding_window is None:
        return [F] * c.num_hidden_layers, None
    types = getattr(c, "layer_types", None) or [S] * c.num_hidden_layers  # MistralConfig: every layer slides
    return list(types), (c.sliding_window if S in types else None)


def ours(args) -> tuple[list[str], int | None]:
    if args.sliding_window is not None:
        return [S] * args.num_layers, args.sliding_window
    return [S if args.is_local(i) else F for i in range(args.num_layers)], args.local_window


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("ministral", {}),
        ("ministral", {"layer_types": None}),  # no list: every layer slides, as Mistral v0.1
        ("ministral", {"layer_types": None, "sliding_window": None}),  # no window: Llama
        ("ministral", {"layer_types": [F] * 4}),  # a window that no layer uses
        ("ministral", {"sliding_window": DROP}),  # no key: the class default, 4096
        ("ministral", {"model_type": "mistral"}),  # a mistral config listing layer_types is Ministral
        ("mistral-window", {}),
        ("mistral-window", {"sliding_window": DROP}),
        ("mistral-window", {"sliding_window": None}),
        ("qwen2-sliding", {}),
        ("qwen2-sliding", {"max_window_layers": 0}),  # every layer slides
        ("qwen2-sliding", {"max_window_layers": 3}),  # none does
        ("qwen2-sliding", {"max_window_layers": DROP}),  # the default, 28: none of 3
        ("qwen2-sliding", {"use_sliding_window": False}),  # the window is off, whatever max_window_layers says
        ("qwen2-sliding", {"sliding_window": DROP}),  # on, with the class default
        ("qwen3-sliding", {}),
        ("qwen3-sliding", {"layer_types": None, "max_window_layers": 1}),
    ],
)
def test_sliding_layers_are_the_ones_transformers_picks(name, overrides, tmp_path):
    args = parse(name, **overrides)
    assert ours(args) == theirs(config(name, **overrides), tmp_path)
    if args.local_layers:  # the local layers keep the model's one RoPE
        assert args.local_rope == args.rope


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"layer_types": [S, F]}, "must list 4"),
        ({"layer_types": [S, F, "chunked_attention", F]}, "must list 4"),
        ({"layer_types": "sliding_attention"}, "must list 4"),
        ({"sliding_window": None}, "no sliding window"),
    ],
)
def test_bad_layer_types_are_refused_by_name(overrides, match):
    with pytest.raises(ConfigError, match=match):
        parse("ministral", **overrides)


def test_a_negative_max_window_layers_is_refused():
    with pytest.raises(ConfigError, match="max_window_layers"):
        parse("qwen2-sliding", max_window_layers=-1)


def test_keys_transformers_ignores_are_ignored():
    """MistralAttention has no biases whatever `attention_bias` says; LlamaAttention never slides."""
    assert not parse("mistral-window", attention_bias=True, mlp_bias=True).qkv_bias
    assert parse("llama-tied", sliding_window=16).sliding_window is None
