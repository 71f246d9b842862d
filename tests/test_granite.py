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


@pytest.mark.parametrize("name", ["granite", "gemma3"])
def test_folded_layers_stay_lazy_and_a_tied_head_stays_tied(name, tmp_path):
    save_tiny_checkpoint(name, tmp_path)
    ckpt = load_checkpoint(tmp_path)
    assert isinstance(ckpt.weights.layers, LazyLayers)
    assert ckpt.weights.lm_head is ckpt.weights.embed


@pytest.mark.parametrize(
    "key", ["embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"]
)
@pytest.mark.parametrize("value", [0, -1.0, "2"])
def test_a_multiplier_that_is_not_a_positive_number_is_refused_by_name(key, value):
    cfg = {**TINY_CONFIGS["granite"], key: value}
    with pytest.raises(ConfigError, match=key):
        get_arch(cfg).parse(cfg)
