"""Structured pruning: importance ranking, width rules, the pruned model end to end, bad ratios."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime.bundle import open_bundle
from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import ExportError
from edge_runtime.exporters import ReferenceModel, load_checkpoint, quant_pipeline
from edge_runtime.exporters.calibrate import (
    DEFAULT_CALIBRATION_TOKENS,
    InputStats,
    calibration_perplexity,
    capture_linear_inputs,
    load_calibration,
)
from edge_runtime.exporters.decoder import Flavor
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.prune import (
    BUDGET_STEPS,
    RECON_DAMP,
    RECON_SINK_WEIGHT,
    PruneConfig,
    Reconstruction,
    prune_model,
    prune_to_budget,
    reconstruct,
)
from edge_runtime.exporters.quant import QuantConfig, QuantMethod
from edge_runtime.exporters.quant_pipeline import PruneQualityWarning, pruning_unit
from edge_runtime.exporters.validate import rel_err
from edge_runtime.models import DEMO_CHECKPOINT, GENERAL_CALIBRATION, ModelWeights

from .tiny_models import _TEXT, save_prune_checkpoint, save_tiny_checkpoint

LINEARS = ("q", "k", "v", "o", "gate", "up", "down")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return load_checkpoint(save_prune_checkpoint(tmp_path_factory.mktemp("ckpt")))


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


# ------------------------------------------------------------------------------------------------
# Reconstruction and the perplexity budget
# ------------------------------------------------------------------------------------------------


def _embedded(w_kept: np.ndarray, keep: np.ndarray, width: int) -> np.ndarray:
    """W' [out, k] as a full-width [out, K] matrix with zero columns where inputs were removed."""
    full = np.zeros((w_kept.shape[0], width))
    full[:, keep] = w_kept
    return full


def _objective(stats, w: np.ndarray, approx: np.ndarray) -> float:
    """||X W^T - X approx^T||^2 over the sink-weighted calibration rows: what reconstruct minimises."""
    d = np.asarray(w, np.float64) - approx
    return float(((d @ stats.sink_weighted(RECON_SINK_WEIGHT)) * d).sum())


@pytest.mark.parametrize("damp", [1e-4, RECON_DAMP, 1.0])
def test_reconstruction_never_raises_the_objective_and_cuts_each_layers_output_error(ckpt, acts, damp):
    """For every pruned o_proj / down_proj: the refit's objective on the calibration statistics is at most
    plain slicing's (for any damping: it pulls toward the sliced weights), and its output error against
    the unpruned layer on the calibration rows is lower."""
    plain, _ = prune_model(ckpt.args, ckpt.weights, acts, PruneConfig(0.4, unit=32, reconstruction=Reconstruction.NONE))
    refitted = 0
    for i, (lw, pw) in enumerate(zip(ckpt.weights.layers, plain.layers, strict=True)):
        for name, stats, w, sliced in (("o", acts.o[i], lw.o, pw.o), ("down", acts.down[i], lw.down, pw.down)):
            if sliced.shape == w.shape:
                continue  # nothing removed here
            # the kept columns, found by matching the sliced ones (column order is preserved)
            keep = np.flatnonzero([any(np.array_equal(c, s) for s in sliced.T) for c in np.asarray(w).T])
            assert len(keep) == sliced.shape[1]
            refit, _ = reconstruct(w, stats, keep, damp=damp)
            full_refit, full_slice = _embedded(refit, keep, w.shape[1]), _embedded(sliced, keep, w.shape[1])
            assert _objective(stats, w, full_refit) <= _objective(stats, w, full_slice) * (1 + 1e-12), (i, name)
            assert stats.output_error(full_refit, w) < stats.output_error(full_slice, w), (i, name)
            refitted += 1
    assert refitted >= 4  # both kinds, several layers


def test_reconstruction_is_the_least_squares_fit_and_refits_a_bias():
    """On synthetic rows with a nonzero mean: with negligible damping the refit is lstsq's solution on the
    (sink-weighted) rows, a bias refit beats a weights-only one, and both beat slicing."""
    rng = np.random.default_rng(1)
    k_in, out, seqs, t = 48, 20, 4, 40
    mix = rng.normal(size=(k_in, k_in))
    xs = [rng.normal(size=(t, k_in)) @ mix + 3.0 for _ in range(seqs)]  # correlated, mean 3
    stats = InputStats.empty(k_in)
    for x in xs:
        stats.add(x)
    w, b = rng.normal(size=(out, k_in)), rng.normal(size=out)
    keep = np.sort(rng.choice(k_in, 30, replace=False))
    # the rows reconstruct sees: each sequence's first row repeated once per later token (sink weight 1)
    rows = np.concatenate([np.vstack([x, np.repeat(x[:1], t - 1, axis=0)]) for x in xs]).astype(np.float32)
    rows = rows.astype(np.float64)
    target = rows @ w.T + b

    def err(wk: np.ndarray, bk: np.ndarray) -> float:
        return float(np.linalg.norm(target - rows[:, keep] @ wk.T - bk))

    w_only, none = reconstruct(w, stats, keep, damp=1e-12)
    w_b, b_fit = reconstruct(w, stats, keep, bias=b, damp=1e-12)
    assert none is None and b_fit.shape == b.shape
    z = np.hstack([rows[:, keep], np.ones((len(rows), 1))])
    lstsq = np.linalg.lstsq(z, target, rcond=None)[0]
    # float32 products in the statistics (InputStats.add): agreement to ~1e-5 of the weights' scale
    assert np.abs(w_b - lstsq[:-1].T).max() < 1e-4 and np.abs(b_fit - lstsq[-1]).max() < 1e-3
    sliced = err(w[:, keep], b)
    assert err(w_b, b_fit) < err(w_only, b) < 0.9 * sliced
    print(f"output error: sliced {sliced:.1f}, refit {err(w_only, b):.1f}, refit with bias {err(w_b, b_fit):.1f}")


def test_reconstruction_brings_the_pruned_model_closer_to_the_unpruned_one(ckpt, acts):
    """Logits on a calibration sequence: the refitted pruned model is nearer the unpruned model than the
    plainly sliced one (and biases are refitted on a model that has them, below)."""
    seq = load_calibration(ckpt).sequences[0]
    want = ReferenceModel(ckpt.args, ckpt.weights).forward(seq)
    errs = {}
    for rec in (False, True):
        method = Reconstruction.ONE_SHOT if rec else Reconstruction.NONE
        pruned, record = prune_model(ckpt.args, ckpt.weights, acts, PruneConfig(0.3, unit=32, reconstruction=method))
        assert (record["reconstruction"] is not None) == rec
        errs[rec] = rel_err(ReferenceModel(ckpt.args, pruned).forward(seq), want)
    assert errs[True] < errs[False]
    print(f"logit rel. error: sliced {errs[False]:.3e}, reconstructed {errs[True]:.3e}")


def test_a_model_with_biases_gets_its_o_and_down_biases_refitted(tmp_path):
    save_tiny_checkpoint(
        "llama-untied", tmp_path, num_hidden_layers=2, head_dim=16, intermediate_size=128,
        num_attention_heads=8, num_key_value_heads=4, attention_bias=True, mlp_bias=True,
    )  # fmt: skip
    (tmp_path / "calibration.txt").write_text(_TEXT)
    ck = load_checkpoint(tmp_path)
    a = capture_linear_inputs(ck.args, ck.weights, load_calibration(ck))
    pruned, _ = prune_model(ck.args, ck.weights, a, PruneConfig(0.4, unit=32))
    changed = [
        (f, i)
        for i, (lw, pw) in enumerate(zip(ck.weights.layers, pruned.layers, strict=True))
        for f in ("o_bias", "down_bias")
        if getattr(pw, f) is not None and not np.array_equal(getattr(pw, f), getattr(lw, f))
    ]
    assert {f for f, _ in changed} == {"o_bias", "down_bias"}
    assert all(pw.o_bias.shape == lw.o_bias.shape for lw, pw in zip(ck.weights.layers, pruned.layers, strict=True))


def test_budget_search_stays_within_budget_on_the_demo_model():
    """Demo model, 2,048 calibration tokens: the chosen pruning's calibration perplexity is within +5%
    of the unpruned model's, measured here independently, and the record says what was reached."""
    ck = load_checkpoint(DEMO_CHECKPOINT)
    calib = load_calibration(ck, max_tokens=2048)
    a = capture_linear_inputs(ck.args, ck.weights, calib)
    seqs = calib.sequences[:2]
    calls = []

    def evaluate(w):
        calls.append(1)
        return calibration_perplexity(ck.args, w, seqs)

    pruned, record = prune_to_budget(ck.args, ck.weights, a, 5.0, evaluate, unit=32)
    base, got = calibration_perplexity(ck.args, ck.weights, seqs), calibration_perplexity(ck.args, pruned, seqs)
    assert got <= base * 1.05 and record["calibration_ppl"]["pruned"] == pytest.approx(got, rel=1e-4)
    assert record["removed"] > 0 and record["budget"]["budget_pct"] == 5.0
    assert len(calls) == record["budget"]["evaluations"] <= 1 + BUDGET_STEPS
    tried = [t["removed"] for t in record["budget"]["trials"] if t["calibration_ppl"] <= base * 1.05]
    assert record["removed"] == max(tried)  # the largest measured point within budget
    print(f"demo +5%: removed {record['removed']:.1%}, calibration ppl {base:.3f} -> {got:.3f}, {len(calls)} evals")


def test_prune_budget_export_records_the_ratio_and_perplexities(ckpt, tmp_path):
    m = export(ExportOptions(ckpt.path, tmp_path / "b", window=64, prune_budget=20.0))
    p = m.quantization["pruning"]
    c = p["calibration_ppl"]
    assert c["change_pct"] <= 20.0 and c["pruned"] <= c["unpruned"] * 1.2 and c["tokens"] > 0
    assert p["removed"] > 0 and p["removed"] in [t["removed"] for t in p["budget"]["trials"]]
    assert m.provenance["options"]["prune_budget"] == 20.0 and m.model.parameters < sum(
        int(np.prod(ckpt.tensors.shape(n))) for n in ckpt.tensors
    )


def test_prune_and_prune_budget_are_mutually_exclusive(ckpt, tmp_path):
    out = tmp_path / "out"
    r = CliRunner().invoke(export_cli, [str(ckpt.path), "-o", str(out), "--prune", "0.2", "--prune-budget", "10"])
    assert r.exit_code != 0 and "--prune and --prune-budget are mutually exclusive" in r.output
    assert not out.exists()
    with pytest.raises(ExportError, match="mutually exclusive"):
        export(ExportOptions(ckpt.path, out, window=64, prune=0.2, prune_budget=10.0))
    assert not out.exists()


def test_a_destructive_prune_warns_with_the_measured_increase(tmp_path, monkeypatch):
    """The demo model pruned 85% without reconstruction: the calibration perplexity more than doubles,
    which --prune still writes but warns about (edge-export prints the warning as one line)."""
    ck = load_checkpoint(DEMO_CHECKPOINT)
    calib = load_calibration(ck, max_tokens=1024)
    a = capture_linear_inputs(ck.args, ck.weights, calib)
    monkeypatch.setattr(quant_pipeline, "PRUNE_EVAL_TOKENS", 1024)
    with pytest.warns(PruneQualityWarning, match=r"raises calibration perplexity by \+\d+%"):
        _, rec = quant_pipeline._prune(
            ck.args,
            ck.weights,
            a,
            quant_pipeline.pruning_split(calib)[0],
            PruneConfig(0.85, 32, Reconstruction.NONE),
            None,
            32,
            print,
        )
    assert rec["calibration_ppl"]["change_pct"] > quant_pipeline.DESTRUCTIVE_PRUNE_PCT


def test_pruning_is_judged_on_calibration_text_its_statistics_did_not_see():
    """The first PRUNE_EVAL_TOKENS tokens judge a pruning and the rest feed its refits; a text too short to
    split is used for both (and the manifest says which)."""
    ck = load_checkpoint(DEMO_CHECKPOINT)
    calib = load_calibration(ck, max_tokens=3 * quant_pipeline.PRUNE_EVAL_TOKENS)
    judge, fit = quant_pipeline.pruning_split(calib)
    assert sum(len(s) for s in judge) <= quant_pipeline.PRUNE_EVAL_TOKENS < fit.tokens
    assert len(judge) + len(fit.sequences) == len(calib.sequences) and fit.sha256 == calib.sha256
    assert all(s is t for s, t in zip(judge + fit.sequences, calib.sequences, strict=True))
    short = load_calibration(ck, max_tokens=quant_pipeline.PRUNE_EVAL_TOKENS)
    assert quant_pipeline.pruning_split(short)[1] is short


def test_an_export_records_whether_pruning_was_judged_on_unfitted_text(ckpt, tmp_path):
    m = export(ExportOptions(ckpt.path, tmp_path / "b", window=64, prune=0.25))
    p = m.quantization["pruning"]
    assert p["calibration_ppl"]["judged_on_unfitted_text"] is False  # a short text: fitted and judged on all of it
    assert p["fitted_tokens"] == m.quantization["calibration"]["tokens"]
