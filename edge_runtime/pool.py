"""The static memory pool: every per-run buffer, allocated once at load from the manifest's geometry.

    K/V per layer      [1, H_kv, capacity, D] of the manifest's kv dtype, bound as past_* (and present_* for
                       the in-place `ort` flavor)
    decode inputs      ids [1, 1], cos/sin x2 [1, R/2], attn_mask [1, K], sink_mask [K], write_index [1],
                       sink_rows [1], ring_full [], seqlens_k [1], total length [],
                       cos/sin cache [capacity, R/2] (filled once at load: RingState.rotary_cache)
    new K/V rows       [1, H_kv, 1, D] per layer (host-copy flavor only)
    logits             [1, 1, V] float32
    next_token         [1, 1, 1] int64, where the graph has that output (the LM head's fused argmax)

Nothing here is reallocated per token: decode writes into these arrays in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .manifest import NEXT_TOKEN, KvUpdate, Manifest
from .ring import MASKED, MASKED_FP16, DecodeBuffers, RingGeometry


@dataclass
class StaticPool:
    keys: list[np.ndarray]
    values: list[np.ndarray]
    decode: DecodeBuffers
    input_ids: np.ndarray  # [1, 1] int64
    keep: np.ndarray  # [1] int64, always 1 in decode
    logits: np.ndarray  # [1, 1, V] float32
    new_keys: list[np.ndarray] = field(default_factory=list)  # host-copy flavor: [1, H_kv, 1, D]
    new_values: list[np.ndarray] = field(default_factory=list)
    next_token: np.ndarray | None = None  # [1, 1, 1] int64, where the graph outputs it

    @classmethod
    def allocate(cls, manifest: Manifest, geometry: RingGeometry) -> StaticPool:
        m, g = manifest.model, geometry
        dtype = np.dtype(manifest.graph.activation_dtype)
        kv_dtype = np.dtype(manifest.graph.kv_storage)  # fp16 or q8 rows under fp32 activations: --kv-dtype
        host_copy = manifest.graph.kv_update is KvUpdate.HOST_COPY
        cols = g.capacity + (1 if host_copy else 0)
        half = m.rotary_dim // 2
        masked = MASKED_FP16 if dtype == np.float16 else MASKED
        shapes = [manifest.graph.kv_shape(h, g.capacity, m.head_dim) for h in m.num_kv_heads]
        keys = [_committed(shape, kv_dtype) for shape in shapes]
        values = [_committed(shape, kv_dtype) for shape in shapes]
        decode = DecodeBuffers(
            cos=np.zeros((1, half), dtype),
            sin=np.zeros((1, half), dtype),
            cos_sink=np.zeros((1, half), dtype),
            sin_sink=np.zeros((1, half), dtype),
            attn_mask=np.full((1, cols), masked, dtype),
            sink_mask=np.arange(cols) < g.sinks,
            write_index=np.zeros(1, np.int64),
            sink_rows=np.array([g.sink_rows], np.int64),
            ring_full=np.zeros((), np.bool_),
            seqlens_k=np.zeros(1, np.int32),
            total_len=np.zeros((), np.int32),
            cos_cache=np.zeros((g.capacity, half), dtype),
            sin_cache=np.zeros((g.capacity, half), dtype),
            masked=masked,
            angle=np.zeros(half, np.float64),
            trig=np.zeros(half, np.float64),
        )
        if m.local_window is not None:  # the local layers' own inputs (Gemma 3)
            decode.cos_local, decode.sin_local = np.zeros((1, half), dtype), np.zeros((1, half), dtype)
            decode.attn_mask_local = np.full((1, cols), masked, dtype)
        pool = cls(
            keys=keys,
            values=values,
            decode=decode,
            input_ids=np.zeros((1, 1), np.int64),
            keep=np.ones(1, np.int64),
            logits=np.zeros((1, 1, m.vocab_size), np.float32),
            next_token=np.zeros((1, 1, 1), np.int64) if NEXT_TOKEN in manifest.graph.outputs else None,
        )
        if host_copy:
            pool.new_keys = [np.zeros(manifest.graph.kv_shape(h, 1, m.head_dim), kv_dtype) for h in m.num_kv_heads]
            pool.new_values = [np.zeros(manifest.graph.kv_shape(h, 1, m.head_dim), kv_dtype) for h in m.num_kv_heads]
        return pool

    def nbytes(self) -> int:
        arrays = [*self.keys, *self.values, *self.new_keys, *self.new_values, self.input_ids, self.keep, self.logits]
        arrays += [] if self.next_token is None else [self.next_token]
        d = self.decode
        arrays += [
            d.cos,
            d.sin,
            d.cos_sink,
            d.sin_sink,
            d.attn_mask,
            d.sink_mask,
            d.write_index,
            d.sink_rows,
            d.ring_full,
            d.seqlens_k,
            d.total_len,
            d.cos_cache,
            d.sin_cache,
        ]
        arrays += [a for a in (d.cos_local, d.sin_local, d.attn_mask_local) if a is not None]
        return sum(a.nbytes for a in arrays)

    def gather_rows(self, rows: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Copies of the K and V buffer rows `rows` of every layer ([1, H_kv, len(rows), D] each)."""
        return [k[:, :, rows] for k in self.keys], [v[:, :, rows] for v in self.values]

    def scatter_rows(self, rows: np.ndarray, keys: list[np.ndarray], values: list[np.ndarray]) -> None:
        """Write rows gathered by `gather_rows` back in place (the buffers never move: they are bound)."""
        for dst, src in zip((*self.keys, *self.values), (*keys, *values), strict=True):
            dst[:, :, rows] = src

    def kv_nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.keys, *self.values))

    @staticmethod
    def estimate_kv_bytes(manifest: Manifest, geometry: RingGeometry) -> int:
        g, itemsize = manifest.graph, np.dtype(manifest.graph.kv_storage).itemsize
        shapes = [g.kv_shape(h, geometry.capacity, manifest.model.head_dim) for h in manifest.model.num_kv_heads]
        return 2 * sum(int(np.prod(s)) * itemsize for s in shapes)


def _committed(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed buffer whose pages are all written now. np.zeros gets lazily mapped pages, so resident memory
    would grow as the ring first fills (94 MB over SmolLM2-135M's first 2,048 tokens) and a device short of
    memory would fail hours into a conversation instead of at load."""
    buf = np.empty(shape, dtype)
    buf.fill(0)
    return buf
