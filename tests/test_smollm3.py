"""SmolLM3's config: which layers have no RoPE, as transformers decides it, and what is refused.

Parity of the exported graphs with `transformers` is test_architectures.py's (the `smollm3` tiny config);
test_parity_transformers.py and test_graph.py run both tiny configs through the reference and the graphs.
"""

from __future__ import annotations

import pytest

from edge_runtime.errors import ConfigError, ExportError
from edge_runtime.exporters.prune_layers import check_layer_pruning, supports_layer_pruning
from edge_runtime.models import RopeKind, get_arch

from .tiny_models import TINY_CONFIGS

transformers = pytest.importorskip("transformers")


def parse(**overrides):
    cfg = {**TINY_CONFIGS["smollm3"], **overrides}
    return get_arch(cfg).parse(cfg)


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # every second layer (the tiny config's interval)
        {"no_rope_layer_interval": 4, "num_hidden_layers": 36},  # the 3B checkpoint's shape
        {"no_rope_layer_interval": 1},  # no layer rotates
        {"no_rope_layers": [1, 0, 0, 1]},  # the list wins over the interval
        {"no_rope_layers": [1, 0, 1, 1, 0]},  # a list longer than the layers
        {"use_sliding_window": True},  # without a sliding_window: every layer full attention
    ],
)
def test_nope_layers_are_transformers(overrides):
    cfg = {**TINY_CONFIGS["smollm3"], **overrides}
    hf = transformers.AutoConfig.for_model(**cfg)
    want = tuple(i for i, uses_rope in enumerate(hf.no_rope_layers[: hf.num_hidden_layers]) if not uses_rope)
    args = parse(**overrides)
    assert args.nope_layers == want
    assert tuple(i for i in range(args.num_layers) if args.rope_kind(i) is RopeKind.NONE) == want


@pytest.mark.parametrize(
    "rope",
    [{}, {"rope_parameters": {"rope_type": "default"}}, {"rope_parameters": {"rope_type": "linear", "factor": 2.0}},
     {"rope_theta": 5e6, "rope_parameters": {"rope_type": "default"}}],
    ids=["none", "parameters-without-theta", "linear-without-theta", "theta-beside-parameters"],
)  # fmt: skip
def test_rope_base_is_transformers(rope):
    """SmolLM3's default base (2e6) where the config names none, and a top-level rope_theta beside a
    rope_parameters without one, as transformers resolves them."""
    cfg = {**{k: v for k, v in TINY_CONFIGS["smollm3"].items() if k != "rope_theta"}, **rope}
    want = transformers.AutoConfig.for_model(**cfg).rope_parameters
    got = get_arch(cfg).parse(cfg).rope
    assert (got.theta, got.factor) == (want["rope_theta"], want.get("factor", 1.0))


def test_a_layer_both_local_and_nope_is_refused():
    from dataclasses import replace

    args = parse()
    with pytest.raises(ConfigError, match=r"layers \[1\] are both local"):
        replace(args, local_layers=(1, 2), local_window=8)


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"use_sliding_window": True, "sliding_window": 16}, "use_sliding_window"),
        ({"layer_types": ["sliding_attention"] * 4}, "layer_types"),
        ({"no_rope_layers": [1, 0]}, "no_rope_layers"),
        ({"no_rope_layers": [1, 2, 1, 1]}, "no_rope_layers"),
        ({"no_rope_layers": [True, False, True, True]}, "no_rope_layers"),  # transformers' list[int] refuses them too
        ({"no_rope_layer_interval": 0}, "no_rope_layer_interval"),
    ],
)
def test_refused_configs_say_which_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        parse(**overrides)


def test_whole_layer_pruning_is_refused():
    """Removing a layer would shift which layers have no RoPE."""
    args = parse()
    assert not supports_layer_pruning(args)
    with pytest.raises(ExportError, match="RoPE and NoPE"):
        check_layer_pruning(args, 1)
    check_layer_pruning(args, 0)
