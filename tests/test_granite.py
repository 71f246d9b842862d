"""Granite's multipliers (models/granite.py): two are ModelArgs features, two are folded into the weights as
each layer is read (`WeightFolds`), which must matter, keep the layers lazy and a tied LM head tied."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from edge_runtime.errors import ConfigError
from edge_runtime.exporters import ReferenceModel, load_checkpoint
from edge_runtime.exporters.lazy_layers import LazyLayers
from edge_runtime.models import ARCHITECTURES, get_arch

from .tiny_models import TINY_CONFIGS, save_tiny_checkpoint

torch = pytest.importorskip("torch")


def logits_of(hf, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.from_numpy(ids)[None]).logits[0].double().numpy()


def test_the_folded_multipliers_are_what_makes_the_reference_equal_transformers(tmp_path, monkeypatch):
    hf = save_tiny_checkpoint("granite", tmp_path)
    ids = np.random.default_rng(1).integers(0, TINY_CONFIGS["granite"]["vocab_size"], 64)
    theirs = logits_of(hf, ids)

    def err() -> float:
        ckpt = load_checkpoint(tmp_path)
        ours = ReferenceModel(ckpt.args, ckpt.weights).forward(ids)
        return float(np.abs(ours - theirs).max() / np.abs(theirs).max())

    assert err() <= 1e-4
    monkeypatch.setitem(ARCHITECTURES, "granite", dataclasses.replace(ARCHITECTURES["granite"], folds=None))
    assert err() > 1e-3


def test_the_folds_rewrite_each_layer_as_it_is_read(tmp_path):
    """The folded arrays are transformers' parameters times the multipliers, built lazily layer by layer, and
    the tables are never rewritten (the tied head still reads the table as stored)."""
    hf = save_tiny_checkpoint("granite", tmp_path)
    cfg = TINY_CONFIGS["granite"]
    r, s = np.float32(cfg["residual_multiplier"]), np.float32(cfg["logits_scaling"])
    ckpt = load_checkpoint(tmp_path)
    assert isinstance(ckpt.weights.layers, LazyLayers)
    for i, layer in enumerate(hf.model.layers):
        lw = ckpt.weights.layers[i]
        np.testing.assert_array_equal(lw.o, layer.self_attn.o_proj.weight.detach().numpy() * r)
        np.testing.assert_array_equal(lw.down, layer.mlp.down_proj.weight.detach().numpy() * r)
        np.testing.assert_array_equal(lw.q, layer.self_attn.q_proj.weight.detach().numpy())  # untouched
    np.testing.assert_array_equal(ckpt.weights.final_norm, hf.model.norm.weight.detach().numpy() / s)
    np.testing.assert_array_equal(ckpt.weights.embed, hf.model.embed_tokens.weight.detach().numpy())
    assert ckpt.weights.lm_head is ckpt.weights.embed


def test_gemma3_norms_are_folded_lazily_too(tmp_path):
    hf = save_tiny_checkpoint("gemma3", tmp_path)
    ckpt = load_checkpoint(tmp_path)
    assert isinstance(ckpt.weights.layers, LazyLayers)
    for i, layer in enumerate(hf.model.layers):
        lw = ckpt.weights.layers[i]
        np.testing.assert_array_equal(lw.attn_norm, layer.input_layernorm.weight.detach().numpy() + np.float32(1))
        np.testing.assert_array_equal(lw.k_norm, layer.self_attn.k_norm.weight.detach().numpy() + np.float32(1))
    np.testing.assert_array_equal(ckpt.weights.final_norm, hf.model.norm.weight.detach().numpy() + np.float32(1))


@pytest.mark.parametrize(
    "key", ["embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"]
)
@pytest.mark.parametrize("value", [0, -1.0, "2"])
def test_a_multiplier_that_is_not_a_positive_number_is_refused_by_name(key, value):
    cfg = {**TINY_CONFIGS["granite"], key: value}
    with pytest.raises(ConfigError, match=key):
        get_arch(cfg).parse(cfg)
