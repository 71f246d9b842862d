"""Folds of ONNX nodes into the edge products they feed or follow (csrc/matmul_op.c's prologues and epilogue),
applied to a built graph (exporters/decoder.py) or as a layer's MLP is built (blocks_ort.mlp): each removes nodes
ONNX Runtime would dispatch one by one and rounds as they do (docs/decisions/folds-with-onnxruntime-rounding.md).

  SimplifiedLayerNorm / SkipSimplifiedLayerNorm ─► product   => the product's rms_norm prologue   (fold_norms)
  product ─► SimplifiedLayerNorm                             => the product's out_norm epilogue  (fold_norms)
  SiluMul ─► product                                         => silu_mul                         (fold_silu_mul)
  Split ─► FastGelu(gate) * up ─► product                    => gelu_mul                         (fold_gelu_mul)
"""

from __future__ import annotations

from collections.abc import Collection

from onnx import helper

from edge_runtime import kernels

from .graph import GraphBuilder

# The edge ops that take the folds (csrc/matmul_op.c)
EDGE_MATMULS = (kernels.MATMUL_Q4, kernels.MATMUL_Q8, kernels.MATMUL_GGUF)


def fold_norms(g: GraphBuilder, outputs: Collection[str]) -> None:
    """Where a (Skip)SimplifiedLayerNormalization's normed output has one consumer, a MatMulQ4/Q8/GGUF taking it
    as A, and is not one of the graph's `outputs`, that op computes the norm itself (its rms_norm prologue,
    over the last axis) and also outputs the sum x + delta:

      x, delta ─► SkipSimplifiedLayerNorm ─► h ─► MatMulQ4 ─► y       x, delta ─► MatMulQ4(rms_norm) ─► y
                                          └─► x + delta ─► ...   =>                                └─► x + delta
    One node and one pass over the row less, twice a layer. Then the norms after a product (_fold_output_norms)."""
    norms = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")
    for norm in [n for n in g.nodes if n.op_type in norms]:
        users = [n for n in g.nodes if norm.output[0] in n.input]
        mm = users[0] if len(users) == 1 and norm.output[0] not in outputs else None
        if mm is None or mm.op_type not in EDGE_MATMULS or mm.input[0] != norm.output[0]:
            continue
        if any(a.name in ("silu_mul", "gelu_mul") for a in mm.attribute) or len(mm.input) > 3 or len(mm.output) > 1:
            continue
        skip = norm.op_type == "SkipSimplifiedLayerNormalization"
        extra = norm.output[1:3]  # mean / inv std: must be read nowhere
        if any(o in outputs or any(o in n.input for n in g.nodes) for o in extra if o):
            continue
        if len(norm.input) != (3 if skip else 2) or any(a.name == "axis" and a.i != -1 for a in norm.attribute):
            continue  # a bias input, or a norm over another axis: not what the prologue computes
        x, delta, gamma = (norm.input[0], norm.input[1], norm.input[2]) if skip else (norm.input[0], "", norm.input[1])
        mm.input[:] = [x, mm.input[1], mm.input[2] if len(mm.input) > 2 else "", delta, gamma]  # MatMulGGUF: no scales
        if skip:
            mm.output.extend(["", norm.output[3]])
        eps = next(a.f for a in norm.attribute if a.name == "epsilon")
        mm.attribute.extend([helper.make_attribute("rms_norm", 1), helper.make_attribute("epsilon", eps)])
        g.nodes.remove(norm)
    _fold_output_norms(g, outputs)


def _fold_output_norms(g: GraphBuilder, outputs: Collection[str]) -> None:
    """Where a SimplifiedLayerNormalization normalizes the one use of a MatMulQ4/Q8/GGUF's only output (Gemma 3's
    post-attention and post-feed-forward norms), that op normalizes its rows itself (out_norm_epsilon, out_gamma:
    csrc/matmul_op.c), rounding as the node does (csrc/rms_norm.h): one node a norm less.

      h ─► MatMulGGUF ─► y ─► SimplifiedLayerNorm(w) ─► z        h ─► MatMulGGUF(out_norm, w) ─► z"""
    for norm in [n for n in g.nodes if n.op_type == "SimplifiedLayerNormalization"]:
        makers = [n for n in g.nodes if norm.input[0] in n.output]
        mm = makers[0] if len(makers) == 1 else None
        if mm is None or mm.op_type not in EDGE_MATMULS or list(mm.output) != [norm.input[0]]:
            continue
        if norm.input[0] in outputs or sum(norm.input[0] in n.input for n in g.nodes) != 1:
            continue
        if len(norm.input) != 2 or len(norm.output) != 1 or any(a.name == "axis" and a.i != -1 for a in norm.attribute):
            continue
        if any(a.name == "out_norm_epsilon" for a in mm.attribute):
            continue
        mm.input.extend([""] * (5 - len(mm.input)))
        mm.input.append(norm.input[1])
        eps = next(a.f for a in norm.attribute if a.name == "epsilon")
        mm.attribute.append(helper.make_attribute("out_norm_epsilon", eps))
        mm.output[0] = norm.output[0]
        g.nodes.remove(norm)


def fold_silu_mul(g: GraphBuilder, act: str) -> None:
    """Where SiluMul's one consumer is a MatMulQ4/Q8/GGUF, that op reads gate | up itself (its silu_mul
    attribute): one node and one pass over the activations less a layer."""
    (silu,) = [n for n in g.nodes if act in n.output]
    users = [n for n in g.nodes if act in n.input]
    if len(users) != 1 or users[0].op_type not in EDGE_MATMULS or users[0].input[0] != act:
        return
    users[0].input[0] = silu.input[0]
    users[0].attribute.append(helper.make_attribute("silu_mul", 1))
    g.nodes.remove(silu)


def fold_gelu_mul(g: GraphBuilder, product: str) -> None:
    """Gemma 3's GeGLU: where Split(gate_up) -> FastGelu(gate) * up feeds one MatMulQ4/Q8/GGUF, that op reads gate | up
    itself (its gelu_mul attribute, FastGelu's and Mul's roundings: csrc/silu_mul.h): three nodes a layer less."""
    (mul,) = [n for n in g.nodes if product in n.output]
    (gelu,) = [n for n in g.nodes if mul.input[0] in n.output]
    (split,) = [n for n in g.nodes if gelu.input[0] in n.output]
    users = [n for n in g.nodes if product in n.input]
    if len(users) != 1 or users[0].op_type not in EDGE_MATMULS or users[0].input[0] != product:
        return
    if split.op_type != "Split" or list(split.output) != [gelu.input[0], mul.input[1]]:
        return
    if any(sum(o in n.input for n in g.nodes) != 1 for o in split.output):
        return
    users[0].input[0] = split.input[0]
    users[0].attribute.append(helper.make_attribute("gelu_mul", 1))
    for n in (split, gelu, mul):
        g.nodes.remove(n)
