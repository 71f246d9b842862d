"""models/layer_plan.py: the one layer loop every forward lowers (the reference, the portable and `ort` graphs).

Numerics of each lowering are tested where they are used (test_reference, test_architectures, the parity
tests); here the loop's contract: the order of the steps, post norms only where the layer has them, and
the weights each step is handed.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from edge_runtime.models import LayerWeights
from edge_runtime.models.layer_plan import Block, Sublayer, run_layer, run_layers, sublayers


def _layer(seed: int, post_norms: bool = False) -> LayerWeights:
    rng = np.random.default_rng(seed)
    h, i = 4, 6
    w = lambda *shape: rng.standard_normal(shape)  # noqa: E731
    square = {name: w(h, h) for name in ("q", "k", "v", "o")}
    lw = LayerWeights(attn_norm=w(h), mlp_norm=w(h), gate=w(i, h), up=w(i, h), down=w(h, i), **square)
    return replace(lw, post_attn_norm=w(h), post_mlp_norm=w(h)) if post_norms else lw


class Recorder:
    """A lowering over strings that records each step, so the loop's order is visible."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def norm(self, layer: int, sub: Sublayer, x: str) -> tuple[str, str]:
        self.calls.append(("norm", layer, sub.norm_name, id(sub.norm)))
        return f"norm({x})", x

    def attention(self, layer: int, lw: LayerWeights, h: str) -> str:
        self.calls.append(("attention", layer))
        return f"attn({h})"

    def mlp(self, layer: int, lw: LayerWeights, h: str) -> str:
        self.calls.append(("mlp", layer))
        return f"mlp({h})"

    def post_norm(self, layer: int, sub: Sublayer, y: str) -> str:
        self.calls.append(("post_norm", layer, sub.post_norm_name, id(sub.post_norm)))
        return f"post({y})"

    def residual(self, layer: int, sub: Sublayer, x: str, y: str) -> str:
        self.calls.append(("residual", layer, sub.block))
        return f"{x}+{y}"


def test_a_layer_is_attention_then_mlp_each_between_its_norms() -> None:
    lw = _layer(0)
    rec = Recorder()
    out = run_layer(rec, 3, lw, "x")
    assert out == "x+attn(norm(x))+mlp(norm(x+attn(norm(x))))"
    assert rec.calls == [
        ("norm", 3, "input_layernorm", id(lw.attn_norm)),
        ("attention", 3),
        ("residual", 3, Block.ATTENTION),
        ("norm", 3, "post_attention_layernorm", id(lw.mlp_norm)),
        ("mlp", 3),
        ("residual", 3, Block.MLP),
    ]


def test_post_norms_run_only_where_the_layer_has_them() -> None:
    lw = _layer(1, post_norms=True)
    rec = Recorder()
    out = run_layer(rec, 0, lw, "x")
    assert out == "x+post(attn(norm(x)))+post(mlp(norm(x+post(attn(norm(x))))))"
    posts = [c for c in rec.calls if c[0] == "post_norm"]
    assert posts == [
        ("post_norm", 0, "post_attention_norm", id(lw.post_attn_norm)),
        ("post_norm", 0, "post_feedforward_norm", id(lw.post_mlp_norm)),
    ]
    assert [s.post_norm is not None for s in sublayers(_layer(2))] == [False, False]


def test_run_layers_numbers_the_layers_and_threads_the_stream() -> None:
    rec = Recorder()
    out = run_layers(rec, [_layer(0), _layer(1)], "x")
    assert [c[1] for c in rec.calls if c[0] == "attention"] == [0, 1]
    first = run_layer(Recorder(), 0, _layer(0), "x")
    assert out.startswith(f"{first}+attn(norm({first}))")  # layer 1 reads layer 0's output


def test_the_reference_lowering_equals_the_written_out_layer() -> None:
    """The reference's lowering is the textbook pre-norm residual layer, bit for bit."""
    from edge_runtime.exporters.reference import NumpyLowering, post_norm, rms_norm

    lw = _layer(3, post_norms=True)
    x = np.random.default_rng(4).standard_normal((5, 4))
    attend = lambda i, lw, h: np.tanh(h @ lw.q.T) @ lw.o.T  # noqa: E731
    mlp = lambda lw, h, layer: (h @ lw.gate.T * (h @ lw.up.T)) @ lw.down.T  # noqa: E731
    got = run_layer(NumpyLowering(1e-6, attend, mlp), 0, lw, x)
    a = x + post_norm(attend(0, lw, rms_norm(x, lw.attn_norm, 1e-6)), lw.post_attn_norm, 1e-6)
    want = a + post_norm(mlp(lw, rms_norm(a, lw.mlp_norm, 1e-6), 0), lw.post_mlp_norm, 1e-6)
    np.testing.assert_array_equal(got, want)
