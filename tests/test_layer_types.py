"""`layer_types` with one RoPE (models/layer_types.py): Ministral's interleaving, Qwen2/Qwen3's
`use_sliding_window`, parsed as `transformers` decides them and run end to end against it."""

from __future__ import annotations

import numpy as np
import pytest

from edge_runtime.engine import load
from edge_runtime.errors import ConfigError
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.models import get_arch

from .tiny_models import TINY_CONFIGS, save_tiny_checkpoint

S, F = "sliding_attention", "full_attention"


def parse(name: str, **overrides):
    cfg = {**TINY_CONFIGS[name], **overrides}
    return get_arch(cfg).parse(cfg)


def theirs(name: str, **overrides) -> list[str]:
    """The layer types `transformers`' own config class derives from the same config.json keys."""
    transformers = pytest.importorskip("transformers")
    cfg = {**TINY_CONFIGS[name], **overrides}
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    return list(config.layer_types) if config.sliding_window is not None else [F] * config.num_hidden_layers


def ours(args) -> list[str]:
    if args.sliding_window is not None:
        return [S] * args.num_layers
    return [S if args.is_local(i) else F for i in range(args.num_layers)]


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("ministral", {}),
        ("ministral", {"layer_types": None}),  # no list: every layer slides, as Mistral v0.1
        ("ministral", {"layer_types": None, "sliding_window": None}),  # no window: Llama
        ("ministral", {"layer_types": [F] * 4}),  # a window that no layer uses
        ("qwen2-sliding", {}),
        ("qwen2-sliding", {"max_window_layers": 0}),  # every layer slides
        ("qwen2-sliding", {"max_window_layers": 3}),  # none does
        ("qwen2-sliding", {"use_sliding_window": False}),  # the window is off, whatever max_window_layers says
        ("qwen3-sliding", {}),
        ("qwen3-sliding", {"layer_types": None, "max_window_layers": 1}),
    ],
)
def test_sliding_layers_are_the_ones_transformers_picks(name, overrides):
    args = parse(name, **overrides)
    assert ours(args) == theirs(name, **overrides)
    if args.local_layers:  # the local layers keep the model's one RoPE
        assert args.local_rope == args.rope and args.local_window == TINY_CONFIGS[name]["sliding_window"]


def test_a_mistral_config_with_layer_types_is_ministral():
    """transformers reads `model_type: mistral` with a `layer_types` list as Ministral (AutoConfig's rule)."""
    cfg = {**TINY_CONFIGS["ministral"], "model_type": "mistral"}
    assert get_arch(cfg).parse(cfg).local_layers == (0, 2)


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


def test_qwen2_sliding_layers_greedy_equals_transformers(tmp_path):
    """Ministral runs end to end in test_architectures.py; Qwen2's biases with local layers run here."""
    torch = pytest.importorskip("torch")
    hf = save_tiny_checkpoint("qwen2-sliding", tmp_path / "hf")
    export(ExportOptions(checkpoint=tmp_path / "hf", out=tmp_path / "b", window=200))
    engine, prompt = load(tmp_path / "b"), [0, 17, 33, 99, 250, 7]
    logits, got = engine.prefill(prompt), []
    for _ in range(64):
        got.append(int(np.argmax(logits)))
        logits = engine.decode(got[-1])
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, min_new_tokens=64,
                          do_sample=False, pad_token_id=2)  # fmt: skip
    assert got == out[0, len(prompt) :].tolist()
