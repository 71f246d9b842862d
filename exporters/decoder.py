"""Assemble a whole decoder graph of one flavor from bound weights (DESIGN.md §4).

    input_ids ─► embed ─► [layer 0 .. L-1: norm ─► ring attention ─► + ─► norm ─► SwiGLU ─► +]
              ─► keep last `num_logits_to_keep` rows ─► final norm ─► LM head ─► logits (fp32)

Flavors differ only in how the KV cache is updated: `ort` scatters the new rows into the bound
buffer in place (opset 24 TensorScatter); `trt` (opset 21, ops TensorRT 10.3 parses) attends
[past rows, new rows] and outputs the new rows for the host to place.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from edge_runtime import __version__
from edge_runtime.models import ModelArgs, ModelWeights

from .blocks import INT64_MAX, FloatWeights, StepTensors, WeightFormat, attention, mlp, rms_norm
from .graph import GraphBuilder
from .quant_graph import quantized_format
from .quant_model import QuantizedModel


class Flavor(enum.Enum):
    ORT = "ort"
    TRT = "trt"


class Precision(enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float16 if self is Precision.FP16 else np.float32)


OPSET = {Flavor.ORT: 24, Flavor.TRT: 21}


@dataclass
class BuiltGraph:
    model: onnx.ModelProto
    flavor: Flavor
    precision: Precision
    activation_dtype: np.dtype
    io: dict[str, Any]  # the graph's I/O contract, for the manifest
    weight_dtype: str  # "fp32" | "fp16" | "int8" | "int4" (the Linear weights' storage)


def activation_dtype(flavor: Flavor, precision: Precision) -> np.dtype:
    # CPU kernels are fastest and exact in fp32; fp16 weights are widened once at session load.
    return precision.dtype if flavor is Flavor.TRT else np.dtype(np.float32)


def build_decoder(
    args: ModelArgs,
    weights: ModelWeights,
    flavor: Flavor,
    precision: Precision,
    quantized: QuantizedModel | None = None,
) -> BuiltGraph:
    """`quantized`: integer forms of `weights` (which must be `quantized.weights`), else float weights."""
    act = activation_dtype(flavor, precision)
    g = GraphBuilder("edge_runtime_decoder", OPSET[flavor], act)
    wf: WeightFormat = FloatWeights(precision.dtype)
    weight_dtype = precision.value
    if quantized is not None:
        if weights is not quantized.weights:
            raise ValueError("build_decoder: pass quantized.weights as `weights` with `quantized`")
        wf = quantized_format(
            quantized,
            trt=flavor is Flavor.TRT,
            storage=precision.dtype,
            activation=act,
            accuracy_level=quantized.config.accuracy_level,
        )
        weight_dtype = f"int{quantized.config.method.linear_bits}"
    half = args.rotary_dim // 2
    cols = "span" if flavor is Flavor.ORT else "capacity_plus_tokens"  # ort: filled prefix of the buffer

    ids = g.input("input_ids", np.int64, [1, "tokens"])
    angles = {n: g.input(n, act, ["tokens", half]) for n in ("cos", "sin", "cos_sink", "sin_sink")}
    mask = g.input("attn_mask", act, ["tokens", cols])
    sink_mask = g.input("sink_mask", np.bool_, [cols])
    keep = g.input("num_logits_to_keep", np.int64, [1])
    write_index = g.input("write_index", np.int64, [1]) if flavor is Flavor.ORT else None

    def bcast(name: str, shape: list[int]) -> str:
        return g.op("Reshape", [angles[name], g.const(shape)], f"/model/rotary/{name}_{len(shape)}d")

    q_shape, k_shape = [1, -1, 1, 1, half], [1, -1, 1, half]
    if flavor is Flavor.ORT:  # fused RotaryEmbedding reads the raw [T, R/2] inputs
        step = StepTensors(
            cos_q=angles["cos"],
            sin_q=angles["sin"],
            cos_q_sink=angles["cos_sink"],
            sin_q_sink=angles["sin_sink"],
            cos_k=angles["cos"],
            sin_k=angles["sin"],
            attn_mask=mask,
            sink_mask=sink_mask,
            write_index=write_index,
            fused_rope=True,
            span=g.op("Shape", [mask], "/model/attn_span/Shape", start=-1),  # [1]: the filled prefix
        )
    else:
        step = StepTensors(
            cos_q=bcast("cos", q_shape),
            sin_q=bcast("sin", q_shape),
            cos_q_sink=bcast("cos_sink", q_shape),
            sin_q_sink=bcast("sin_sink", q_shape),
            cos_k=bcast("cos", k_shape),
            sin_k=bcast("sin", k_shape),
            attn_mask=mask,
            sink_mask=sink_mask,
            write_index=write_index,
        )

    table = wf.table(g, "/model/embed_tokens", weights.embed)  # [V, H]
    x = wf.gather_rows(g, "/model/embed_tokens", table, ids)  # [1, T, H]
    eps = args.rms_norm_eps
    for i, lw in enumerate(weights.layers):
        p = f"/model/layers.{i}"
        h = rms_norm(g, f"{p}/input_layernorm", x, lw.attn_norm, eps)
        a = attention(
            g,
            f"{p}/attn",
            h,
            lw,
            wf,
            step,
            layer=i,
            head_dim=args.head_dim,
            rotary_dim=args.rotary_dim,
            in_place=flavor is Flavor.ORT,
        )
        x = g.op("Add", [x, a], f"{p}/attn/residual/Add")
        h = rms_norm(g, f"{p}/post_attention_layernorm", x, lw.mlp_norm, eps)
        x = g.op("Add", [x, mlp(g, f"{p}/mlp", h, lw, wf)], f"{p}/mlp/residual/Add")

    # Prefill needs logits of the last row only: slice before the norm and the (large) LM head.
    neg_keep = g.op("Neg", [keep], "/model/keep/Neg")
    x = g.op("Slice", [x, neg_keep, g.const([INT64_MAX]), g.const([1])], "/model/keep/Slice")  # [1, L, H]
    h = rms_norm(g, "/model/norm", x, weights.final_norm, eps)
    h = g.op("Reshape", [h, g.const([-1, args.hidden_size])], "/lm_head/flatten")  # [L, H]
    head = table if weights.lm_head is weights.embed else wf.table(g, "/lm_head", weights.lm_head)
    logits = wf.matmul_table(g, "/lm_head", h, head)  # [L, V]
    logits = g.op("Reshape", [logits, g.const([1, -1, args.vocab_size])], "/lm_head/unflatten")
    if act != np.float32:
        logits = g.op("Cast", [logits], "/lm_head/CastFp32", to=onnx.TensorProto.FLOAT)
    g.output(logits, "logits", np.float32, [1, "kept", args.vocab_size])

    model = g.to_model(f"edge-runtime {__version__}", doc=f"{args.model_type} decoder, flavor {flavor.value}")
    io = {
        "inputs": {vi.name: _spec(vi) for vi in g.inputs},
        "outputs": {vi.name: _spec(vi) for vi in g.outputs},
        "kv": {
            "past_key": "past_key.{i}",
            "past_value": "past_value.{i}",
            "present_key": "present_key.{i}" if flavor is Flavor.ORT else None,
            "present_value": "present_value.{i}" if flavor is Flavor.ORT else None,
            "new_key": "new_key.{i}" if flavor is Flavor.TRT else None,
            "new_value": "new_value.{i}" if flavor is Flavor.TRT else None,
            "update": "in_place_scatter" if flavor is Flavor.ORT else "host_copy",
            "layout": "[1, num_kv_heads, capacity, head_dim]",
            "attended_columns": cols,
        },
    }
    return BuiltGraph(
        model=model, flavor=flavor, precision=precision, activation_dtype=act, io=io, weight_dtype=weight_dtype
    )


def _spec(vi: onnx.ValueInfoProto) -> dict[str, Any]:
    t = vi.type.tensor_type
    dims = [d.dim_param or d.dim_value for d in t.shape.dim]
    return {"dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, "shape": dims}
