"""Sequential reconstruction of a pruned model (exporters/prune_sequential.py)."""

from __future__ import annotations

import numpy as np
import pytest

from edge_runtime.errors import ExportError
from edge_runtime.exporters import ReferenceModel, load_checkpoint
from edge_runtime.exporters.calibrate import calibration_perplexity, capture_linear_inputs, load_calibration
from edge_runtime.exporters.prune import (
    PruneConfig,
    Reconstruction,
    prune_model,
    prune_to_budget,
    reconstruct,
)
from edge_runtime.exporters.validate import rel_err
from edge_runtime.models import ModelWeights

from .tiny_models import save_prune_checkpoint

SEQUENTIAL = [r for r in Reconstruction if r.value.startswith("sequential")]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return load_checkpoint(save_prune_checkpoint(tmp_path_factory.mktemp("ckpt")))


@pytest.fixture(scope="module")
def calib(ckpt):
    return load_calibration(ckpt)


@pytest.fixture(scope="module")
def acts(ckpt, calib):
    return capture_linear_inputs(ckpt.args, ckpt.weights, calib)


@pytest.fixture(scope="module")
def pruned(ckpt, calib, acts):
    """The same 30% selection under every reconstruction."""
    return {
        r: prune_model(ckpt.args, ckpt.weights, acts, PruneConfig(0.3, 32, r), sequences=calib.sequences)
        for r in Reconstruction
    }


def _depth(weights: ModelWeights, n: int) -> ModelWeights:
    """The first n layers, read out by the final norm and LM head: the stream after layer n."""
    return ModelWeights(weights.embed, weights.final_norm, weights.lm_head, weights.layers[:n])


def test_every_reconstruction_keeps_the_same_selection(ckpt, pruned):
    shapes = {r: [tuple(getattr(lw, f).shape for f in ("q", "k", "o", "gate", "down")) for lw in p.layers]
              for r, (p, _) in pruned.items()}  # fmt: skip
    assert len({tuple(s) for s in shapes.values()}) == 1
    assert [rec["reconstruction"] and rec["reconstruction"]["kind"] for _, rec in pruned.values()] == [
        None if r is Reconstruction.NONE else r.value for r in Reconstruction
    ]


def test_the_first_layers_o_proj_refit_is_the_one_shot_one(ckpt, calib, acts, pruned):
    """Layer 0's attention sees the same inputs in both models (nothing before it is pruned), so its
    sequential o_proj refit solves the one-shot problem: the same weights up to the one-shot statistics'
    float32 products (InputStats.add)."""
    seq, _ = pruned[Reconstruction.SEQUENTIAL]
    lw, d = ckpt.weights.layers[0], ckpt.args.head_dim
    keep_kv = [h for h in range(lw.num_kv_heads(d)) if any(np.array_equal(lw.k[h * d], r) for r in seq.layers[0].k)]
    q_rows = (np.asarray(keep_kv)[:, None] * 2 * d + np.arange(2 * d)[None, :]).reshape(-1)
    one_shot, _ = reconstruct(lw.o, acts.o[0], q_rows)
    assert seq.layers[0].o.shape == one_shot.shape
    assert np.abs(seq.layers[0].o - one_shot).max() <= 1e-4 * np.abs(one_shot).max()


def test_sequential_lowers_the_stream_error_against_one_shot_at_every_depth(ckpt, calib, pruned):
    """The residual stream after each layer (read out as logits) on the calibration sequences: the
    sequential refit is nearer the unpruned model's than the one-shot refit from the second layer on,
    and one-shot is nearer than slicing at the end."""
    errs = {r: [] for r in (Reconstruction.NONE, Reconstruction.ONE_SHOT, *SEQUENTIAL)}
    for n in range(1, len(ckpt.weights.layers) + 1):
        want = [ReferenceModel(ckpt.args, _depth(ckpt.weights, n)).forward(s) for s in calib.sequences]
        for r in errs:
            model = ReferenceModel(ckpt.args, _depth(pruned[r][0], n))
            errs[r].append(max(rel_err(model.forward(s), w) for s, w in zip(calib.sequences, want, strict=True)))
    for r in SEQUENTIAL:
        assert all(s < o for s, o in zip(errs[r][1:], errs[Reconstruction.ONE_SHOT][1:], strict=True)), (r, errs)
    assert errs[Reconstruction.ONE_SHOT][-1] < errs[Reconstruction.NONE][-1]
    print({r.value: [f"{e:.3f}" for e in v] for r, v in errs.items()})


@pytest.mark.parametrize("method", SEQUENTIAL, ids=lambda r: r.value)
def test_removing_dead_channels_stays_exact(ckpt, calib, method):
    """Channels and a head group that contribute nothing (zero down_proj / o_proj columns) are what a small
    ratio removes; the sliced model is then exact, every refit's exact solution is its own weights, and
    the sequential refit keeps the logits (to float32 rounding of the refitted weights)."""
    d, w = ckpt.args.head_dim, ckpt.weights
    layers = [type(lw)(**{k: None if v is None else np.array(v) for k, v in vars(lw).items()}) for lw in w.layers]
    layers[1].down[:, 40:72] = 0.0
    layers[2].o[:, 2 * 2 * d : 3 * 2 * d] = 0.0  # KV head 2's two query heads
    model = ModelWeights(w.embed, w.final_norm, w.lm_head, layers)
    a = capture_linear_inputs(ckpt.args, model, calib)
    params = sum(getattr(lw, f).size for lw in layers for f in ("q", "k", "v", "o", "gate", "up", "down"))
    target = (32 * 3 * 64 + 6 * d * 64) / params * (1 - 1e-9)
    out, rec = prune_model(ckpt.args, model, a, PruneConfig(target, 32, method), sequences=calib.sequences)
    assert rec["intermediate_size"] == [128, 96, 128, 128] and rec["num_kv_heads"] == [4, 4, 3, 4]
    ids = calib.sequences[0]
    assert rel_err(ReferenceModel(ckpt.args, out).forward(ids), ReferenceModel(ckpt.args, model).forward(ids)) < 1e-6


def test_sequential_needs_the_sequences_and_the_kind_must_be_known(ckpt, acts):
    with pytest.raises(ExportError, match="sequential reconstruction needs the calibration sequences"):
        prune_model(ckpt.args, ckpt.weights, acts, PruneConfig(0.3, 32, Reconstruction.SEQUENTIAL))
    with pytest.raises(ExportError, match="is not one of: none, one-shot, sequential"):
        PruneConfig(0.3, 32, "sequential")


def test_budget_search_with_sequential_reconstruction_stays_within_budget(ckpt, calib, acts):
    """--prune-budget's bisection with the sequential refit: the chosen pruning's calibration perplexity,
    measured again here, is within +15% and is the largest measured point within it."""
    seqs = calib.sequences

    def evaluate(w):
        return calibration_perplexity(ckpt.args, w, seqs)

    out, rec = prune_to_budget(
        ckpt.args, ckpt.weights, acts, 15.0, evaluate, 32, Reconstruction.SEQUENTIAL, sequences=seqs
    )
    base, got = evaluate(ckpt.weights), evaluate(out)
    assert got <= base * 1.15 and rec["calibration_ppl"]["pruned"] == pytest.approx(got, rel=1e-4)
    assert rec["reconstruction"]["kind"] == "sequential" and rec["removed"] > 0
    within = [t["removed"] for t in rec["budget"]["trials"] if t["calibration_ppl"] <= base * 1.15]
    assert rec["removed"] == max(within)
