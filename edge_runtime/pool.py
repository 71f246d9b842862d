"""The static memory pool: every per-run buffer, allocated once at load from the manifest's geometry.

    K/V per layer      [1, H_kv, capacity, D] of the manifest's kv dtype, bound as past_* (and present_* for
                       the in-place `ort` flavor); a local layer's capacity is its own ring's (e.g. Gemma 3);
                       a slice of one [caches, ...] array where the model's caches decode in one call (batch_kv)
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

from .errors import EdgeRuntimeError
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
    # Layers whose buffers are the local ring's (e.g. Gemma 3's local layers), and the global ring's rows: row r
    # of RingState.state()'s combined numbering is a global row below it, local row r - global_rows above.
    local_layers: frozenset[int] = frozenset()
    global_rows: int = 0

    @classmethod
    def allocate(
        cls,
        manifest: Manifest,
        geometry: RingGeometry,
        local: RingGeometry | None = None,
        *,
        kv: tuple[list[np.ndarray], list[np.ndarray]] | None = None,
    ) -> StaticPool:
        """`local`: the local layers' ring (RingState.local_ring), for a graph with local layers. `kv`: this cache's
        K and V buffers, views into a batch's (`batch_kv`), else allocated here."""
        m, g = manifest.model, geometry
        dtype = np.dtype(manifest.graph.activation_dtype)
        kv_dtype = np.dtype(manifest.graph.kv_storage)  # fp16 or q8 rows under fp32 activations: --kv-dtype
        host_copy = manifest.graph.kv_update is KvUpdate.HOST_COPY
        local_layers = manifest.graph.local_cache_layers
        if bool(local_layers) != (local is not None):
            raise EdgeRuntimeError(f"the graph's local-ring layers {sorted(local_layers)} and the ring given disagree")
        if kv is None:
            shapes = _kv_shapes(manifest, geometry, local)
            keys = [_committed(shape, kv_dtype) for shape in shapes]
            values = [_committed(shape, kv_dtype) for shape in shapes]
        else:
            keys, values = kv
        decode = _decode_buffers(g, m.rotary_dim // 2, dtype, host_copy, rotary_cache=True)
        if local is not None:  # the local layers' own ring inputs (e.g. Gemma 3)
            decode.local = _decode_buffers(local, m.rotary_dim // 2, dtype, host_copy, rotary_cache=False)
        pool = cls(
            keys=keys,
            values=values,
            decode=decode,
            input_ids=np.zeros((1, 1), np.int64),
            keep=np.ones(1, np.int64),
            logits=np.zeros((1, 1, m.vocab_size), np.float32),
            next_token=np.zeros((1, 1, 1), np.int64) if NEXT_TOKEN in manifest.graph.outputs else None,
            local_layers=local_layers,
            global_rows=g.capacity,
        )
        if host_copy:
            pool.new_keys = [np.zeros(manifest.graph.kv_shape(h, 1, m.head_dim), kv_dtype) for h in m.num_kv_heads]
            pool.new_values = [np.zeros(manifest.graph.kv_shape(h, 1, m.head_dim), kv_dtype) for h in m.num_kv_heads]
        return pool

    def nbytes(self) -> int:
        arrays = [*self.keys, *self.values, *self.new_keys, *self.new_values, self.input_ids, self.keep, self.logits]
        arrays += [] if self.next_token is None else [self.next_token]
        for d in (self.decode, self.decode.local):
            if d is None:
                continue
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
        return sum(a.nbytes for a in arrays)

    def _layer_rows(self, layer: int, rows: np.ndarray) -> np.ndarray:
        """The rows of `rows` (RingState.state's numbering) that are this layer's buffer's, in its numbering."""
        if layer in self.local_layers:
            return rows[rows >= self.global_rows] - self.global_rows
        return rows[rows < self.global_rows] if self.local_layers else rows

    def gather_rows(self, rows: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Copies of the K and V buffer rows `rows` (RingState.state's numbering) of every layer
        ([1, H_kv, rows of that layer's ring, D] each)."""
        at = [self._layer_rows(i, rows) for i in range(len(self.keys))]
        return [k[:, :, r] for k, r in zip(self.keys, at, strict=True)], [
            v[:, :, r] for v, r in zip(self.values, at, strict=True)
        ]

    def scatter_rows(self, rows: np.ndarray, keys: list[np.ndarray], values: list[np.ndarray]) -> None:
        """Write rows gathered by `gather_rows` back in place (the buffers never move: they are bound)."""
        for i, (k, v, src_k, src_v) in enumerate(zip(self.keys, self.values, keys, values, strict=True)):
            r = self._layer_rows(i, rows)
            k[:, :, r] = src_k
            v[:, :, r] = src_v

    def kv_nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.keys, *self.values))

    @staticmethod
    def estimate_kv_bytes(manifest: Manifest, geometry: RingGeometry, local: RingGeometry | None = None) -> int:
        itemsize = np.dtype(manifest.graph.kv_storage).itemsize
        return 2 * sum(int(np.prod(s)) * itemsize for s in _kv_shapes(manifest, geometry, local))


def _kv_shapes(manifest: Manifest, geometry: RingGeometry, local: RingGeometry | None) -> list[tuple[int, ...]]:
    """Each layer's K (or V) buffer shape for one cache: the local ring's rows for the local layers."""
    g = manifest.graph
    local_layers = g.local_cache_layers if local is not None else frozenset()
    return [
        g.kv_shape(h, local.capacity if local is not None and i in local_layers else geometry.capacity,
                   manifest.model.head_dim)
        for i, h in enumerate(manifest.model.num_kv_heads)
    ]  # fmt: skip


def batch_kv(
    manifest: Manifest, geometry: RingGeometry, local: RingGeometry | None, caches: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every layer's K and V buffers for `caches` caches, one array each [caches, H_kv, C, D]: cache i's are the
    views [i : i + 1] (StaticPool.allocate's `kv`), so one graph call can read and write several caches
    (BatchBuffers) while each cache still binds its own rows for a call of its own."""
    kv_dtype = np.dtype(manifest.graph.kv_storage)
    shapes = [(caches, *s[1:]) for s in _kv_shapes(manifest, geometry, local)]
    return [_committed(s, kv_dtype) for s in shapes], [_committed(s, kv_dtype) for s in shapes]


@dataclass
class BatchBuffers:
    """The inputs and outputs of one decode step over several caches (graphs that take manifest.ROW_CACHE): row b
    is one token of cache `row_cache[b]`, with that cache's step inputs copied in (RingState.decode_into wrote them
    into its own DecodeBuffers). A step over B caches binds the first B rows."""

    keys: list[np.ndarray]  # [caches, H_kv, C, D] per layer (batch_kv): every cache's rows
    values: list[np.ndarray]
    input_ids: np.ndarray  # [1, caches] int64
    cos: np.ndarray  # [caches, R/2]
    sin: np.ndarray
    cos_sink: np.ndarray
    sin_sink: np.ndarray
    attn_mask: np.ndarray  # [caches, C]
    write_index: np.ndarray  # [caches] int64: each row's buffer row
    row_cache: np.ndarray  # [caches] int64: each row's cache
    logits: np.ndarray  # [1, caches, V] float32
    next_token: np.ndarray | None  # [1, caches, 1] int64, where the graph outputs it
    keep: np.ndarray  # [1] int64: the rows kept (set per step)
    ring_full: np.ndarray  # [] bool, True: RingAttention, which takes the batch, at every fill
    # the local layers' ring (e.g. Gemma 3): [caches, R/2], [caches, C_local], [caches]
    cos_local: np.ndarray | None = None
    sin_local: np.ndarray | None = None
    attn_mask_local: np.ndarray | None = None
    write_index_local: np.ndarray | None = None

    @classmethod
    def allocate(
        cls, manifest: Manifest, kv: tuple[list[np.ndarray], list[np.ndarray]], first: StaticPool
    ) -> BatchBuffers:
        """Rows for every cache of `kv` (batch_kv), shaped as `first`'s single-token buffers."""
        n, d = kv[0][0].shape[0], first.decode

        def rows(a: np.ndarray) -> np.ndarray:
            return np.zeros((n, a.shape[-1]), a.dtype)

        local = d.local
        return cls(
            keys=kv[0],
            values=kv[1],
            input_ids=np.zeros((1, n), np.int64),
            cos=rows(d.cos),
            sin=rows(d.sin),
            cos_sink=rows(d.cos_sink),
            sin_sink=rows(d.sin_sink),
            attn_mask=rows(d.attn_mask),
            write_index=np.zeros(n, np.int64),
            row_cache=np.zeros(n, np.int64),
            logits=np.zeros((1, n, manifest.model.vocab_size), np.float32),
            next_token=None if first.next_token is None else np.zeros((1, n, 1), np.int64),
            keep=np.ones(1, np.int64),
            ring_full=np.ones((), np.bool_),
            cos_local=None if local is None else rows(local.cos),
            sin_local=None if local is None else rows(local.sin),
            attn_mask_local=None if local is None else rows(local.attn_mask),
            write_index_local=None if local is None else np.zeros(n, np.int64),
        )

    @staticmethod
    def estimate_bytes(manifest: Manifest, geometry: RingGeometry, local: RingGeometry | None, caches: int) -> int:
        """What `allocate` takes for `caches` caches (the K/V arrays aside: each cache's, counted per cache)."""
        item = np.dtype(manifest.graph.activation_dtype).itemsize
        half = manifest.model.rotary_dim // 2
        row = 4 * manifest.model.vocab_size + item * (geometry.capacity + 4 * half) + 4 * 8  # logits, mask, angles
        if local is not None:
            row += item * (local.capacity + 2 * half) + 8
        return caches * row

    def set_row(self, b: int, cache: int, token: int, d: DecodeBuffers) -> None:
        """Row `b` of the step: `token` into cache `cache`, with the inputs `d` holds for it (RingState.decode_into)."""
        self.input_ids[0, b], self.row_cache[b], self.write_index[b] = token, cache, d.write_index[0]
        self.cos[b], self.sin[b], self.cos_sink[b], self.sin_sink[b] = d.cos[0], d.sin[0], d.cos_sink[0], d.sin_sink[0]
        self.attn_mask[b] = d.attn_mask[0]
        if d.local is not None and self.cos_local is not None:  # allocated together (allocate)
            self.cos_local[b], self.sin_local[b] = d.local.cos[0], d.local.sin[0]
            self.attn_mask_local[b], self.write_index_local[b] = d.local.attn_mask[0], d.local.write_index[0]


def _decode_buffers(
    g: RingGeometry, half: int, dtype: np.dtype, host_copy: bool, *, rotary_cache: bool
) -> DecodeBuffers:
    """One ring's single-token inputs; `rotary_cache`: GroupQueryAttention's cos/sin cache (the global ring's)."""
    cols = g.capacity + (1 if host_copy else 0)
    masked = MASKED_FP16 if dtype == np.float16 else MASKED
    cache_rows = g.capacity if rotary_cache else 0
    return DecodeBuffers(
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
        cos_cache=np.zeros((cache_rows, half), dtype),
        sin_cache=np.zeros((cache_rows, half), dtype),
        masked=masked,
        angle=np.zeros(half, np.float64),
        trig=np.zeros(half, np.float64),
    )


def _committed(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed buffer whose pages are all written now. np.zeros gets lazily mapped pages, so resident memory
    would grow as the ring first fills (94 MB over SmolLM2-135M's first 2,048 tokens) and a device short of
    memory would fail hours into a conversation instead of at load."""
    buf = np.empty(shape, dtype)
    buf.fill(0)
    return buf
