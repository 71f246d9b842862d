"""input_stats.RowSample: wide inputs' statistics as a row sample instead of X^T X, where the
consumer only measures output errors (AWQ's scale search, the manifest's record)."""

from __future__ import annotations

import numpy as np
import pytest

from edge_runtime.exporters import input_stats, load_checkpoint, memory_plan, quant_awq
from edge_runtime.exporters.calibrate import TAPPED, LayerInputStream, load_calibration
from edge_runtime.exporters.input_stats import InputStats
from edge_runtime.exporters.quant import quantize_rtn
from edge_runtime.exporters.quant_awq import search_scales

from .tiny_models import _TEXT, save_tiny_checkpoint


def _sequences(rng, seqs: int, t: int, k: int) -> list[np.ndarray]:
    out = []
    for _ in range(seqs):
        seq = rng.standard_normal((t, k)) * np.exp(0.5 * rng.standard_normal(k))
        seq[0] *= 10  # an attention sink: a large first row, which the sample keeps exactly
        out.append(seq)
    return out


def _both(monkeypatch, seqs, sample_size):
    monkeypatch.setattr(input_stats, "SAMPLE_ROWS", sample_size)
    k = seqs[0].shape[1]
    later = sum(len(s) - 1 for s in seqs)
    gram, sample = InputStats.empty(k), InputStats.empty(k, later)
    for s in seqs:
        gram.add(s)
        sample.add(s)
    return gram, sample


def test_a_sample_of_every_row_gives_the_gram_matrix_figures(monkeypatch):
    """Stride 1 (no more rows than the sample holds): the same output error, sink-weighted loss and
    divided statistics as X^T X, to float32 rounding."""
    rng = np.random.default_rng(0)
    gram, sample = _both(monkeypatch, _sequences(rng, 3, 20, 96), 64)  # K = 96 > 64; 57 later rows
    assert sample.gram is None and sample.sample.stride == 1 and sample.sample.taken == 57
    assert np.array_equal(sample.abs_sum, gram.abs_sum) and sample.rows == gram.rows == 60
    w = rng.standard_normal((16, 96))
    q = quantize_rtn(w, 4, 32).dequantize()
    assert sample.output_error(q, w) == pytest.approx(gram.output_error(q, w), rel=1e-5)
    monkeypatch.setattr(input_stats, "ERROR_BLOCK_ELEMENTS", 3 * 96)  # three rows a block: the same sums
    assert sample.output_error(q, w) == pytest.approx(gram.output_error(q, w), rel=1e-5)
    d = q - w
    for weight in (0.0, 1.0):
        assert sample.squared_output(weight)(d) == pytest.approx(gram.squared_output(weight)(d), rel=1e-5)
    s = np.exp(rng.standard_normal(96))
    assert sample.divided(s).squared_output(1.0)(d) == pytest.approx(gram.divided(s).squared_output(1.0)(d), rel=1e-5)


def test_the_sample_takes_every_stride_th_later_row_across_sequences(monkeypatch):
    rng = np.random.default_rng(1)
    seqs = _sequences(rng, 4, 11, 20)  # 40 later rows, sample of 8: stride 5
    _, sample = _both(monkeypatch, seqs, 8)
    rs = sample.sample
    later = np.concatenate([s[1:] for s in seqs]).astype(np.float32)
    assert rs.stride == 5 and rs.taken == 8 and rs.seen == 40
    np.testing.assert_array_equal(rs.rows[: rs.taken], later[::5])
    np.testing.assert_array_equal(np.asarray(rs.firsts), np.asarray([s[0] for s in seqs], np.float32))
    with pytest.raises(ValueError, match="row sample of 8 rows is full"):
        sample.add(seqs[0])


def test_a_thinned_sample_estimates_the_output_error(monkeypatch):
    """Every 8th later row of 2,400: the output error within a few percent of X^T X's, the first rows exact."""
    rng = np.random.default_rng(2)
    seqs = _sequences(rng, 8, 301, 320)
    gram, sample = _both(monkeypatch, seqs, 300)
    assert sample.sample.stride == 8
    w = rng.standard_normal((64, 320))
    q = quantize_rtn(w, 4, 32).dequantize()
    exact, est = gram.output_error(q, w), sample.output_error(q, w)
    print(f"output error: X^T X {exact:.5f}, 1-in-8 sample {est:.5f}")
    assert est == pytest.approx(exact, rel=0.05)


def test_what_needs_the_gram_matrix_refuses_a_sample(monkeypatch):
    _, sample = _both(monkeypatch, _sequences(np.random.default_rng(3), 2, 10, 20), 8)
    for read in (lambda: sample.column_norms, lambda: sample.sink_weighted(1.0)):
        with pytest.raises(ValueError, match="needs X\\^T X"):
            read()


def test_awq_thins_wide_linears_rows_for_its_loss(monkeypatch):
    """Rows quantize independently, so the loss on every k-th output row (times k) estimates the whole one:
    the search keeps its choice on a Linear whose rows are alike, and nothing is thinned below LOSS_ROWS."""
    rng = np.random.default_rng(4)
    k = 64
    stats = InputStats.empty(k)
    for _ in range(4):
        stats.add(rng.standard_normal((60, k)) * np.exp(rng.standard_normal(k)))
    w = rng.standard_normal((256, k))
    whole = search_scales(stats, [w], 32)
    monkeypatch.setattr(quant_awq, "LOSS_ROWS", 64)
    thinned = search_scales(stats, [w], 32)
    print(
        f"alpha whole {whole.alpha} ({whole.loss_ratio:.3f}), thinned 1 in 4 {thinned.alpha} ({thinned.loss_ratio:.3f})"
    )
    assert abs(thinned.alpha - whole.alpha) <= 0.1 and thinned.loss_ratio == pytest.approx(whole.loss_ratio, abs=0.05)
    monkeypatch.setattr(quant_awq, "LOSS_ROWS", 256)
    same = search_scales(stats, [w], 32)
    assert same.alpha == whole.alpha and np.array_equal(same.scales, whole.scales)


def test_layer_stream_samples_only_the_inputs_wider_than_the_sample(monkeypatch, tmp_path):
    """sample_wide: inputs up to SAMPLE_ROWS wide keep X^T X bit for bit; wider ones a sample of the rows."""
    save_tiny_checkpoint("qwen2", tmp_path)
    (tmp_path / "calibration.txt").write_text(_TEXT * 3)
    ck = load_checkpoint(tmp_path)
    calib = load_calibration(ck, max_tokens=200)
    widths = {group: getattr(ck.weights.layers[0], f).shape[1] for f, group in TAPPED.items()}
    narrow = min(widths.values())
    assert max(widths.values()) > narrow  # the tiny model has inputs of two widths: one of each kind
    monkeypatch.setattr(input_stats, "SAMPLE_ROWS", narrow)
    monkeypatch.setattr(memory_plan, "SAMPLE_ROWS", narrow)
    full = LayerInputStream(ck.args, ck.weights, calib, lambda _m: None)
    sampled = LayerInputStream(ck.args, ck.weights, calib, lambda _m: None, sample_wide=True)
    for i in range(ck.args.num_layers):
        a, b = full.layer(i), sampled.layer(i)
        for group, width in widths.items():
            x, y = getattr(a, group), getattr(b, group)
            if width > narrow:
                assert y.gram is None and y.sample.taken > 0 and y.sample.seen == calib.tokens - len(calib.sequences)
            else:
                assert y.sample is None and np.array_equal(x.gram, y.gram)
            np.testing.assert_array_equal(x.abs_sum, y.abs_sum)
        # the export's memory estimate counts what the statistics hold (a sample at most SAMPLE_ROWS rows)
        order = ("attn", "o", "mlp", "down")
        held = [sum(_held(getattr(stats, g)) for g in order) for stats in (a, b)]
        estimate = [memory_plan._stats_bytes(tuple(widths[g] for g in order), sampled) for sampled in (False, True)]
        assert held[0] == estimate[0] and held[1] <= estimate[1] < estimate[0]


def _held(stats: InputStats) -> int:
    return stats.gram.nbytes if stats.gram is not None else stats.sample.rows.nbytes
