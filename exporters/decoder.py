"""Assemble a whole decoder graph of one flavor from bound weights (docs/architecture.md §5).

    input_ids ─► embed ─► [layer 0 .. L-1: norm ─► ring attention ─► + ─► norm ─► SwiGLU ─► +]
              ─► keep last `num_logits_to_keep` rows ─► final norm ─► LM head ─► logits (fp32)

`ort` (opset 24 + com.microsoft ops, blocks_ort.py) attends with GroupQueryAttention while the ring is
still a linear cache, then scatters the new rows into the bound buffer in place (TensorScatter) and
attends the whole ring with ONNX `Attention` (with --kernel edge: LinearAttention, then RingAttention);
norms, projections and RoPE run as ONNX Runtime's fused CPU kernels. `trt` (opset 21, ops TensorRT 10.3
parses, blocks.py) attends [past rows, new rows] and outputs the new rows for the host to place. Both keep
the cache [1, Hkv, capacity, D].
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx

from edge_runtime import __version__
from edge_runtime.errors import ExportError
from edge_runtime.kernels import MATMUL_GGUF, MATMUL_Q4, MATMUL_Q8
from edge_runtime.manifest import (
    BATCH_ROWS_DIM,
    KV_HEADS_FIRST,
    LINEAR_UNTIL_FULL,
    LOCAL_CAPACITY_DIM,
    NEXT_TOKEN,
    ROW_CACHE,
    WRITE_ROWS_DIM,
    KvUpdate,
)
from edge_runtime.models import LayerWeights, ModelArgs, ModelWeights, RopeKind
from edge_runtime.models.layer_plan import Sublayer, run_layers

from . import blocks_ort, graph_folds
from .blocks import INT64_MAX, FloatWeights, StepTensors, WeightFormat, attention, mlp, rms_norm
from .gguf_blocks import GGUFMatrix
from .graph import GraphBuilder, TensorSink
from .plan import Flavor, KvDtype, Precision, kv_dtype_problem
from .quant import MatMulKernel
from .quant_graph import edge_matmul, quantized_format
from .quant_model import QuantizedModel

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
    kv_dtype: KvDtype = KvDtype.FP32,
    sink: TensorSink | None = None,
) -> BuiltGraph:
    """`quantized`: integer forms of `weights` (which must be `quantized.weights`), else float weights.
    `kv_dtype`: the KV cache's element type (ExportError where the graph's attention cannot take it).
    `sink`: where each initializer's bytes go as it is made (external_data.ExternalDataWriter): the model
    then holds external-data references, not the weights."""
    problem = kv_dtype_problem(args, flavor, None if quantized is None else quantized.config, kv_dtype)
    if problem:
        raise ExportError(problem)
    act = activation_dtype(flavor, precision)
    g = GraphBuilder("edge_runtime_decoder", OPSET[flavor], act, sink)
    if flavor is Flavor.ORT:
        g.kv_dtype = kv_dtype.dtype  # trt: the activation dtype (kv_dtype_problem refuses anything else)
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
    table = wf.table(g, "/model/embed_tokens", weights.embed)  # [V, H]
    if flavor is Flavor.ORT:
        edge_ops = quantized is not None and quantized.config.kernel is MatMulKernel.EDGE
        stacked = edge_ops and _all_edge_matmul(args, weights, quantized)
        logits_2d = _ort_body(g, args, weights, wf, table, edge_ops=edge_ops, stacked=stacked)
    else:
        logits_2d = _portable_body(g, args, weights, wf, table)
    logits = g.op("Reshape", [logits_2d, g.const([1, -1, args.vocab_size])], "/lm_head/unflatten")
    if act != np.float32:
        logits = g.op("Cast", [logits], "/lm_head/CastFp32", to=onnx.TensorProto.FLOAT)
    g.output(logits, "logits", np.float32, [1, "kept", args.vocab_size])
    _fused_argmax(g, logits_2d)

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
            "update": (KvUpdate.IN_PLACE_SCATTER if flavor is Flavor.ORT else KvUpdate.HOST_COPY).value,
            "layout": KV_HEADS_FIRST,
            "attended_columns": LINEAR_UNTIL_FULL if flavor is Flavor.ORT else "capacity_plus_tokens",
            # the buffers the runtime allocates (manifest.KV_DTYPES): trt's are its activation dtype
            "dtype": kv_dtype.manifest_dtype if flavor is Flavor.ORT else g.kv_dtype.name,
        },
    }
    return BuiltGraph(
        model=model, flavor=flavor, precision=precision, activation_dtype=act, io=io, weight_dtype=weight_dtype
    )


def _spec(vi: onnx.ValueInfoProto) -> dict[str, Any]:
    t = vi.type.tensor_type
    dims = [d.dim_param or d.dim_value for d in t.shape.dim]
    return {"dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, "shape": dims}


def _keep_rows(g: GraphBuilder, x: str) -> str:
    """Prefill needs logits of the last rows only: slice before the (large) LM head. x [1, T, H] -> [1, L, H]."""
    keep = g.input("num_logits_to_keep", np.int64, [1])
    neg_keep = g.op("Neg", [keep], "/model/keep/Neg")
    return g.op("Slice", [x, neg_keep, g.const([INT64_MAX]), g.const([1])], "/model/keep/Slice")


EDGE_HEADS = (MATMUL_Q4, MATMUL_Q8, MATMUL_GGUF)  # the edge ops whose optional second output is each row's argmax


def _fused_argmax(g: GraphBuilder, logits_2d: str) -> None:
    """Where the LM head is a MatMulQ4, MatMulQ8 or MatMulGGUF, its optional argmax output becomes graph output
    `next_token`
    [1, kept, 1] int64 (numpy.argmax of each kept row's logits): greedy decoding reads it instead of
    scanning the logits, which another core just wrote (csrc/matmul_op.c)."""
    head = next((n for n in g.nodes if n.op_type in EDGE_HEADS and n.output[0] == logits_2d), None)
    if head is None:
        return
    head.output.append(f"{head.name}/argmax")  # [L, 1]
    token = g.op("Reshape", [head.output[1], g.const([1, -1, 1])], "/lm_head/argmax/unflatten")
    g.output(token, NEXT_TOKEN, np.int64, [1, "kept", 1])


def _lm_head(g: GraphBuilder, args: ModelArgs, weights: ModelWeights, wf: WeightFormat, table: str, h: str) -> str:
    h = g.op("Reshape", [h, g.const([-1, args.hidden_size])], "/lm_head/flatten")  # [L, H]
    head = table if weights.lm_head is weights.embed else wf.table(g, "/lm_head", weights.lm_head)
    return wf.matmul_table(g, "/lm_head", h, head)  # [L, V]


# ------------------------------------------------------------------------------------------------
#  `ort`: ids ─► embed ─► norm ─► [attn ─► skip-norm ─► mlp ─► skip-norm(next layer's / final weight)]
#                                                           ─► keep last rows ─► LM head
# Each residual add is fused into the following RMSNorm (SkipSimplifiedLayerNormalization).
# ------------------------------------------------------------------------------------------------
def _all_edge_matmul(args: ModelArgs, weights: ModelWeights, quantized: QuantizedModel) -> bool:
    """Every layer product runs MatMulQ4, MatMulQ8 or MatMulGGUF. MatMulNBits reading outer-scope weights inside an
    If branch ran ~15% slower (a chain of 1B-shaped matrices), and a decoder-wide If over 8-bit MatMulNBits
    layers decoded 2.6% slower than per-layer Ifs (135M int8, scripts/ab_decode.py, 8 rounds)."""
    c = quantized.config
    if c.kernel is not MatMulKernel.EDGE or c.accuracy_level == 0:
        return False
    for lw in weights.layers:
        for f in ("q", "k", "v", "o", "gate", "up", "down"):
            qm = quantized.lookup(getattr(lw, f))
            if qm is None or (
                not isinstance(qm, GGUFMatrix)
                and (qm.zeros is not None or not edge_matmul(qm.bits, qm.per_channel, qm.block, qm.shape[1]))
            ):
                return False
    return True


def _ort_body(
    g: GraphBuilder,
    args: ModelArgs,
    weights: ModelWeights,
    wf: WeightFormat,
    table: str,
    *,
    edge_ops: bool,
    stacked: bool,
) -> str:
    """`edge_ops`: the graph may use edge-runtime's own ops (--kernel edge); `stacked`: every layer product is an
    edge op, so the layers go in once with RingAttention switching by fill (or, where RingAttention does not take
    the heads, inside one If around every layer) instead of one If per layer."""
    half = args.rotary_dim // 2
    ids = g.input("input_ids", np.int64, [1, "tokens"])
    cos, sin, cos_s, sin_s = (g.input(n, g.dtype, ["tokens", half]) for n in ("cos", "sin", "cos_sink", "sin_sink"))
    mask = g.input("attn_mask", g.dtype, ["tokens", "capacity"])
    sink_rows = g.input("sink_rows", np.int64, [1])  # S, at least 1 (ring.RingGeometry.sink_rows)
    step = blocks_ort.OrtStep(
        cos=cos,
        sin=sin,
        cos_sink=cos_s,
        sin_sink=sin_s,
        attn_mask=mask,
        sink_rows=sink_rows,
        write_index=g.input("write_index", np.int64, [WRITE_ROWS_DIM]),
    )
    if edge_ops and blocks_ort.ring_attention_can_run(args.head_dim, args.rotary_dim):
        # Every layer's full-ring attention is one RingAttention node, which takes a batch of caches: one row per
        # sequence (edge-serve's batched decode), each at its own write row. Empty: the call is one cache's.
        step = replace(step, row_cache=g.input(ROW_CACHE, np.int64, [BATCH_ROWS_DIM]))
    else:
        # the general path's sink term (RingAttention rotates the sink query itself)
        scale = g.const(np.array(args.softmax_scale, g.dtype))
        capacity = g.op("Shape", [mask], "/model/capacity/Shape", start=-1)  # [1]: C
        pad_cols = g.op("Sub", [capacity, sink_rows], "/model/sink_pad/Sub")
        step = replace(
            step,
            dcos=g.op("Mul", [g.op("Sub", [cos_s, cos], "/model/rotary/dcos/Sub"), scale], "/model/rotary/dcos/Mul"),
            dsin=g.op("Mul", [g.op("Sub", [sin_s, sin], "/model/rotary/dsin/Sub"), scale], "/model/rotary/dsin/Mul"),
            sink_pad=g.op("Concat", [g.const([0, 0, 0, 0, 0, 0, 0]), pad_cols], "/model/sink_pad/Concat", axis=0),
        )
    if blocks_ort.gqa_can_run(args.head_dim, args.rotary_dim):  # else no layer reads these
        step = replace(
            step,
            ring_full=g.input("ring_full", np.bool_, []),
            seqlens_k=g.input("seqlens_k", np.int32, [1]),
            total_len=g.input("total_sequence_length", np.int32, []),
            cos_cache=g.input("cos_cache", g.dtype, ["capacity", half]),
            sin_cache=g.input("sin_cache", g.dtype, ["capacity", half]),
        )
    local = None
    if args.local_layers:  # their own RoPE and window mask, no sink term
        cos_l, sin_l = (g.input(n, g.dtype, ["tokens", half]) for n in ("cos_local", "sin_local"))
        local = replace(
            step,
            cos=cos_l,
            sin=sin_l,
            cos_sink=cos_l,
            sin_sink=sin_l,
            attn_mask=g.input("attn_mask_local", g.dtype, ["tokens", LOCAL_CAPACITY_DIM]),
            write_index=g.input("write_index_local", np.int64, [WRITE_ROWS_DIM]),
            dcos=None,
            dsin=None,
            sink_pad=None,
            local=True,
        )
    steps = {RopeKind.GLOBAL: step} | ({RopeKind.LOCAL: local} if local else {})
    if args.nope_layers:
        steps[RopeKind.NONE] = _unrotated(g, step)
    x = _embed(g, args, wf, table, ids)
    if stacked and step.ring_full is not None and _switch_by_fill(args):
        # RingAttention takes every layer's shapes: one node a layer at every fill, no If (_stacked_layers says why)
        h, _ = _ort_layers(g, args, weights, wf, steps, x, linear=None, edge_ops=True, by_fill=True)
        graph_folds.fold_norms(g, outputs={h})
        return _lm_head(g, args, weights, wf, table, _keep_rows(g, h))
    if stacked and step.ring_full is not None:
        h = _stacked_layers(g, args, weights, wf, steps, x)
        return _lm_head(g, args, weights, wf, table, _keep_rows(g, h))
    h, _ = _ort_layers(g, args, weights, wf, steps, x, linear=None, edge_ops=edge_ops)
    return _lm_head(g, args, weights, wf, table, _keep_rows(g, h))


def _angle_zero(g: GraphBuilder, like: str, name: str) -> tuple[str, str]:
    """(cos, sin) of angle 0 shaped as `like`: rotation tables that leave q and k exactly as they are."""
    shape = g.op("Shape", [like], f"/model/rotary_none/{name}/Shape")
    return tuple(  # type: ignore[return-value]
        g.op("Expand", [g.const(np.array(v, g.dtype)), shape], f"/model/rotary_none/{name}_{f}/Expand")
        for v, f in ((1, "cos"), (0, "sin"))
    )


def _unrotated(g: GraphBuilder, step: blocks_ort.OrtStep) -> blocks_ort.OrtStep:
    """The step of layers without RoPE (ModelArgs.nope_layers): every rotation table at angle 0, once per call."""
    one, zero = _angle_zero(g, step.cos, "tokens")
    cache = _angle_zero(g, step.cos_cache, "cache") if step.cos_cache is not None else (None, None)
    return replace(
        step, cos=one, sin=zero, cos_sink=one, sin_sink=zero, cos_cache=cache[0], sin_cache=cache[1],
        dcos=None if step.dcos is None else zero, dsin=None if step.dsin is None else zero,
    )  # fmt: skip


def _embed(g: GraphBuilder, args: ModelArgs, wf: WeightFormat, table: str, ids: str) -> str:
    x = wf.gather_rows(g, "/model/embed_tokens", table, ids)  # [1, T, H]
    if args.embed_scale != 1.0:  # not folded into the table: a tied LM head reads it unscaled
        x = g.op("Mul", [x, g.const(np.array(args.embed_scale, g.dtype))], "/model/embed_tokens/scale")
    return x


@dataclass
class _OrtLowering:
    """models.layer_plan's steps as `ort` nodes. A residual add is not a node of its own: the block's output
    waits in `delta` and the next norm (SkipSimplifiedLayerNormalization) adds it; `kv` collects each
    attention's present keys and values (a branch of the decoder-wide If outputs them)."""

    g: GraphBuilder
    args: ModelArgs
    wf: WeightFormat
    steps: dict[RopeKind, blocks_ort.OrtStep]  # by the layers' rotation (the local ones' also their own ring)
    linear: bool | None
    edge_ops: bool
    by_fill: bool = False
    delta: str | None = None
    kv: list[str] = field(default_factory=list)

    def norm(self, layer: int, sub: Sublayer, x: str) -> tuple[str, str]:
        prefix = f"/model/layers.{layer}/{sub.norm_name}"
        return blocks_ort.skip_norm(self.g, prefix, x, self.delta, sub.norm, self.args.rms_norm_eps)

    def attention(self, layer: int, lw: LayerWeights, h: str) -> str:
        a = self.args
        step = self.steps[a.rope_kind(layer)]
        out, k, v = blocks_ort.attention(
            self.g, f"/model/layers.{layer}/attn", h, lw, self.wf, step, layer=layer, head_dim=a.head_dim,
            rotary_dim=a.rotary_dim, linear=self.linear, edge_ops=self.edge_ops, by_fill=self.by_fill,
            eps=a.rms_norm_eps, scale=a.softmax_scale,
        )  # fmt: skip
        self.kv += [k, v]
        return out

    def mlp(self, layer: int, lw: LayerWeights, h: str) -> str:
        prefix = f"/model/layers.{layer}/mlp"
        return blocks_ort.mlp(self.g, prefix, h, lw, self.wf, silu_mul=self.edge_ops, activation=self.args.activation)

    def post_norm(self, layer: int, sub: Sublayer, y: str) -> str:
        assert sub.post_norm is not None  # run_layer calls it only where the layer has one
        prefix = f"/model/layers.{layer}/{sub.post_norm_name}"
        return blocks_ort.skip_norm(self.g, prefix, y, None, sub.post_norm, self.args.rms_norm_eps)[0]

    def residual(self, layer: int, sub: Sublayer, x: str, y: str) -> str:
        self.delta = y
        return x


@dataclass
class _PortableLowering:
    """models.layer_plan's steps as the portable graph's standard ops (`trt`)."""

    g: GraphBuilder
    args: ModelArgs
    wf: WeightFormat
    step: StepTensors
    unrotated: StepTensors | None = None  # the NoPE layers' (ModelArgs.nope_layers)

    def norm(self, layer: int, sub: Sublayer, x: str) -> tuple[str, str]:
        return rms_norm(self.g, f"/model/layers.{layer}/{sub.norm_name}", x, sub.norm, self.args.rms_norm_eps), x

    def attention(self, layer: int, lw: LayerWeights, h: str) -> str:
        a = self.args
        step = self.unrotated if a.rope_kind(layer) is RopeKind.NONE and self.unrotated else self.step
        return attention(
            self.g, f"/model/layers.{layer}/attn", h, lw, self.wf, step, layer=layer, head_dim=a.head_dim,
            rotary_dim=a.rotary_dim, eps=a.rms_norm_eps, scale=a.softmax_scale, local=a.is_local(layer),
        )  # fmt: skip

    def mlp(self, layer: int, lw: LayerWeights, h: str) -> str:
        return mlp(self.g, f"/model/layers.{layer}/mlp", h, lw, self.wf, self.args.activation)

    def post_norm(self, layer: int, sub: Sublayer, y: str) -> str:
        assert sub.post_norm is not None
        prefix = f"/model/layers.{layer}/{sub.post_norm_name}"
        return rms_norm(self.g, prefix, y, sub.post_norm, self.args.rms_norm_eps)

    def residual(self, layer: int, sub: Sublayer, x: str, y: str) -> str:
        return self.g.op("Add", [x, y], f"/model/layers.{layer}/{sub.block.value}/residual/Add")


def _ort_layers(
    g: GraphBuilder,
    args: ModelArgs,
    weights: ModelWeights,
    wf: WeightFormat,
    steps: dict[RopeKind, blocks_ort.OrtStep],
    x: str,
    *,
    linear: bool | None,
    edge_ops: bool,
    by_fill: bool = False,
) -> tuple[str, list[str]]:
    """The `ort` layer loop, for the whole graph (`linear` None: each layer's own If, or with `by_fill` none:
    RingAttention switching by fill) or one branch of the decoder-wide If (`linear` True/False): (the final
    norm's output, [keys, values] per layer in a branch). `steps`: each kind of layer's step (_ort_body)."""
    lowering = _OrtLowering(g, args, wf, steps, linear=linear, edge_ops=edge_ops, by_fill=by_fill)
    x = run_layers(lowering, weights.layers, x)
    h, _ = blocks_ort.skip_norm(g, "/model/norm", x, lowering.delta, weights.final_norm, args.rms_norm_eps)
    return h, lowering.kv if linear is not None else []


# ------------------------------------------------------------------------------------------------
#  `ort` with edge-runtime's ops, every layer product theirs (_all_edge_matmul):
#
#    where RingAttention takes the shapes (head size <= 512): no If at all. Each global layer's RingAttention
#    also takes ring_full, seqlens_k and the rotary cache and computes as LinearAttention while the ring is
#    linear (csrc/ring_attention_op.c), so the graph is one layer stack at every fill.
#
#    else one If on ring_full around every layer instead of one per layer:
#    x ─► If ring_full ─┬ then: layers 0..L-1 with the general ring path ─┬─► h (final norm), present_*
#                       └ else: layers 0..L-1 with LinearAttention ───────┘
#
#  Without the If the graph holds each layer once instead of twice: on Gemma 3 270M Q4_K_M its session opens in
#  48 ms instead of 85 and holds 3.9 MB less; its decode steps were not measurably faster in an interleaved A/B
#  (docs/decisions/ring-attention-by-fill.md). Both branches of the If read the same outer-scope weights (one
#  copy); graphs with MatMulNBits layers keep per-layer Ifs (measured slower otherwise: _all_edge_matmul).
# ------------------------------------------------------------------------------------------------
def _switch_by_fill(args: ModelArgs) -> bool:
    """Every global layer's attention is one RingAttention that switches to LinearAttention's computation while
    the ring is linear (no If): where RingAttention takes the shapes."""
    return blocks_ort.ring_attention_can_run(args.head_dim, args.rotary_dim)


def _stacked_layers(
    g: GraphBuilder,
    args: ModelArgs,
    weights: ModelWeights,
    wf: WeightFormat,
    steps: dict[RopeKind, blocks_ort.OrtStep],
    x: str,
) -> str:
    present = []
    for i, lw in enumerate(weights.layers):
        hkv = lw.num_kv_heads(args.head_dim)
        batched = steps[RopeKind.GLOBAL].row_cache is not None
        present += blocks_ort.cache_io(g, i, hkv, args.head_dim, local=args.is_local(i), batched=batched)[2]
    bodies = {}
    for side, linear in (("then", False), ("else", True)):
        b = g.branch(f"/model/ring_full/{side}", scope=f"/ring_full/{side}")
        h, kv = _ort_layers(b, args, weights, wf, steps, x, linear=linear, edge_ops=True)
        graph_folds.fold_norms(b, outputs={h, *kv})
        bodies[side] = b.to_graph(blocks_ort.branch_outputs(g, (h, *kv)))
    outs = g.op_multi(
        "If",
        [steps[RopeKind.GLOBAL].ring_full],
        "/model/ring_full/If",
        n_out=1 + len(present),
        outs=["/model/layers/output", *present],
        then_branch=bodies["then"],
        else_branch=bodies["else"],
    )
    return outs[0]  # [1, T, H], after the final norm


def _portable_body(g: GraphBuilder, args: ModelArgs, weights: ModelWeights, wf: WeightFormat, table: str) -> str:
    """`trt`: standard ops TensorRT 10.3 parses; attends [buffer rows, new rows], outputs the new rows."""
    half = args.rotary_dim // 2
    cols = "capacity_plus_tokens"
    ids = g.input("input_ids", np.int64, [1, "tokens"])
    angles = {n: g.input(n, g.dtype, ["tokens", half]) for n in ("cos", "sin", "cos_sink", "sin_sink")}

    def bcast(name: str, shape: list[int]) -> str:
        return g.op("Reshape", [angles[name], g.const(shape)], f"/model/rotary/{name}_{len(shape)}d")

    q_shape, k_shape = [1, -1, 1, 1, half], [1, -1, 1, half]
    step = StepTensors(
        cos_q=bcast("cos", q_shape),
        sin_q=bcast("sin", q_shape),
        cos_q_sink=bcast("cos_sink", q_shape),
        sin_q_sink=bcast("sin_sink", q_shape),
        cos_k=bcast("cos", k_shape),
        sin_k=bcast("sin", k_shape),
        attn_mask=g.input("attn_mask", g.dtype, ["tokens", cols]),
        sink_mask=g.input("sink_mask", np.bool_, [cols]),
    )
    if args.local_layers:  # their own RoPE at absolute positions and their window's mask
        angles |= {n: g.input(n, g.dtype, ["tokens", half]) for n in ("cos_local", "sin_local")}
        step = replace(
            step,
            cos_q_local=bcast("cos_local", q_shape),
            sin_q_local=bcast("sin_local", q_shape),
            cos_k_local=bcast("cos_local", k_shape),
            sin_k_local=bcast("sin_local", k_shape),
            attn_mask_local=g.input("attn_mask_local", g.dtype, ["tokens", f"{LOCAL_CAPACITY_DIM}_plus_tokens"]),
        )
    unrotated = None
    if args.nope_layers:
        angles["cos_none"], angles["sin_none"] = _angle_zero(g, angles["cos"], "tokens")
        cos_q, sin_q = bcast("cos_none", q_shape), bcast("sin_none", q_shape)
        unrotated = replace(step, cos_q=cos_q, sin_q=sin_q, cos_q_sink=cos_q, sin_q_sink=sin_q,
                            cos_k=bcast("cos_none", k_shape), sin_k=bcast("sin_none", k_shape))  # fmt: skip
    lowering = _PortableLowering(g, args, wf, step, unrotated)
    x = run_layers(lowering, weights.layers, _embed(g, args, wf, table, ids))
    h = rms_norm(g, "/model/norm", _keep_rows(g, x), weights.final_norm, args.rms_norm_eps)
    return _lm_head(g, args, weights, wf, table, h)
