"""The float64 numpy reference forward: the oracle every export is validated against.

Written for clarity, not speed: one token sequence (batch 1), dense causal attention, keys stored
after RoPE at their absolute positions in a growing cache. It follows `transformers`' Llama/Qwen2/Qwen3
modeling code (rotate-half RoPE, RMSNorm in full precision, GQA by repeating KV heads) and is
checked against it in tests/test_parity_transformers.py.

    model = ReferenceModel(ckpt.args, ckpt.weights)
    logits = model.forward(ids)                     # [T, V], whole sequence
    cache = DenseKVCache(); model.forward(prompt, cache); model.forward([next_id], cache)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from edge_runtime.models import LayerWeights, ModelArgs, ModelWeights, RopeKind
from edge_runtime.models.base import Activation
from edge_runtime.models.layer_plan import Sublayer, run_layer

from .lazy_layers import LazyLayers
from .tables import RowTable


@dataclass
class DenseKVCache:
    """A growing cache: per layer K and V `[Hkv, T, D]` (K after RoPE) and the keys' positions `[T]`."""

    keys: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    def forget(self, layer: int) -> None:
        """Drop a layer's keys and values where no later token will read them (a pass with the layers
        outermost: every token has been through this layer)."""
        self.keys[layer] = self.values[layer] = np.empty(0, self.keys[layer].dtype)


# Above this many parameters the reference computes in float32 on the weights as given: a float64 copy
# of a 1B model is 10 GB, more than the exporter can hold beside the graph and the session it validates
# on a 24 GB machine, and upcasting per product made a 1B validation step take ~17 s. float32 still
# separates a correct graph (~1e-6 apart) from a broken one (>1e-3) by orders of magnitude.
F64_COPY_MAX_PARAMS = 300_000_000


def _f64(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else np.asarray(a, dtype=np.float64)


def _f32(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else np.asarray(a, dtype=np.float32)


def _keep(a: np.ndarray | None) -> np.ndarray | None:
    return a


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    # x: [T, H]
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def head_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """Qwen3's per-head q/k RMSNorm over the last (head) dim of x [heads, T, D]; identity without a weight."""
    return x if weight is None else rms_norm(x, weight, eps)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation (transformers' gelu_pytorch_tanh)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


ACTIVATIONS = {Activation.SILU: silu, Activation.GELU_TANH: gelu_tanh}


def post_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """Gemma's norm on a block's output before the residual add; identity where the layer has none."""
    return x if weight is None else rms_norm(x, weight, eps)


@dataclass(frozen=True)
class NumpyLowering:
    """models.layer_plan's steps in numpy; `attend(layer, lw, h)` is the attention over the caller's
    cache (dense, or the StreamingLLM ring's retained tokens), `mlp(lw, h)` the gated MLP."""

    eps: float
    attend: Callable[[int, LayerWeights, np.ndarray], np.ndarray]
    mlp_of: Callable[[LayerWeights, np.ndarray, int], np.ndarray]

    def norm(self, layer: int, sub: Sublayer, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return rms_norm(x, sub.norm, self.eps), x

    def attention(self, layer: int, lw: LayerWeights, h: np.ndarray) -> np.ndarray:
        return self.attend(layer, lw, h)

    def mlp(self, layer: int, lw: LayerWeights, h: np.ndarray) -> np.ndarray:
        return self.mlp_of(lw, h, layer)

    def post_norm(self, layer: int, sub: Sublayer, y: np.ndarray) -> np.ndarray:
        return post_norm(y, sub.post_norm, self.eps)

    def residual(self, layer: int, sub: Sublayer, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x + y


@dataclass(frozen=True)
class LlamaRounding:
    """MatMulGGUF's inputs under a legacy type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), rounded as llama.cpp's CPU backend
    rounds them (Q8_0 blocks, csrc/ggml_kernel.h): blocks of 32 whose scale is stored in fp16."""


# How one product rounds its inputs: int8 per block of that many inputs, llama.cpp's way, or not at all (float).
Rounding = int | LlamaRounding | None


@dataclass(frozen=True)
class Int8Activations:
    """How the graph's integer products round their inputs: per row and block of inputs to int8 (scale = the
    block's max |x| / 127, round half to even), or as llama.cpp does for a legacy GGUF type (LlamaRounding).
    `layers[i]` maps layer i's Linears (LayerWeights field names: q, k, v, o, gate, up, down) to the rounding
    their op applies, None where it takes float inputs; `head` is the LM head's."""

    layers: tuple[dict[str, Rounding], ...]
    head: Rounding

    def block(self, layer: int, name: str) -> Rounding:
        return self.layers[layer].get(name) if 0 <= layer < len(self.layers) else None


def round_activations(h: np.ndarray, rounding: Rounding) -> np.ndarray:
    """h [T, K] as a product that rounds its inputs with `rounding` sees them."""
    if rounding is None:
        return h
    if isinstance(rounding, LlamaRounding):
        return round_llama_blocks(h)
    return round_int8_blocks(h, rounding)


def round_llama_blocks(h: np.ndarray) -> np.ndarray:
    """h [T, K] rounded as llama.cpp's quantize_row_q8_0 rounds it (codes rint(x * 127 / max |x|) per block of 32,
    the scale max |x| / 127 stored in fp16), and back."""
    t, k = h.shape
    x = h.reshape(t, -1, 32)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    codes = np.rint(x * np.divide(h.dtype.type(127), amax, out=np.zeros_like(amax), where=amax > 0))
    return (codes * (amax / h.dtype.type(127)).astype(np.float16).astype(h.dtype)).reshape(t, k)


def round_int8_blocks(h: np.ndarray, block: int) -> np.ndarray:
    """h [T, K] with each row's blocks of `block` (the last one shorter where `block` does not divide K) rounded
    to int8 codes and back: MatMulQ4 / MatMulQ8 (csrc/q4gemm.h) and MatMulNBits at accuracy_level 4."""
    t, k = h.shape
    pad = -k % block
    x = np.pad(h, ((0, 0), (0, pad))) if pad else h
    x = x.reshape(t, -1, block)
    scale = np.abs(x).max(axis=-1, keepdims=True) / h.dtype.type(127)
    codes = np.rint(np.divide(x, scale, out=np.zeros_like(x), where=scale > 0))
    return (codes * scale).reshape(t, -1)[:, :k]


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE on the first `2 * cos.shape[-1]` dims of x [heads, T, D]; cos/sin [T, rot/2]."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


class ReferenceModel:
    """Float64 forward of a Llama-family decoder from `ModelWeights` (per-layer widths may differ);
    float32 above F64_COPY_MAX_PARAMS parameters (`dtype`)."""

    def __init__(
        self,
        args: ModelArgs,
        weights: ModelWeights,
        dtype: type[np.floating] | None = None,
        *,
        lazy: bool = True,
        int8_activations: Int8Activations | None = None,
    ):
        """`dtype` forces the compute precision (float32: the precision test of validate.py); None picks
        float64 up to F64_COPY_MAX_PARAMS parameters. `lazy`: where `weights.layers` are built on demand
        (LazyLayers), so are the reference's, each forward; False holds them all, for callers that change
        `self.layers` in place. `int8_activations`: round the inputs of the Linears (and of the LM head, if it
        says so) to int8 as the graph's integer products do (validate.py's int8 bound)."""
        self.args = args
        self.int8_activations = int8_activations
        if dtype is None:
            # a generator: lazy layers are counted one at a time, not all held at once
            arrays = (getattr(lw, f.name) for lw in weights.layers for f in fields(lw))
            params = weights.embed.size + sum(a.size for a in arrays if a is not None)
            dtype = np.float64 if params <= F64_COPY_MAX_PARAMS else None
        conv = _f64 if dtype is np.float64 else _f32 if dtype is np.float32 else _keep
        self.dtype = np.dtype(np.float32 if dtype is None else dtype)  # compute precision
        # A table held without its floats (its codes, or its rows in the checkpoint file: tables.py) is
        # read a block of rows at a time
        table = lambda t: t if isinstance(t, RowTable) else conv(t)  # noqa: E731
        self.embed = table(weights.embed)
        self.lm_head = self.embed if weights.lm_head is weights.embed else table(weights.lm_head)
        self.final_norm = conv(weights.final_norm)

        def widen(a: np.ndarray | None) -> np.ndarray | None:
            # a quantized Linear (QuantizedTable) is dequantized here, as its layer is built
            return a.rows(slice(None)) if isinstance(a, RowTable) else a

        def layer(lw: LayerWeights) -> LayerWeights:
            return LayerWeights(**{f.name: conv(widen(getattr(lw, f.name))) for f in fields(LayerWeights)})

        source = weights.layers
        if lazy and isinstance(source, LazyLayers):  # built (and converted) a layer at a time, each forward
            self.layers: Sequence[LayerWeights] = LazyLayers(len(source), lambda i: layer(source[i]))
        else:
            self.layers = [layer(lw) for lw in source]
        self.inv_freq = args.rope.inv_freq(args.head_dim)  # [rot/2] float64
        # Local layers' own RoPE (Gemma 3); the same frequencies as the global layers' where there is none.
        self.local_inv_freq = self.inv_freq if args.local_rope is None else args.local_rope.inv_freq(args.head_dim)
        # NoPE layers rotate by angle 0: cos 1 and sin 0 leave q and k exactly as they are.
        self._inv_freq = {RopeKind.GLOBAL: self.inv_freq, RopeKind.LOCAL: self.local_inv_freq,
                          RopeKind.NONE: np.zeros_like(self.inv_freq)}  # fmt: skip
        self.act = ACTIVATIONS[args.activation]

    def rope_cos_sin(self, positions: np.ndarray, kind: RopeKind = RopeKind.GLOBAL) -> tuple[np.ndarray, np.ndarray]:
        inv = self._inv_freq[kind]
        angles = positions.astype(np.float64)[:, None] * inv[None, :]  # [T, rot/2]
        return np.cos(angles).astype(self.dtype), np.sin(angles).astype(self.dtype)

    def window(self, layer: int) -> int | None:
        """The tokens layer `layer` attends back (itself included): its local window, the model-wide
        sliding window (Mistral), or None (all)."""
        return self.args.local_window if self.args.is_local(layer) else self.args.sliding_window

    def forward(self, ids: Sequence[int] | np.ndarray, cache: DenseKVCache | None = None) -> np.ndarray:
        """Logits [T, V] for `ids`, continuing `cache` (which grows by T) when given."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        cache = cache if cache is not None else DenseKVCache()
        start = len(cache)
        positions = np.arange(start, start + ids.shape[0], dtype=np.int64)
        cache.positions = np.concatenate([cache.positions, positions])
        angles = self.angles(positions)
        x = self.embed_rows(ids)
        for i, lw in enumerate(self.layers):
            x = self.layer(i, lw, x, positions, angles, cache)
        return self.logits(x)

    def embed_rows(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64).reshape(-1)
        rows = self.embed[ids].astype(self.dtype)  # float32 rows of a RowTable, or the float table's
        return rows * self.dtype.type(self.args.embed_scale)  # [T, H]

    def angles(self, positions: np.ndarray) -> dict[RopeKind, tuple[np.ndarray, np.ndarray]]:
        """RoPE's cos/sin at `positions`, for each kind of layer."""
        return {kind: self.rope_cos_sin(positions, kind) for kind in RopeKind}

    def layer(
        self,
        i: int,
        lw: LayerWeights,
        x: np.ndarray,
        positions: np.ndarray,
        angles: dict[RopeKind, tuple[np.ndarray, np.ndarray]],
        cache: DenseKVCache,
    ) -> np.ndarray:
        """The residual stream x [T, H] after layer i (weights `lw`), its keys and values added to `cache`."""
        cos, sin = angles[self.args.rope_kind(i)]

        def attend(i: int, lw: LayerWeights, h: np.ndarray) -> np.ndarray:
            return self._attention(i, lw, h, positions, cos, sin, cache)

        return run_layer(NumpyLowering(self.args.rms_norm_eps, attend, self._mlp), i, lw, x)

    def linear(
        self, h: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, *, layer: int = -1, name: str = ""
    ) -> np.ndarray:
        """h @ w.T (+ b): layer `layer`'s Linear `name` of the rows h [T, in], its inputs rounded as
        `int8_activations` says for it."""
        if self.int8_activations is not None:
            h = round_activations(h, self.int8_activations.block(layer, name))
        y = h @ w.T
        return y if b is None else y + b

    def logits(self, x: np.ndarray) -> np.ndarray:
        h = rms_norm(x, self.final_norm, self.args.rms_norm_eps)
        if self.int8_activations is not None:
            h = round_activations(h, self.int8_activations.head)
        if not isinstance(self.lm_head, RowTable):
            return h @ self.lm_head.T  # [T, V]
        out = np.empty((h.shape[0], self.lm_head.shape[0]), h.dtype)
        for rows, part in self.lm_head.parts():
            out[:, rows] = h @ part.astype(self.dtype).T
        return out

    def _attention(
        self,
        i: int,
        lw: LayerWeights,
        h: np.ndarray,
        positions: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
        cache: DenseKVCache,
    ) -> np.ndarray:
        d = self.args.head_dim
        t = h.shape[0]
        hq, hkv = lw.num_heads(d), lw.num_kv_heads(d)

        def proj(name: str, heads: int) -> np.ndarray:
            w, b = getattr(lw, name), getattr(lw, f"{name}_bias")
            y = self.linear(h, w, b, layer=i, name=name)  # [T, heads*D]
            return y.reshape(t, heads, d).transpose(1, 0, 2)  # [heads, T, D]

        eps = self.args.rms_norm_eps
        q = apply_rope(head_norm(proj("q", hq), lw.q_norm, eps), cos, sin)
        k = apply_rope(head_norm(proj("k", hkv), lw.k_norm, eps), cos, sin)
        v = proj("v", hkv)
        if i < len(cache.keys):
            cache.keys[i] = np.concatenate([cache.keys[i], k], axis=1)
            cache.values[i] = np.concatenate([cache.values[i], v], axis=1)
        else:
            cache.keys.append(k)
            cache.values.append(v)
        keys = np.repeat(cache.keys[i], hq // hkv, axis=0)  # [Hq, Tk, D]
        values = np.repeat(cache.values[i], hq // hkv, axis=0)

        # The softmax works in place on the one [Hq, T, Tk] array (a 512-token calibration sequence's is
        # 9 MB a head group): the same values as fresh temporaries, since adding the mask's 0 leaves a
        # score as it is and its -inf gives exp 0, as masking by np.where did.
        scores = q @ keys.transpose(0, 2, 1)  # [Hq, T, Tk]
        if self.args.attn_scale is None:
            np.divide(scores, math.sqrt(d), out=scores)
        else:
            np.multiply(scores, self.args.attn_scale, out=scores)
        key_pos = cache.positions[None, :]
        allowed = key_pos <= positions[:, None]
        window = self.window(i)
        if window is not None:
            allowed &= key_pos > positions[:, None] - window
        scores += np.where(allowed, 0.0, -np.inf).astype(scores.dtype)[None]
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores, out=scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = (probs @ values).transpose(1, 0, 2).reshape(t, hq * d)  # [T, Hq*D]
        return self.linear(out, lw.o, lw.o_bias, layer=i, name="o")

    def _mlp(self, lw: LayerWeights, h: np.ndarray, layer: int = -1) -> np.ndarray:
        gate = self.linear(h, lw.gate, lw.gate_bias, layer=layer, name="gate")
        up = self.linear(h, lw.up, lw.up_bias, layer=layer, name="up")
        return self.linear(self.act(gate) * up, lw.down, lw.down_bias, layer=layer, name="down")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def perplexity(model: ReferenceModel, ids: Sequence[int] | np.ndarray) -> float:
    """exp(mean NLL of ids[1:] given their prefixes), one forward over the whole sequence."""
    ids = np.asarray(ids, dtype=np.int64)
    logp = log_softmax(model.forward(ids[:-1]))
    return float(np.exp(-logp[np.arange(ids.shape[0] - 1), ids[1:]].mean()))


def greedy_generate(
    model: ReferenceModel, prompt: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int] = ()
) -> list[int]:
    """Greedy decoding with the growing cache; stops after an EOS id (included) or max_new_tokens."""
    cache = DenseKVCache()
    logits = model.forward(prompt, cache)[-1]
    out: list[int] = []
    for _ in range(max_new_tokens):
        token = int(np.argmax(logits))
        out.append(token)
        if token in eos_ids:
            break
        logits = model.forward([token], cache)[-1]
    return out


class StreamingReference:
    """A plain transcription of StreamingLLM's semantics (mit-han-lab `StartRecentKVCache` with
    position shift), one token at a time: per layer the *pre-RoPE* keys and the values of the
    retained tokens (S sinks + the W - 1 most recent), re-rotated every step at their positions
    within the cache; the query sits at the last cache position. Deliberately naive: it shares no
    code path with the ring buffer it validates.

    Local layers (Gemma 3) attend the retained tokens less than min(local window, W) back, sinks
    included only while that close: those are consecutive, so their cache positions are true distances.
    """

    def __init__(self, model: ReferenceModel, sinks: int, window: int):
        self.model, self.sinks, self.window = model, sinks, window
        self.keys: list[list[np.ndarray]] = [[] for _ in model.layers]  # per layer: [Hkv, D] per retained token
        self.values: list[list[np.ndarray]] = [[] for _ in model.layers]
        self.token_ids: list[int] = []  # the stream index of each retained token
        self.tokens = 0
        self.finished = False

    def run(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits [T, V] for a whole stream known in advance, from a fresh cache: what step() gives token by
        token, computed layer by layer (each token still attends exactly what step() keeps for it). A layer's
        weights are then read once per stream instead of once per token, which is what makes validating a
        model whose layers are built on demand (LazyLayers) affordable."""
        m = self.model
        retained = self.plan(len(tokens))
        x = m.embed_rows(np.asarray(tokens, np.int64))
        for i, lw in enumerate(m.layers):
            x = self.layer(i, lw, x, retained)
        return m.logits(x)

    def plan(self, count: int) -> list[np.ndarray]:
        """Per token of a fresh stream of `count`: the stream indices it attends, oldest first (itself last).
        The stream is then taken: its caches are never kept, so step() cannot continue it."""
        if self.tokens or self.finished:
            raise ValueError("run() starts a stream; this reference has already stepped")
        retained = []
        for t in range(count):
            self.token_ids.append(t)
            retained.append(np.asarray(self.token_ids))
            if len(self.token_ids) > self.sinks + self.window - 1:
                del self.token_ids[self.sinks]
        self.tokens, self.finished = count, True
        return retained

    def layer(self, i: int, lw: LayerWeights, x: np.ndarray, retained: list[np.ndarray]) -> np.ndarray:
        """The residual stream x [T, H] of a whole stream after layer i; `retained` from plan()."""

        def attend(i: int, lw: LayerWeights, h: np.ndarray) -> np.ndarray:
            q, k, v = self._project(i, lw, h)
            attn = np.empty((h.shape[0], q.shape[1] * q.shape[3]), self.model.dtype)
            for t, kept in enumerate(retained):
                attn[t] = self._attend(i, q[t], k[kept].transpose(1, 0, 2), v[kept].transpose(1, 0, 2), t - kept)
            return self._out(i, lw, attn)

        return run_layer(NumpyLowering(self.model.args.rms_norm_eps, attend, self.model._mlp), i, lw, x)

    def step(self, token: int) -> np.ndarray:
        """Logits [V] for the next token of the stream."""
        if self.finished:
            raise ValueError("this stream was computed whole by run(); start a new StreamingReference")
        m = self.model
        x = m.embed_rows([token])  # [1, H]
        self.token_ids.append(self.tokens)
        back = self.tokens - np.asarray(self.token_ids)  # [n]: how far back each retained token is

        def attend(i: int, lw: LayerWeights, h: np.ndarray) -> np.ndarray:
            q, k, v = self._project(i, lw, h)
            self.keys[i].append(k[0])
            self.values[i].append(v[0])
            keys, values = np.stack(self.keys[i], axis=1), np.stack(self.values[i], axis=1)  # [Hkv, n, D]
            return self._out(i, lw, self._attend(i, q[0], keys, values, back)[None, :])

        lowering = NumpyLowering(m.args.rms_norm_eps, attend, m._mlp)
        for i, lw in enumerate(m.layers):
            x = run_layer(lowering, i, lw, x)
        self.tokens += 1
        # Evict: keep the sinks and the W - 1 most recent, so the next token attends S + W.
        for cache in (*self.keys, *self.values, self.token_ids):
            if len(cache) > self.sinks + self.window - 1:
                del cache[self.sinks]
        return m.logits(x)[0]

    def _project(self, i: int, lw: LayerWeights, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q [T, Hq, 1, D] and the pre-RoPE k, v [T, Hkv, D] of the normed rows h [T, H]."""
        d, eps = self.model.args.head_dim, self.model.args.rms_norm_eps
        hq, hkv = lw.num_heads(d), lw.num_kv_heads(d)
        m = self.model
        q = head_norm(m.linear(h, lw.q, lw.q_bias, layer=i, name="q").reshape(-1, hq, 1, d), lw.q_norm, eps)
        k = head_norm(m.linear(h, lw.k, lw.k_bias, layer=i, name="k").reshape(-1, hkv, d), lw.k_norm, eps)
        v = m.linear(h, lw.v, lw.v_bias, layer=i, name="v").reshape(-1, hkv, d)
        return q, k, v

    def _attend(self, layer: int, q: np.ndarray, keys: np.ndarray, values: np.ndarray, back: np.ndarray) -> np.ndarray:
        """Layer `layer`'s query q [Hq, 1, D] over the retained tokens' pre-RoPE keys and values [Hkv, n, D],
        re-rotated at their positions within the cache (0 .. n-1, the query at n - 1); `back` [n]: how far
        back each token is (a local layer's window). The attention output [Hq * D]."""
        m = self.model
        hq, hkv, d = q.shape[0], keys.shape[0], q.shape[-1]
        local = m.args.is_local(layer)
        cos, sin = m.rope_cos_sin(np.arange(keys.shape[1]), m.args.rope_kind(layer))
        keys = np.repeat(apply_rope(keys, cos, sin), hq // hkv, axis=0)  # [Hq, n, D]
        q = apply_rope(q, cos[-1:], sin[-1:])
        values = np.repeat(values, hq // hkv, axis=0)
        scores = (q @ keys.transpose(0, 2, 1))[:, 0, :]  # [Hq, n]
        scores = scores / math.sqrt(d) if m.args.attn_scale is None else scores * m.args.attn_scale
        if local:
            scores = np.where(back[None, :] < min(m.args.local_window or self.window, self.window), scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        return np.einsum("hn,hnd->hd", probs, values).reshape(hq * d)

    def _out(self, i: int, lw: LayerWeights, attn: np.ndarray) -> np.ndarray:
        return self.model.linear(attn, lw.o, lw.o_bias, layer=i, name="o")


@dataclass(frozen=True)
class Stream:
    """A token stream for forward_streams: dense attention (`ring` None) or StreamingLLM's (sinks, window)."""

    tokens: tuple[int, ...]
    ring: tuple[int, int] | None = None


def forward_streams(
    model: ReferenceModel, streams: Sequence[Stream], on_layer: Callable[[int], None] | None = None
) -> list[np.ndarray]:
    """Logits [T, V] of each independent stream, the layers outermost: each layer's weights are read
    (built, where they are built on demand) once for all the streams. Equal to forward() (dense) or
    StreamingReference.run() (ring) of each stream alone. `on_layer(i)` is told when layer i is done."""
    xs, states = [], []
    for s in streams:
        ids = np.asarray(s.tokens, np.int64)
        xs.append(model.embed_rows(ids))
        if s.ring is None:
            positions = np.arange(len(ids), dtype=np.int64)
            states.append((positions, model.angles(positions), DenseKVCache(positions=positions)))
        else:
            ref = StreamingReference(model, *s.ring)
            states.append((ref, ref.plan(len(ids))))
    for i, lw in enumerate(model.layers):
        for j, s in enumerate(streams):
            if s.ring is None:
                xs[j] = model.layer(i, lw, xs[j], *states[j])
            else:
                ref, retained = states[j]
                xs[j] = ref.layer(i, lw, xs[j], retained)
        if on_layer is not None:
            on_layer(i)
    return [model.logits(x) for x in xs]
