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
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from edge_runtime.models import LayerWeights, ModelArgs, ModelWeights


@dataclass
class DenseKVCache:
    """A growing cache: per layer K and V `[Hkv, T, D]` (K after RoPE) and the keys' positions `[T]`."""

    keys: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.positions.shape[0])


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


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE on the first `2 * cos.shape[-1]` dims of x [heads, T, D]; cos/sin [T, rot/2]."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


class ReferenceModel:
    """Float64 forward of a Llama-family decoder from `ModelWeights` (per-layer widths may differ);
    float32 above F64_COPY_MAX_PARAMS parameters (`dtype`)."""

    def __init__(self, args: ModelArgs, weights: ModelWeights, dtype: type[np.floating] | None = None):
        """`dtype` forces the compute precision (float32: the precision test of validate.py); None picks
        float64 up to F64_COPY_MAX_PARAMS parameters."""
        self.args = args
        if dtype is None:
            arrays = [getattr(lw, f.name) for lw in weights.layers for f in fields(lw)]
            params = weights.embed.size + sum(a.size for a in arrays if a is not None)
            dtype = np.float64 if params <= F64_COPY_MAX_PARAMS else None
        conv = _f64 if dtype is np.float64 else _f32 if dtype is np.float32 else _keep
        self.dtype = np.dtype(np.float32 if dtype is None else dtype)  # compute precision
        self.embed = conv(weights.embed)
        self.lm_head = self.embed if weights.lm_head is weights.embed else conv(weights.lm_head)
        self.final_norm = conv(weights.final_norm)
        self.layers = [
            LayerWeights(**{f.name: conv(getattr(lw, f.name)) for f in fields(LayerWeights)}) for lw in weights.layers
        ]
        self.inv_freq = args.rope.inv_freq(args.head_dim)  # [rot/2] float64

    def rope_cos_sin(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        angles = positions.astype(np.float64)[:, None] * self.inv_freq[None, :]  # [T, rot/2]
        return np.cos(angles).astype(self.dtype), np.sin(angles).astype(self.dtype)

    def forward(self, ids: Sequence[int] | np.ndarray, cache: DenseKVCache | None = None) -> np.ndarray:
        """Logits [T, V] for `ids`, continuing `cache` (which grows by T) when given."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        cache = cache if cache is not None else DenseKVCache()
        start = len(cache)
        positions = np.arange(start, start + ids.shape[0], dtype=np.int64)
        cache.positions = np.concatenate([cache.positions, positions])
        cos, sin = self.rope_cos_sin(positions)
        eps = self.args.rms_norm_eps

        x = self.embed[ids].astype(self.dtype)  # [T, H]
        for i, lw in enumerate(self.layers):
            x = x + self._attention(i, lw, rms_norm(x, lw.attn_norm, eps), positions, cos, sin, cache)
            x = x + self._mlp(lw, rms_norm(x, lw.mlp_norm, eps))
        return rms_norm(x, self.final_norm, eps) @ self.lm_head.T  # [T, V]

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

        def proj(w: np.ndarray, b: np.ndarray | None, heads: int) -> np.ndarray:
            y = h @ w.T if b is None else h @ w.T + b  # [T, heads*D]
            return y.reshape(t, heads, d).transpose(1, 0, 2)  # [heads, T, D]

        eps = self.args.rms_norm_eps
        q = apply_rope(head_norm(proj(lw.q, lw.q_bias, hq), lw.q_norm, eps), cos, sin)
        k = apply_rope(head_norm(proj(lw.k, lw.k_bias, hkv), lw.k_norm, eps), cos, sin)
        v = proj(lw.v, lw.v_bias, hkv)
        if i < len(cache.keys):
            cache.keys[i] = np.concatenate([cache.keys[i], k], axis=1)
            cache.values[i] = np.concatenate([cache.values[i], v], axis=1)
        else:
            cache.keys.append(k)
            cache.values.append(v)
        keys = np.repeat(cache.keys[i], hq // hkv, axis=0)  # [Hq, Tk, D]
        values = np.repeat(cache.values[i], hq // hkv, axis=0)

        scores = q @ keys.transpose(0, 2, 1) / math.sqrt(d)  # [Hq, T, Tk] (a Python float keeps float32 float32)
        key_pos = cache.positions[None, :]
        allowed = key_pos <= positions[:, None]
        if self.args.sliding_window is not None:
            allowed &= key_pos > positions[:, None] - self.args.sliding_window
        scores = np.where(allowed[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = (probs @ values).transpose(1, 0, 2).reshape(t, hq * d)  # [T, Hq*D]
        out = out @ lw.o.T
        return out if lw.o_bias is None else out + lw.o_bias

    @staticmethod
    def _mlp(lw: LayerWeights, h: np.ndarray) -> np.ndarray:
        gate = h @ lw.gate.T if lw.gate_bias is None else h @ lw.gate.T + lw.gate_bias
        up = h @ lw.up.T if lw.up_bias is None else h @ lw.up.T + lw.up_bias
        out = (silu(gate) * up) @ lw.down.T
        return out if lw.down_bias is None else out + lw.down_bias


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
    """

    def __init__(self, model: ReferenceModel, sinks: int, window: int):
        self.model, self.sinks, self.window = model, sinks, window
        self.keys: list[list[np.ndarray]] = [[] for _ in model.layers]  # per layer: [Hkv, D] per retained token
        self.values: list[list[np.ndarray]] = [[] for _ in model.layers]
        self.tokens = 0

    def step(self, token: int) -> np.ndarray:
        """Logits [V] for the next token of the stream."""
        m, d = self.model, self.model.args.head_dim
        eps = m.args.rms_norm_eps
        x = m.embed[[token]].astype(m.dtype)  # [1, H]
        for i, lw in enumerate(m.layers):
            h = rms_norm(x, lw.attn_norm, eps)
            hq, hkv = lw.num_heads(d), lw.num_kv_heads(d)
            q = head_norm((h @ lw.q.T + (0 if lw.q_bias is None else lw.q_bias)).reshape(hq, 1, d), lw.q_norm, eps)
            k = head_norm((h @ lw.k.T + (0 if lw.k_bias is None else lw.k_bias)).reshape(hkv, d), lw.k_norm, eps)
            v = (h @ lw.v.T + (0 if lw.v_bias is None else lw.v_bias)).reshape(hkv, d)
            self.keys[i].append(k)
            self.values[i].append(v)
            n = len(self.keys[i])
            cos, sin = m.rope_cos_sin(np.arange(n))  # positions within the cache: 0 .. n-1
            keys = apply_rope(np.stack(self.keys[i], axis=1), cos, sin)  # [Hkv, n, D]
            q = apply_rope(q, cos[-1:], sin[-1:])  # the query at cache position n - 1
            keys = np.repeat(keys, hq // hkv, axis=0)
            values = np.repeat(np.stack(self.values[i], axis=1), hq // hkv, axis=0)
            scores = (q @ keys.transpose(0, 2, 1))[:, 0, :] / math.sqrt(d)  # [Hq, n]
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            attn = np.einsum("hn,hnd->hd", probs, values).reshape(1, hq * d) @ lw.o.T
            x = x + (attn if lw.o_bias is None else attn + lw.o_bias)
            x = x + m._mlp(lw, rms_norm(x, lw.mlp_norm, eps))
        self.tokens += 1
        # Evict: keep the sinks and the W - 1 most recent, so the next token attends S + W.
        for cache in (*self.keys, *self.values):
            if len(cache) > self.sinks + self.window - 1:
                del cache[self.sinks]
        return (rms_norm(x, m.final_norm, eps) @ m.lm_head.T)[0]
