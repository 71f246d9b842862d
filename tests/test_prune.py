"""Structured pruning: importance ranking, width rules, the pruned model end to end, bad ratios."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from edge_runtime.bundle import open_bundle
from edge_runtime.errors import ExportError
from edge_runtime.exporters import ReferenceModel, load_checkpoint
from edge_runtime.exporters.calibrate import DEFAULT_CALIBRATION_TOKENS, capture_linear_inputs, load_calibration
from edge_runtime.exporters.decoder import Flavor
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.prune import PruneConfig, prune_model
from edge_runtime.exporters.quant import QuantConfig, QuantMethod
from edge_runtime.exporters.quant_pipeline import pruning_unit
from edge_runtime.exporters.validate import rel_err
from edge_runtime.models import GENERAL_CALIBRATION, ModelWeights

from .tiny_models import _TEXT, save_tiny_checkpoint

LINEARS = ("q", "k", "v", "o", "gate", "up", "down")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """4 layers, 4 KV heads of 2 query heads (head_dim 16), MLP 128: room for per-layer differences."""
    d = tmp_path_factory.mktemp("ckpt")
    save_tiny_checkpoint(
        "llama-untied",
        d,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=16,
        intermediate_size=128,
    )
    (d / "calibration.txt").write_text(_TEXT * 2)
    return load_checkpoint(d)


@pytest.fixture(scope="module")
def acts(ckpt):
    return capture_linear_inputs(ckpt.args, ckpt.weights, load_calibration(ckpt))


def _params(weights: ModelWeights) -> int:
    return sum(getattr(lw, f).size for lw in weights.layers for f in LINEARS)


@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_widths_stay_whole_units_and_groups_and_the_ratio_is_met(ckpt, acts, ratio):
    pruned, record = prune_model(ckpt.args, ckpt.weights, acts, PruneConfig(ratio, unit=32))
    d = ckpt.args.head_dim
    removed = 1 - _params(pruned) / _params(ckpt.weights)
    biggest_chunk = (2 * 2 + 2) * d * ckpt.args.hidden_size / _params(ckpt.weights)  # one KV head and its queries
    assert ratio <= removed < ratio + biggest_chunk
    for lw in pruned.layers:
        hq, hkv = lw.num_heads(d), lw.num_kv_heads(d)
        assert lw.gate.shape[0] % 32 == 0 and lw.gate.shape[0] >= 32
        assert hq == 2 * hkv and hkv >= 1 and (hq * d) % 32 == 0  # whole GQA groups; o_proj input blockable
        assert lw.o.shape == (ckpt.args.hidden_size, hq * d) and lw.down.shape[1] == lw.up.shape[0]
    assert record["intermediate_size"] == [lw.gate.shape[0] for lw in pruned.layers]
    assert record["num_kv_heads"] == [lw.num_kv_heads(d) for lw in pruned.layers]
    print(f"ratio {ratio}: removed {removed:.3f}, MLP {record['intermediate_size']}, KV {record['num_kv_heads']}")


def test_channels_and_head_groups_that_contribute_nothing_go_first_and_change_nothing(ckpt, acts):
    """Zero the down_proj columns of 32 MLP channels (layer 1) and the o_proj columns of KV head 2's
    group (layer 2): their activation-weighted importance is 0, so a small ratio removes exactly
    them, and the pruned model computes the same logits as the unpruned one."""
    d, w = ckpt.args.head_dim, ckpt.weights
    layers = [type(lw)(**{k: None if v is None else np.array(v) for k, v in vars(lw).items()}) for lw in w.layers]
    dead_ch = np.arange(40, 72)
    layers[1].down[:, dead_ch] = 0.0
    layers[2].o[:, 2 * 2 * d : 3 * 2 * d] = 0.0  # query heads 4, 5 = KV head 2's group
    model = ModelWeights(w.embed, w.final_norm, w.lm_head, layers)
    target = (32 * 3 * 64 + 6 * d * 64) / _params(model) * (1 - 1e-9)  # exactly those two chunks
    pruned, record = prune_model(ckpt.args, model, acts, PruneConfig(target, unit=32))
    assert record["intermediate_size"] == [128, 96, 128, 128] and record["num_kv_heads"] == [4, 4, 3, 4]
    keep = np.setdiff1d(np.arange(128), dead_ch)
    assert np.array_equal(pruned.layers[1].gate, layers[1].gate[keep])
    ids = np.random.default_rng(0).integers(0, ckpt.args.vocab_size, 30)
    want = ReferenceModel(ckpt.args, model).forward(ids)
    assert rel_err(ReferenceModel(ckpt.args, pruned).forward(ids), want) < 1e-12


def test_unit_follows_the_int4_block():
    assert pruning_unit(QuantConfig()) == 32
    assert pruning_unit(QuantConfig(QuantMethod.INT8)) == 32
    assert pruning_unit(QuantConfig(QuantMethod.INT4, block=128)) == 128


@pytest.mark.parametrize(
    "flavor,quant",
    [(Flavor.TRT, QuantConfig()), (Flavor.ORT, QuantConfig(QuantMethod.INT4, 32))],
    ids=["trt-fp32", "ort-int4"],
)
def test_pruned_export_validates_end_to_end(ckpt, tmp_path, flavor, quant):
    """Per-layer widths differ after pruning: the graph builder, the reference, the validation grid,
    the manifest and the bundle reader all take them from the weights."""
    out = tmp_path / "b"
    m = export(ExportOptions(ckpt.path, out, flavor=flavor, window=64, prune=0.4, quant=quant))
    p = m.quantization["pruning"]
    assert m.model.intermediate_size == p["intermediate_size"] and m.model.num_kv_heads == p["num_kv_heads"]
    assert len(set(zip(m.model.intermediate_size, m.model.num_kv_heads, strict=True))) > 1  # layers differ
    assert m.model.parameters < sum(int(np.prod(ckpt.tensors.shape(n))) for n in ckpt.tensors)
    if quant.enabled:
        assert m.quantization["exact_parity"]["max_rel_err"] <= 1e-4
    else:
        assert m.validation.max_rel_err <= m.validation.tolerance == 1e-4
    manifest = open_bundle(out).manifest
    shape = manifest.graph.inputs["past_key.0"]["shape"]  # [1, Hkv, C, D] in both flavors
    assert (shape[1], shape[3]) == (m.model.num_kv_heads[0], m.model.head_dim)


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.25, 1.5])
def test_ratio_outside_zero_one_is_refused_and_leaves_nothing(ckpt, tmp_path, ratio):
    with pytest.raises(ExportError, match=r"prune ratio .* must be in \(0, 1\)"):
        export(ExportOptions(ckpt.path, tmp_path / "out", window=64, prune=ratio))
    assert list(tmp_path.iterdir()) == []


def test_unreachable_ratio_names_the_limit(ckpt, acts):
    with pytest.raises(ExportError, match=r"at most 0\.\d+; use a smaller --prune"):
        prune_model(ckpt.args, ckpt.weights, acts, PruneConfig(0.95, unit=32))


def test_without_calib_the_general_calibration_text_is_used(ckpt, tmp_path):
    """Not the demo model's Shakespeare: a checkpoint without its own text gets general English + code."""
    d = tmp_path / "ck"
    shutil.copytree(ckpt.path, d, ignore=shutil.ignore_patterns("calibration.txt"))
    calib = load_calibration(load_checkpoint(d))
    assert calib.path == GENERAL_CALIBRATION and calib.record()["file"].endswith("general_en_code.txt")
    assert calib.tokens <= DEFAULT_CALIBRATION_TOKENS + len(calib.sequences) and all(
        s[0] == ckpt.args.bos_token_id for s in calib.sequences
    )
    assert max(len(s) for s in calib.sequences) <= 512
