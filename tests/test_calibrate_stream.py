"""calibrate.LayerInputStream: each layer's calibration statistics computed when that layer is reached,
equal bit for bit to tapping a whole-model forward (in the calibration's float32) one sequence at a time."""

from __future__ import annotations

import numpy as np
import pytest

from edge_runtime.exporters import load_checkpoint
from edge_runtime.exporters.calibrate import (
    CALIBRATION_DTYPE,
    TAPPED,
    InputStats,
    LayerInputStream,
    _Tap,
    load_calibration,
)
from edge_runtime.exporters.reference import ReferenceModel

from .tiny_models import _TEXT, save_tiny_checkpoint


@pytest.fixture(scope="module", params=["qwen2", "gemma3"])
def ckpt(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    save_tiny_checkpoint(request.param, d)
    (d / "calibration.txt").write_text(_TEXT * 3)
    return load_checkpoint(d)


def _whole_model_taps(ck, calib) -> dict[tuple[int, str], InputStats]:
    """The way calibration ran before: the reference held whole, its weights tapped, one forward a sequence."""
    ref = ReferenceModel(ck.args, ck.weights, CALIBRATION_DTYPE, lazy=False)
    stats = {}
    for i, lw in enumerate(ref.layers):
        for f, group in TAPPED.items():
            stats[(i, group)] = InputStats.empty(getattr(lw, f).shape[1])
            setattr(lw, f, _Tap(getattr(lw, f), stats[(i, group)].add))
    for seq in calib.sequences:
        ref.forward(seq)
    return stats


def test_layer_by_layer_statistics_equal_a_whole_model_forwards(ckpt):
    calib = load_calibration(ckpt, max_tokens=300)
    calib = type(calib)(calib.path, calib.sha256, [s[:100] for s in calib.sequences] + [calib.sequences[0][:37]])
    want = _whole_model_taps(ckpt, calib)
    stream = LayerInputStream(ckpt.args, ckpt.weights, calib, progress=lambda _m: None)
    assert len(stream) == ckpt.args.num_layers
    for i in range(len(stream)):
        got = stream.layer(i)
        for group in set(TAPPED.values()):
            a, b = getattr(got, group), want[(i, group)]
            assert a.rows == b.rows == calib.tokens
            np.testing.assert_array_equal(a.gram, b.gram)
            np.testing.assert_array_equal(a.abs_sum, b.abs_sum)
            np.testing.assert_array_equal(np.asarray(a.sinks), np.asarray(b.sinks))
    assert stream.seconds > 0


def test_layers_are_asked_for_in_order(ckpt):
    stream = LayerInputStream(ckpt.args, ckpt.weights, load_calibration(ckpt, max_tokens=64), lambda _m: None)
    with pytest.raises(ValueError, match="layer by layer"):
        stream.layer(1)
    stream.layer(0)
    with pytest.raises(ValueError, match="asked for 0, next is 1"):
        stream.layer(0)
