"""What a decoder layer is, said once; each forward lowers it.

Every supported architecture's layer is two residual sublayers, attention then the gated MLP, each

    x = x + post_norm(block(norm(x)))

where the post norm exists only where the checkpoint has one (Gemma 3), and the model ends with a final
norm. `run_layer` is the one layer loop; the three forwards supply a `Lowering` of its steps:

    exporters/reference.py   numpy, dense cache or StreamingLLM's ring    (ReferenceModel, StreamingReference)
    exporters/decoder.py     the portable graph (`trt`)                   (_PortableLowering)
    exporters/decoder.py     the `ort` graph, the residual add fused into the next norm (_OrtLowering)

A new layer shape (another norm placement, a parallel block) is a change here plus, per lowering, only
the operations it does not have yet; the loop and the weights' roles are not written three times.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from .base import LayerWeights

X = TypeVar("X")  # a lowering's value: an ndarray (reference) or a tensor name (graph builders)


class Block(enum.Enum):
    ATTENTION = "attn"
    MLP = "mlp"


@dataclass(frozen=True)
class Sublayer:
    """One residual branch: `block` between a pre-norm and an optional post norm. The names are the
    graph's node-name parts (Hugging Face's module names), so every lowering names nodes alike."""

    block: Block
    norm: np.ndarray  # [H]
    post_norm: np.ndarray | None  # [H], on the block's output before the residual add
    norm_name: str
    post_norm_name: str


def sublayers(lw: LayerWeights) -> tuple[Sublayer, Sublayer]:
    return (
        Sublayer(Block.ATTENTION, lw.attn_norm, lw.post_attn_norm, "input_layernorm", "post_attention_norm"),
        Sublayer(Block.MLP, lw.mlp_norm, lw.post_mlp_norm, "post_attention_layernorm", "post_feedforward_norm"),
    )


class Lowering(Protocol[X]):
    """One forward's operations for `run_layer`. `norm` returns (the normed input, the residual stream):
    a lowering that defers the residual add into the next norm (`ort`'s SkipSimplifiedLayerNormalization)
    returns the stream it formed there, the others `x` itself."""

    def norm(self, layer: int, sub: Sublayer, x: X) -> tuple[X, X]: ...

    def attention(self, layer: int, lw: LayerWeights, h: X) -> X: ...

    def mlp(self, layer: int, lw: LayerWeights, h: X) -> X: ...

    def post_norm(self, layer: int, sub: Sublayer, y: X) -> X: ...

    def residual(self, layer: int, sub: Sublayer, x: X, y: X) -> X: ...


def run_layer(lowering: Lowering[X], layer: int, lw: LayerWeights, x: X) -> X:
    """The residual stream after decoder layer `layer` (weights `lw`)."""
    for sub in sublayers(lw):
        h, x = lowering.norm(layer, sub, x)
        y = lowering.attention(layer, lw, h) if sub.block is Block.ATTENTION else lowering.mlp(layer, lw, h)
        if sub.post_norm is not None:
            y = lowering.post_norm(layer, sub, y)
        x = lowering.residual(layer, sub, x, y)
    return x


def run_layers(lowering: Lowering[X], layers: Sequence[LayerWeights], x: X) -> X:
    """The residual stream after every layer (the final norm is the caller's: where it goes differs)."""
    for i, lw in enumerate(layers):
        x = run_layer(lowering, i, lw, x)
    return x
