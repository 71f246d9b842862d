"""The uniform contract every architecture file fills in: typed args, RoPE settings, weight names.

An architecture file (`llama.py`, `qwen2.py`, ...) declares an `Architecture`: a `parse(config) ->
ModelArgs` function and the Hugging Face tensor names of its weights. Everything else (loading,
the reference forward, graph building) is generic over these and never branches on `model_type`.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_runtime.errors import ConfigError, WeightMappingError

from .gguf_layout import GGUFLayout

ROPE_TYPES = ("default", "linear", "llama3")


class Activation(enum.Enum):
    """The gated MLP's activation: SwiGLU's SiLU (Llama family) or GeGLU's tanh-approximated GELU (Gemma)."""

    SILU = "silu"
    GELU_TANH = "gelu_pytorch_tanh"


class RopeKind(enum.Enum):
    """Which rotation a layer's attention applies to q and k."""

    GLOBAL = "global"  # the model's RoPE (`ModelArgs.rope`)
    LOCAL = "local"  # a local layer's own (`ModelArgs.local_rope`, Gemma 3)
    NONE = "none"  # no position rotation (SmolLM3's NoPE layers): every forward rotates by angle 0


# ---------------------------------------------------------------------------------------------
# config.json readers: one place that type-checks and names the offending key
# ---------------------------------------------------------------------------------------------


def req_int(cfg: dict[str, Any], key: str) -> int:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"config.json: required key '{key}' is missing; it must be a positive integer")
    return _as_int(cfg, key)


def opt_int(cfg: dict[str, Any], key: str, default: int | None) -> int | None:
    return default if cfg.get(key) is None else _as_int(cfg, key)


def opt_float(cfg: dict[str, Any], key: str, default: float) -> float:
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"config.json: '{key}' = {value!r} must be a finite number")
    return float(value)


def opt_bool(cfg: dict[str, Any], key: str, default: bool) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"config.json: '{key}' = {value!r} must be true or false")
    return value


def _as_int(cfg: dict[str, Any], key: str) -> int:
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"config.json: '{key}' = {value!r} must be a positive integer")
    return value


def _token_ids(value: Any, key: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ConfigError(f"config.json: '{key}' = {value!r} must be a token id or a list of token ids")
    return tuple(values)


def check_in_vocab(ids: tuple[int, ...], vocab_size: int, what: str) -> None:
    """A special token id the model cannot produce (EOS) or embed (BOS) would never stop a generation, or
    fail in the graph's Gather at run time: refuse it at export."""
    outside = [i for i in ids if i >= vocab_size]
    if outside:
        raise ConfigError(f"{what} = {outside[0]} is outside the vocabulary (vocab_size {vocab_size})")


# ---------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding settings, normalised from either config vintage.

    transformers >= 5 writes `rope_parameters` (with `rope_theta` inside); older configs use
    top-level `rope_theta` and `rope_scaling` ({"type"|"rope_type": ...}).
    """

    theta: float = 10000.0
    rope_type: str = "default"  # one of ROPE_TYPES
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    partial_rotary_factor: float = 1.0

    def rotary_dim(self, head_dim: int) -> int:
        dim = int(head_dim * self.partial_rotary_factor)
        return dim - dim % 2

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """[rotary_dim // 2] float64 angular frequencies, scaling applied (matches transformers)."""
        dim = self.rotary_dim(head_dim)
        inv = 1.0 / (self.theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        if self.rope_type == "linear":
            return inv / self.factor
        if self.rope_type == "llama3":
            low_wavelen = self.original_max_position / self.low_freq_factor
            high_wavelen = self.original_max_position / self.high_freq_factor
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > low_wavelen, inv / self.factor, inv)
            smooth = (self.original_max_position / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            return np.where(medium, smoothed, scaled)
        return inv


def parse_rope(cfg: dict[str, Any]) -> RopeConfig:
    params = cfg.get("rope_parameters")
    if params is None:
        params = dict(cfg.get("rope_scaling") or {})
    if not isinstance(params, dict):
        raise ConfigError(f"config.json: 'rope_parameters' = {params!r} must be an object")
    if params.get("rope_theta") is None:  # transformers falls back to the top-level key too
        params = {**params, "rope_theta": cfg.get("rope_theta")}
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in ROPE_TYPES:
        raise ConfigError(
            f"config.json: RoPE scaling type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
        )
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    rope = RopeConfig(
        theta=opt_float(params, "rope_theta", 10000.0),
        rope_type=rope_type,
        factor=opt_float(params, "factor", 1.0),
        low_freq_factor=opt_float(params, "low_freq_factor", 1.0),
        high_freq_factor=opt_float(params, "high_freq_factor", 4.0),
        original_max_position=opt_int(params, "original_max_position_embeddings", 8192) or 8192,
        partial_rotary_factor=opt_float({"p": partial}, "p", 1.0),
    )
    if rope_type != "default" and rope.factor <= 0:
        raise ConfigError(f"config.json: RoPE scaling factor {rope.factor} must be > 0")
    if not 0 < rope.partial_rotary_factor <= 1:
        raise ConfigError(f"config.json: 'partial_rotary_factor' = {partial!r} must be in (0, 1]")
    if rope_type == "llama3" and rope.high_freq_factor <= rope.low_freq_factor:
        raise ConfigError("config.json: llama3 RoPE needs high_freq_factor > low_freq_factor")
    return rope


# ---------------------------------------------------------------------------------------------
# Typed model arguments
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelArgs:
    """Everything the exporter needs to know about a decoder, parsed once from `config.json`.

    Widths here are the checkpoint's nominal ones; a pruned model's per-layer widths are read from
    its weight shapes (see `LayerWeights`).
    """

    model_type: str  # as written in config.json (e.g. "mistral")
    arch: str  # the architecture file that handles it (e.g. "llama")
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each head's q and k before RoPE (Qwen3, Gemma 3)
    activation: Activation = Activation.SILU
    embed_scale: float = 1.0  # the embedding rows are multiplied by it (Gemma: sqrt(hidden)); the LM head is not
    attn_scale: float | None = None  # softmax scale of q.k; None: 1/sqrt(head_dim)
    sandwich_norms: bool = False  # a norm on the attention and on the MLP output before each residual add (Gemma)
    # Layers that attend only their last `local_window` tokens, with their own RoPE (Gemma 3's sliding layers).
    local_layers: tuple[int, ...] = ()
    local_window: int | None = None
    local_rope: RopeConfig | None = None
    # Global layers without RoPE (SmolLM3's NoPE layers). Their attention is the same ops fed cos 1, sin 0,
    # which leave q and k exactly as they are, so no forward has a second attention path.
    nope_layers: tuple[int, ...] = ()
    sliding_window: int | None = None  # attention span in tokens (Mistral); None = full causal
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def rotary_dim(self) -> int:
        return self.rope.rotary_dim(self.head_dim)

    @property
    def softmax_scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)

    def is_local(self, layer: int) -> bool:
        return layer in self.local_layers

    def __post_init__(self) -> None:
        both = sorted(set(self.local_layers) & set(self.nope_layers))
        if both:  # the local layers' step carries their own rotation and ring: one kind per layer
            raise ConfigError(f"config.json: layers {both} are both local (sliding-window) and without RoPE")

    def rope_kind(self, layer: int) -> RopeKind:
        if layer in self.nope_layers:
            return RopeKind.NONE
        return RopeKind.LOCAL if self.is_local(layer) else RopeKind.GLOBAL


def parse_common(cfg: dict[str, Any], *, arch: str, **flags: Any) -> ModelArgs:
    """The keys shared by the Llama family; `flags` are the arch file's own (bias, window ...)."""
    if "activation" not in flags:
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ConfigError(f"config.json: 'hidden_act' = {act!r} is not supported; supported: silu")
    hidden = req_int(cfg, "hidden_size")
    heads = req_int(cfg, "num_attention_heads")
    kv_heads = opt_int(cfg, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise ConfigError(
            f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    head_dim = opt_int(cfg, "head_dim", None)
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(
                f"config.json: hidden_size {hidden} is not divisible by num_attention_heads {heads}; set 'head_dim'"
            )
        head_dim = hidden // heads
    bos = _token_ids(cfg.get("bos_token_id"), "bos_token_id")
    eps = opt_float(cfg, "rms_norm_eps", 1e-6)
    if eps < 0:  # ONNX Runtime refuses the graph deep in session creation; say why here
        raise ConfigError(f"config.json: 'rms_norm_eps' = {eps!r} must be 0 or more")
    vocab = req_int(cfg, "vocab_size")
    eos = _token_ids(cfg.get("eos_token_id"), "eos_token_id")
    for key, ids in (("bos_token_id", bos), ("eos_token_id", eos)):
        check_in_vocab(ids, vocab, f"config.json: '{key}'")
    return ModelArgs(
        model_type=str(cfg.get("model_type")),
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=req_int(cfg, "intermediate_size"),
        num_layers=req_int(cfg, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=eps,
        rope=parse_rope(cfg),
        tie_word_embeddings=opt_bool(cfg, "tie_word_embeddings", False),
        max_position_embeddings=opt_int(cfg, "max_position_embeddings", 2048) or 2048,
        bos_token_id=bos[0] if bos else None,
        eos_token_ids=eos,
        **flags,
    )


# ---------------------------------------------------------------------------------------------
# Weights: names in the checkpoint -> typed arrays, consuming every tensor
# ---------------------------------------------------------------------------------------------


@dataclass
class LayerWeights:
    """One decoder layer, in Hugging Face layout: Linear weights are [out, in]."""

    attn_norm: np.ndarray  # [H]
    q: np.ndarray  # [Hq*D, H]
    k: np.ndarray  # [Hkv*D, H]
    v: np.ndarray  # [Hkv*D, H]
    o: np.ndarray  # [H, Hq*D]
    mlp_norm: np.ndarray  # [H]
    gate: np.ndarray  # [I, H]
    up: np.ndarray  # [I, H]
    down: np.ndarray  # [H, I]
    q_bias: np.ndarray | None = None  # [Hq*D]
    k_bias: np.ndarray | None = None  # [Hkv*D]
    v_bias: np.ndarray | None = None  # [Hkv*D]
    o_bias: np.ndarray | None = None  # [H]
    gate_bias: np.ndarray | None = None  # [I]
    up_bias: np.ndarray | None = None  # [I]
    down_bias: np.ndarray | None = None  # [H]
    q_norm: np.ndarray | None = None  # [D], shared by every query head
    k_norm: np.ndarray | None = None  # [D], shared by every KV head
    post_attn_norm: np.ndarray | None = None  # [H], on the attention output before the residual add
    post_mlp_norm: np.ndarray | None = None  # [H], on the MLP output before the residual add

    def num_heads(self, head_dim: int) -> int:
        return self.q.shape[0] // head_dim

    def num_kv_heads(self, head_dim: int) -> int:
        return self.k.shape[0] // head_dim


def _same(a: Any) -> Any:
    return a


@dataclass(frozen=True)
class WeightFolds:
    """Rewrites of a checkpoint's weights into the generic blocks' conventions, exact in real arithmetic:
    Gemma's (1 + w) norms become w' = 1 + w, Granite's residual and logit multipliers fold into o_proj,
    down_proj and the final norm. Applied to each layer as it is read (the layers stay lazy, one in memory
    at a time) and to the final norm once; the embedding table and LM head are never rewritten (a tied
    head reads the table as stored)."""

    layer: Callable[[LayerWeights], LayerWeights] = _same
    final_norm: Callable[[np.ndarray], np.ndarray] = _same
    # `layer` rewrites Linear weights (not only norms): a GGUF's codes for them cannot be kept as stored
    linear: bool = False


@dataclass
class ModelWeights:
    embed: np.ndarray  # [V, H]
    final_norm: np.ndarray  # [H]
    lm_head: np.ndarray  # [V, H]; the same array as `embed` when tied
    layers: list[LayerWeights] = field(default_factory=list)


_BIAS_FLAGS = {
    "qkv_bias": ("q_bias", "k_bias", "v_bias"),
    "o_bias": ("o_bias",),
    "mlp_bias": ("gate_bias", "up_bias", "down_bias"),
}


@dataclass(frozen=True)
class WeightNames:
    """HF tensor-name templates; `{i}` is the layer index. `ignore` matches buffers to skip."""

    embed: str
    final_norm: str
    lm_head: str
    layer: dict[str, str]  # LayerWeights field -> template
    ignore: tuple[str, ...] = ()  # regexes of tensors that carry no weights (e.g. old inv_freq buffers)

    def bind(self, args: ModelArgs, names: Collection[str], load: Callable[[str], np.ndarray]) -> ModelWeights:
        """Load every weight `args` calls for; every tensor in `names` must be used or ignorable."""
        available = set(names)
        used: set[str] = set()

        def take(name: str) -> np.ndarray:
            if name not in available:
                raise WeightMappingError(
                    f"checkpoint has no tensor '{name}', which a {args.model_type} model with this config needs"
                )
            used.add(name)
            return load(name)

        wanted = {"attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down"}
        for flag, fields in _BIAS_FLAGS.items():
            if getattr(args, flag):
                wanted.update(fields)
        if args.qk_norm:
            wanted.update(("q_norm", "k_norm"))
        if args.sandwich_norms:
            wanted.update(("post_attn_norm", "post_mlp_norm"))
        layers = [
            LayerWeights(**{f: take(t.format(i=i)) for f, t in self.layer.items() if f in wanted})
            for i in range(args.num_layers)
        ]
        embed = take(self.embed)
        if args.tie_word_embeddings:
            lm_head = embed
            used.add(self.lm_head)  # some exporters save the tied copy too; transformers ignores it
        else:
            lm_head = take(self.lm_head)
        weights = ModelWeights(embed=embed, final_norm=take(self.final_norm), lm_head=lm_head, layers=layers)

        leftover = sorted(n for n in available - used if not any(re.fullmatch(p, n) for p in self.ignore))
        if leftover:
            more = f" and {len(leftover) - 5} more" if len(leftover) > 5 else ""
            raise WeightMappingError(
                f"checkpoint tensor(s) {', '.join(repr(n) for n in leftover[:5])}{more} are not used by the "
                f"{args.model_type} weight map; the config and the weights disagree (wrong model_type or layer count?)"
            )
        check_shapes(args, weights, self)
        return weights


def check_shapes(args: ModelArgs, w: ModelWeights, names: WeightNames) -> None:
    """Every tensor's shape against the config, before any tensor is read (`w` may hold memory-mapped or
    broadcast placeholders: shapes only). Every layer must have the config's widths: a config that misstates
    one, e.g. head_dim 64 over weights of head_dim 32 whose row counts still divide by 64, would otherwise
    export a bundle whose graph and float64 reference make the same misreading, pass validation and print
    garbage. The tensors that fix a width (embedding: hidden and vocabulary; q_proj: head_dim or the query
    heads; k_proj: the KV heads; gate_proj: the MLP) name the config key, its value and what the weights say."""
    h, d, v = args.hidden_size, args.head_dim, args.vocab_size
    hq, hkv, inter = args.num_heads, args.num_kv_heads, args.intermediate_size

    def shape_of(arr: np.ndarray) -> str:
        return "[" + ", ".join(str(n) for n in arr.shape) + "]"

    def disagree(key: str, value: int, name: str, arr: np.ndarray, says: str) -> WeightMappingError:
        return WeightMappingError(
            f"config.json: {key} = {value} disagrees with the weights: '{name}' is {shape_of(arr)}, which means {says}"
        )

    def expect(name: str, arr: np.ndarray, shape: tuple[int, ...]) -> None:
        if tuple(arr.shape) != shape:
            raise WeightMappingError(f"tensor '{name}' has shape {tuple(arr.shape)}, expected {shape} from config.json")

    if w.embed.ndim == 2 and w.embed.shape[1] != h:
        raise disagree("hidden_size", h, names.embed, w.embed, f"hidden_size {w.embed.shape[1]}")
    if w.embed.ndim == 2 and w.embed.shape[0] != v:
        raise disagree("vocab_size", v, names.embed, w.embed, f"vocab_size {w.embed.shape[0]}")
    expect(names.embed, w.embed, (v, h))
    expect(names.final_norm, w.final_norm, (h,))
    if not args.tie_word_embeddings:
        expect(names.lm_head, w.lm_head, (v, h))
    for i, lw in enumerate(w.layers):

        def n(f: str, i: int = i) -> str:
            return names.layer[f].format(i=i)

        q_rows, k_rows = (lw.q.shape[0], lw.k.shape[0]) if lw.q.ndim == lw.k.ndim == 2 else (-1, -1)
        if q_rows > 0 and lw.q.shape[1] == h and q_rows != hq * d:
            # Either head_dim or the head count is wrong; a q_norm (one head's width) or k_proj's rows
            # (at the same head_dim) say which.
            dim_right = lw.q_norm is not None and lw.q_norm.shape == (d,)
            if not dim_right and q_rows % hq == 0 and (k_rows <= 0 or k_rows == hkv * (q_rows // hq)):
                raise disagree("head_dim", d, n("q"), lw.q, f"head_dim {q_rows // hq} with num_attention_heads {hq}")
            if q_rows % d == 0:
                raise disagree("num_attention_heads", hq, n("q"), lw.q, f"{q_rows // d} query heads of head_dim {d}")
            raise disagree(
                "head_dim", d, n("q"), lw.q, f"{q_rows} query rows, not num_attention_heads {hq} x head_dim {d}"
            )
        if k_rows > 0 and lw.k.shape[1] == h and k_rows != hkv * d:
            says = f"{k_rows // d} KV heads of head_dim {d}" if k_rows % d == 0 else f"{k_rows} key rows"
            raise disagree("num_key_value_heads", hkv, n("k"), lw.k, says)
        if lw.gate.ndim == 2 and lw.gate.shape[1] == h and lw.gate.shape[0] != inter:
            raise disagree("intermediate_size", inter, n("gate"), lw.gate, f"intermediate_size {lw.gate.shape[0]}")
        for f, shape in (
            ("attn_norm", (h,)),
            ("q", (hq * d, h)),
            ("k", (hkv * d, h)),
            ("v", (hkv * d, h)),
            ("o", (h, hq * d)),
            ("mlp_norm", (h,)),
            ("gate", (inter, h)),
            ("up", (inter, h)),
            ("down", (h, inter)),
            ("q_bias", (hq * d,)),
            ("k_bias", (hkv * d,)),
            ("v_bias", (hkv * d,)),
            ("o_bias", (h,)),
            ("gate_bias", (inter,)),
            ("up_bias", (inter,)),
            ("down_bias", (h,)),
            ("q_norm", (d,)),
            ("k_norm", (d,)),
            ("post_attn_norm", (h,)),
            ("post_mlp_norm", (h,)),
        ):
            arr = getattr(lw, f)
            if arr is not None:
                expect(n(f), arr, shape)


@dataclass(frozen=True)
class Architecture:
    """What an architecture file registers: its name, config parser and weight names, and how llama.cpp
    writes it where edge-export reads its GGUF files."""

    name: str
    parse: Callable[[dict[str, Any]], ModelArgs]
    weights: WeightNames
    gguf: GGUFLayout | None = None
    folds: Callable[[dict[str, Any]], WeightFolds] | None = None  # from config.json; None: weights as stored
