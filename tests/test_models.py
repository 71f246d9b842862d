"""Architecture registry and config parsing: typed args, both config vintages, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from edge_runtime.errors import ConfigError, UnsupportedArchitectureError
from edge_runtime.models import ALIASES, ARCHITECTURES, get_arch, supported_model_types

from .tiny_models import TINY_CONFIGS


def test_every_registered_architecture_has_a_tiny_test_config():
    tested = {cfg["model_type"] for cfg in TINY_CONFIGS.values()}
    missing = sorted((set(ARCHITECTURES) | set(ALIASES)) - tested)
    assert not missing, f"registered model_type(s) without a tiny config in tests/tiny_models.py: {missing}"


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_tiny_configs_parse(name):
    cfg = TINY_CONFIGS[name]
    args = get_arch(cfg).parse(cfg)
    assert args.model_type == cfg["model_type"]
    assert args.num_heads % args.num_kv_heads == 0


def test_unsupported_model_type_lists_supported():
    with pytest.raises(UnsupportedArchitectureError) as e:
        get_arch({"model_type": "gpt2"})
    assert "'gpt2'" in str(e.value)
    for t in supported_model_types():
        assert t in str(e.value)


def test_alias_resolves_to_its_architecture_file():
    assert get_arch("ministral") is ARCHITECTURES["mistral"]


def test_missing_required_key_is_named():
    cfg = dict(TINY_CONFIGS["llama-tied"])
    del cfg["intermediate_size"]
    with pytest.raises(ConfigError, match="'intermediate_size' is missing"):
        get_arch(cfg).parse(cfg)


@pytest.mark.parametrize(
    "key,value",
    [
        ("hidden_size", "64"),
        ("num_hidden_layers", 0),
        ("rms_norm_eps", "x"),
        ("tie_word_embeddings", "yes"),
        ("num_key_value_heads", 3),
    ],
)
def test_ill_typed_values_are_named(key, value):
    cfg = {**TINY_CONFIGS["llama-tied"], key: value}
    with pytest.raises(ConfigError, match=key):
        get_arch(cfg).parse(cfg)


def test_unknown_keys_are_ignored():
    cfg = {**TINY_CONFIGS["llama-tied"], "some_future_key": {"x": 1}, "architectures": ["LlamaForCausalLM"]}
    assert get_arch(cfg).parse(cfg).hidden_size == 64


def test_both_rope_vintages_parse_the_same():
    old = {**TINY_CONFIGS["llama-llama3-rope"]}
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {"rope_theta": old["rope_theta"], **old["rope_scaling"]}
    assert get_arch(old).parse(old).rope == get_arch(new).parse(new).rope
    assert get_arch(new).parse(new).rope.theta == 500000.0


def test_unsupported_rope_type_lists_supported():
    cfg = {**TINY_CONFIGS["llama-tied"], "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(ConfigError, match=r"'yarn'.*default, linear, llama3"):
        get_arch(cfg).parse(cfg)


def test_partial_rotary_keeps_the_tail_dims():
    cfg = {**TINY_CONFIGS["llama-tied"], "partial_rotary_factor": 0.5}
    args = get_arch(cfg).parse(cfg)
    assert args.head_dim == 16 and args.rotary_dim == 8
    assert args.rope.inv_freq(args.head_dim).shape == (4,)


def test_llama3_rope_frequencies_scaled_by_band():
    cfg = TINY_CONFIGS["llama-llama3-rope"]
    rope = get_arch(cfg).parse(cfg).rope
    base = 1.0 / (rope.theta ** (np.arange(0, 16, 2) / 16))
    ratio = rope.inv_freq(16) / base
    # High frequencies untouched, low ones divided by `factor`, the band between smoothly in between.
    assert ratio[0] == 1.0 and ratio[-1] == pytest.approx(1 / 8)
    assert np.all(np.diff(ratio) <= 0)
