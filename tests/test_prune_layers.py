"""Whole-layer pruning (exporters/prune_layers.py): which layers may go, the refit that takes a removed block
over, the pruned model end to end, and refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime.bundle import open_bundle
from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import ExportError
from edge_runtime.exporters import ReferenceModel, load_checkpoint
from edge_runtime.exporters.calibrate import InputStats, capture_linear_inputs, load_calibration
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.prune import RECON_SINK_WEIGHT, PruneConfig, prune_model, pruned_args, reconstruct
from edge_runtime.exporters.prune_layers import BlockStats, check_layer_pruning, choose_layers, layer_scores
from edge_runtime.exporters.quant import QuantConfig, QuantMethod
from edge_runtime.exporters.reference import DenseKVCache
from edge_runtime.exporters.validate import rel_err

from .tiny_models import save_prune_checkpoint, save_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return load_checkpoint(save_prune_checkpoint(tmp_path_factory.mktemp("ckpt")))


@pytest.fixture(scope="module")
def stats(ckpt):
    blocks = BlockStats(RECON_SINK_WEIGHT)
    acts = capture_linear_inputs(ckpt.args, ckpt.weights, load_calibration(ckpt), blocks=blocks)
    return acts, blocks


def test_every_layer_but_the_first_is_scored_and_the_statistics_are_the_blocks_outputs(ckpt, stats):
    """C_l = X^T D_l against a plain forward: X the down_proj inputs of layer l - 1, D_l what layer l adds
    (each sequence's first row once more per later token)."""
    acts, blocks = stats
    assert sorted(layer_scores(blocks)) == [1, 2, 3] and all(v > 0 for v in layer_scores(blocks).values())
    ref = ReferenceModel(ckpt.args, ckpt.weights)
    seqs = load_calibration(ckpt).sequences
    want = 0.0
    for seq in seqs:
        h = [ref.embed_rows(seq)]
        downs = []
        orig = ref._mlp

        def mlp(lw, x, layer=-1, orig=orig, downs=downs):
            downs.append(ref.act(x @ lw.gate.T) * (x @ lw.up.T))
            return orig(lw, x, layer)

        ref._mlp = mlp
        positions = np.arange(len(seq))
        cache, angles = DenseKVCache(positions=positions), ref.angles(positions)
        for i, lw in enumerate(ref.layers):
            h.append(ref.layer(i, lw, h[-1], positions, angles, cache))
        ref._mlp = orig
        x, d = downs[1].astype(np.float32), (h[3] - h[2]).astype(np.float32)  # layer 2's block, layer 1's inputs
        want = want + x.T @ d + (len(seq) - 1) * np.outer(x[0], d[0])
    assert np.allclose(blocks.cross[2], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert acts.down[1].rows == sum(len(s) for s in seqs)


def test_absorbing_a_block_the_previous_down_proj_can_express_is_exact():
    """D = X A^T (a block whose output is linear in the previous down_proj's inputs): the refit is W + A."""
    rng = np.random.default_rng(3)
    k_in, out, t = 24, 10, 30
    xs = [rng.normal(size=(t, k_in)) for _ in range(3)]
    stats = InputStats.empty(k_in)
    for x in xs:
        stats.add(x)
    w, a = rng.normal(size=(out, k_in)), rng.normal(size=(out, k_in))
    cross, total = 0.0, 0.0
    for x in xs:
        x32 = x.astype(np.float32).astype(np.float64)
        d = x32 @ a.T
        cross = cross + x32.T @ d + (t - 1) * np.outer(x32[0], d[0])
        total = total + d.sum(axis=0) + (t - 1) * d[0]
    fit, _ = reconstruct(w, stats, np.arange(k_in), damp=1e-12, absorb=(cross, total))
    assert np.abs(fit - (w + a)).max() < 1e-4


def test_layers_chosen_never_include_the_first_nor_two_adjacent_ones():
    scores = {1: 0.3, 2: 0.05, 3: 0.2, 4: 0.06, 5: 0.5}
    assert choose_layers(scores, 2) == [2, 4]
    with pytest.raises(ExportError, match="at most 2 of 6 can go"):
        choose_layers(scores, 3)
    assert choose_layers(scores, 1) == choose_layers(scores, 2)[:1]  # the budget search adds one at a time


def test_a_removed_layer_is_taken_over_by_the_previous_down_proj(ckpt, stats):
    """One layer gone: the model has one layer fewer, the layer before it got a new down_proj, the others are
    as they were, and the refit brings the logits closer to the unpruned model's than dropping the layer."""
    acts, blocks = stats
    pruned, record = prune_model(ckpt.args, ckpt.weights, acts, PruneConfig(0.0, 32, layers=1), blocks=blocks)
    (gone,) = record["layers_removed"]
    assert gone == min(layer_scores(blocks), key=layer_scores(blocks).get) and len(pruned.layers) == 3
    assert pruned_args(ckpt.args, pruned).num_layers == 3 and record["removed"] == pytest.approx(0.25, abs=1e-6)
    kept = [i for i in range(4) if i != gone]
    for j, i in enumerate(kept):
        same = np.array_equal(pruned.layers[j].down, ckpt.weights.layers[i].down)
        assert same == (i != gone - 1)
    dropped = ckpt.weights.layers[:gone] + ckpt.weights.layers[gone + 1 :]
    plain = type(ckpt.weights)(ckpt.weights.embed, ckpt.weights.final_norm, ckpt.weights.lm_head, dropped)
    seq = load_calibration(ckpt).sequences[0]
    want = ReferenceModel(ckpt.args, ckpt.weights).forward(seq)
    refit = rel_err(ReferenceModel(ckpt.args, pruned).forward(seq), want)
    drop = rel_err(ReferenceModel(ckpt.args, plain).forward(seq), want)
    assert refit < drop
    print(f"layer {gone}: logits rel. error {drop:.3e} dropped, {refit:.3e} taken over")


@pytest.mark.parametrize("quant", [QuantConfig(), QuantConfig(QuantMethod.INT4, 32)], ids=["fp32", "int4"])
def test_layer_pruned_export_validates_end_to_end(ckpt, tmp_path, quant):
    out = tmp_path / "b"
    m = export(ExportOptions(ckpt.path, out, window=64, prune=0.2, prune_layers=1, quant=quant))
    p = m.quantization["pruning"]
    assert m.model.num_layers == 3 and len(p["layers_removed"]) == 1 and p["layers_removed"][0] >= 1
    assert len(m.model.intermediate_size) == 3 and m.provenance["options"]["prune_layers"] == 1
    manifest = open_bundle(out).manifest
    assert {n for n in manifest.graph.inputs if n.startswith("past_key.")} == {"past_key.0", "past_key.1", "past_key.2"}
    if quant.enabled:
        assert m.quantization["exact_parity"]["max_rel_err"] <= 1e-4
    else:
        assert m.validation.max_rel_err <= m.validation.tolerance


def test_layer_pruning_is_refused_where_it_cannot_apply(ckpt, tmp_path):
    with pytest.raises(ExportError, match="at most 2 can go"):  # before minutes of calibration
        check_layer_pruning(ckpt.args, 3)
    g = tmp_path / "gemma"
    save_tiny_checkpoint("gemma3", g)
    with pytest.raises(ExportError, match="interleaves local and global layers"):
        export(ExportOptions(g, tmp_path / "out", window=64, prune_layers=1))
    assert not (tmp_path / "out").exists()
    all_global = dataclasses.replace(load_checkpoint(g).args, local_layers=())  # still normed before the add
    with pytest.raises(ExportError, match="cannot take a removed one over"):
        check_layer_pruning(all_global, 1)
    r = CliRunner().invoke(
        export_cli, [str(ckpt.path), "-o", str(tmp_path / "c"), "--prune-layers", "1", "--prune-budget", "5"]
    )
    assert r.exit_code == 2 and "mutually exclusive" in r.output
