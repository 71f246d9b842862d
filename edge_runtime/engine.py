"""A loaded bundle: a stateless *model* and the *caches* its streams live in.

engine = load("bundle/")                   # verifies checksums, version, memory budget
logits = engine.prefill(prompt_ids)        # [V], chunked at the ring's wrap point
logits = engine.decode(next_id)            # [V], a view into the pool (valid until the next call)

`Model` is what a bundle loads into: the graph on its backend, the weights, the ring's geometry. It holds no
stream: every step runs on a `KVCache` (kv_cache.py) passed in, `model.prefill(cache, ids)`. Its caches are
preallocated at load (`LoadOptions.caches`, within the memory budget), so the pool stays static. An `Engine` is
a model paired with one of its caches (`load` returns one on the first cache; `engine.on(i)` another): the
object a Session, the decode loops and the tools drive, as before the two were apart.

Output that is garbage (NaN/Inf logits, an argmax outside the vocabulary) raises CorruptOutputError
rather than being decoded: at prefill, every decode step's chosen token, and every CHECK_EVERY-th
decode step's whole row (logits_check.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .backends import Backend
from .backends.onnxruntime import BatchRunner, OrtBackend
from .batching import CHUNK_BESIDE_STREAMS, DEFAULT_WAIT_S, StepBatcher
from .bundle import Bundle, open_bundle, stored_bytes
from .errors import BundleError, EdgeRuntimeError
from .interrupts import atomic, poll
from .kv_cache import KVCache
from .load_options import LoadOptions as LoadOptions
from .load_options import apply_target as apply_target
from .logits_check import CHECK_EVERY, check_row, check_token
from .manifest import LINEAR_UNTIL_FULL, KvUpdate, Manifest
from .pool import BatchBuffers, StaticPool, batch_kv
from .ring import LocalLayers, RingGeometry, RingState, geometry_problem

if TYPE_CHECKING:
    from .targets import TargetProfile

# The most prompt tokens one graph call takes. A call's activations, and ONNX Runtime's arena that keeps its
# high-water mark, grow with its rows; 256 keeps a long prompt's peak RSS 28-42 MB under 512's for a time to first
# token within a few percent either way (docs/decisions/prefill-chunk.md).
PREFILL_CHUNK = 256


class MemoryBudgetError(EdgeRuntimeError):
    """Weights plus the static pool do not fit the target's memory budget."""


class Model:
    """A bundle loaded: graph, weights, backend and geometry, and the caches preallocated beside them."""

    def __init__(self, bundle: Bundle, opts: LoadOptions):
        m = bundle.manifest
        self.bundle, self.manifest = bundle, m
        self.host_copy = m.graph.kv_update is KvUpdate.HOST_COPY
        if not self.host_copy and m.graph.kv.get("attended_columns") != LINEAR_UNTIL_FULL:
            raise BundleError(
                f"'{bundle.path}' holds an `ort` graph of an earlier edge-runtime (KV layout "
                f"{m.graph.kv.get('layout')}), which this runtime no longer drives; re-export it with edge-export "
                "(the 0.3 graph decodes faster)"
            )
        if opts.caches < 1:
            raise EdgeRuntimeError(f"a model needs at least one cache, got caches={opts.caches}")
        self.geometry = _geometry(bundle, opts)
        self._inv_freq = np.asarray(m.model.rope_inv_freq)
        self._position_offset = opts.position_offset
        self._gqa_while_linear = "ring_full" in m.graph.inputs
        self._local = _local_layers(bundle.path, m)
        # Several caches of a graph that takes a batch (manifest.ROW_CACHE, an ort graph with edge kernels) share
        # one K/V array per layer, each cache a slice, so one call can decode a token of each (decode_batch).
        self.batched = opts.caches > 1 and m.graph.batched and not self.host_copy
        # the local layers' ring (None without local layers), the one RingState keeps in step
        first = self._ring()
        self.local_geometry = None if first.local_ring is None else first.local_ring.geometry
        self.kv_bytes = StaticPool.estimate_kv_bytes(m, self.geometry, self.local_geometry)  # one cache's
        weight_bytes = sum(stored_bytes(bundle.path / f) for f in (m.graph.file, m.graph.data_file))
        # a batched step's inputs and logits, a row per cache (BatchBuffers)
        self.batch_bytes = (
            BatchBuffers.estimate_bytes(m, self.geometry, self.local_geometry, opts.caches) if self.batched else 0
        )
        need = weight_bytes + opts.caches * self.kv_bytes + self.batch_bytes
        if opts.memory_budget is not None and need > opts.memory_budget:
            caches, fewer = "KV cache", ""
            if opts.caches > 1:  # edge-serve's slots, one cache each
                caches, fewer = f"{opts.caches} KV caches", "fewer --slots, "
            batch = f" + batched steps' buffers {self.batch_bytes / 2**20:.1f} MiB" if self.batch_bytes else ""
            raise MemoryBudgetError(
                f"bundle needs {need / 2**20:.1f} MiB (weights {weight_bytes / 2**20:.1f} MiB + {caches} "
                f"{opts.caches * self.kv_bytes / 2**20:.1f} MiB for capacity {self.geometry.capacity}{batch}) but the "
                f"memory budget is {opts.memory_budget / 2**20:.1f} MiB; use {fewer}a smaller --window or a more "
                "quantized bundle"
            )
        self.weight_bytes = weight_bytes
        self.threads = opts.threads
        kv = batch_kv(m, self.geometry, self.local_geometry, opts.caches) if self.batched else None
        pool = self._pool(first, kv, 0)
        self.backend: Backend  # the graph's backend, bound to the first cache; the others are bound to it
        if opts.tensorrt is not None:
            from .backends.trt_backend import open_trt_backend

            g = self.geometry
            self.backend = open_trt_backend(
                bundle.path, m, pool, g.capacity, g.slack, opts.tensorrt, cuda_graph=opts.cuda_graph,
                local_capacity=None if self.local_geometry is None else self.local_geometry.capacity,
            )  # fmt: skip
        else:
            self.backend = OrtBackend(
                bundle.graph_file,
                m,
                pool,
                threads=opts.threads,
                profile=opts.profile,
                spin=opts.spin,
                providers=opts.providers,
            )
        caches = [KVCache(pool, first, self.backend)]
        for i in range(1, opts.caches):
            ring = self._ring()
            pool = self._pool(ring, kv, i)
            caches.append(KVCache(pool, ring, self.backend.bind(pool), i))
        self.caches: tuple[KVCache, ...] = tuple(caches)
        self._batch: BatchRunner | None = None
        if kv is not None and isinstance(self.backend, OrtBackend):
            self._batch_buffers = BatchBuffers.allocate(m, kv, caches[0].pool)
            self._batch = self.backend.batch(self._batch_buffers, caches[0].pool)
        # Set by a front end that steps several caches from several threads (edge-serve's --parallel): decode steps
        # then go through it, which runs those that arrive together as one batched call (batching.py).
        self.batcher: StepBatcher | None = None

    def batch_steps(
        self, *, wait_s: float = DEFAULT_WAIT_S, observe: Callable[[int], None] | None = None
    ) -> StepBatcher:
        """From now on, decode steps that threads ask for together on different caches run as one call (batching.py;
        one call a cache where the graph takes no batch). Returns the batcher, whose `stream()` each thread's
        generation runs inside."""
        self.batcher = StepBatcher(self.decode_batch, len(self.caches), wait_s=wait_s, observe=observe)
        return self.batcher

    def _ring(self) -> RingState:
        return RingState(
            self.geometry,
            self._inv_freq,
            self._position_offset,
            # a batched step runs RingAttention at every fill, which reads the step's cos/sin: kept current
            gqa_while_linear=self._gqa_while_linear and not self.batched,
            local=self._local,
        )

    def _pool(self, ring: RingState, kv: tuple[list[np.ndarray], list[np.ndarray]] | None, index: int) -> StaticPool:
        own = None if kv is None else ([k[index : index + 1] for k in kv[0]], [v[index : index + 1] for v in kv[1]])
        pool = StaticPool.allocate(self.manifest, self.geometry, self.local_geometry, kv=own)
        d = pool.decode  # its rotary caches in the activation dtype, which an fp16 KV cache need not share
        d.cos_cache[:], d.sin_cache[:] = ring.rotary_cache(d.cos.dtype)
        return pool

    # -- steps on a cache ----------------------------------------------------------------------------

    def prefill(self, cache: KVCache, ids: list[int] | np.ndarray, *, all_logits: bool = False) -> np.ndarray:
        """Feed prompt tokens into `cache`; logits of the last one [V] (or of every one [n, V])."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise EdgeRuntimeError(f"prefill needs a non-empty 1-D list of token ids, got shape {ids.shape}")
        if ids.min() < 0 or ids.max() >= self.manifest.model.vocab_size:
            raise EdgeRuntimeError(
                f"token ids must be in [0, {self.manifest.model.vocab_size}), got {ids.min()}..{ids.max()}"
            )
        batcher = self.batcher
        with nullcontext() if batcher is None else batcher.prefilling():
            out = self._prefill(cache, ids, all_logits, batcher)
        check_row(out[-1][-1], "the end of the prompt")
        return np.concatenate(out) if all_logits else out[-1][-1]

    def _prefill(
        self, cache: KVCache, ids: np.ndarray, all_logits: bool, batcher: StepBatcher | None
    ) -> list[np.ndarray]:
        out, pos = [], 0
        cache.decoding = False
        ring, pool = cache.ring, cache.pool
        # Beside other streams a long prompt goes in chunks of at most CHUNK_BESIDE_STREAMS tokens, their decode
        # steps running between them (batching.py); alone, of at most PREFILL_CHUNK.
        for n in ring.chunks(ids.size, PREFILL_CHUNK if batcher is None else CHUNK_BESIDE_STREAMS):
            poll()  # a Ctrl-C deferred by a caller's section stops a long prompt between chunks
            with nullcontext() if batcher is None else batcher.chunk(), atomic():
                # the ring's advance and the rows the graph writes go together; the step inputs in the activation
                # dtype (the pool's), which an fp16 cache need not share
                plan = ring.plan(n, new_rows_as_columns=self.host_copy, dtype=pool.decode.cos.dtype)
                out.append(cache.backend.run_chunk(ids[pos : pos + n], plan, keep=n if all_logits else 1))
            pos += n
        return out

    def decode(self, cache: KVCache, token: int) -> np.ndarray:
        """Feed one token into `cache`; its logits [V] (a view into the cache's pool, overwritten by its next
        step). With a `batcher`, the step may run in one call with other caches' (`decode_batch`): the same
        result where the batch's rows round as one row does (`exact_rows`)."""
        if self.batcher is not None:
            self.batcher.decode(cache, token)
        else:
            self._decode_one(cache, token)
        cache.decode_steps += 1
        if cache.decode_steps % CHECK_EVERY == 0:
            check_row(cache.pool.logits[0, 0], f"decode step {cache.decode_steps}")
        return cache.pool.logits[0, 0]

    def _decode_one(self, cache: KVCache, token: int) -> None:
        pool = cache.pool
        d = pool.decode
        with atomic():  # the ring's advance, the row the graph writes and the host copy go together
            if not cache.decoding:  # after a prefill the incremental mask is rebuilt once
                cache.ring.sync_decode(d)
                cache.decoding = True
            pool.input_ids[0, 0] = token
            row = cache.ring.decode_into(d, new_rows_as_columns=self.host_copy)
            cache.backend.run_decode(row)
            if self.host_copy:
                cache.ring.decode_done(d, row)

    def decode_batch(self, caches: Sequence[KVCache], tokens: Sequence[int]) -> None:
        """One decode step on each of `caches` (distinct caches of this model), `tokens[b]` into `caches[b]`, as
        one graph call where the graph takes a batch (`batched`), else one call each. Each cache's logits (and
        fused argmax) land in its pool, as `decode` leaves them; nothing is checked or counted here (`decode` does
        that for its caller)."""
        if len(caches) == 1 or self._batch is None:
            for cache, token in zip(caches, tokens, strict=True):
                self._decode_one(cache, token)
            return
        b = self._batch_buffers
        if len(caches) > b.input_ids.shape[1] or len({c.index for c in caches}) != len(caches):
            raise EdgeRuntimeError(
                f"a batched step takes distinct caches of this model, got {[c.index for c in caches]}"
            )
        with atomic():
            for i, (cache, token) in enumerate(zip(caches, tokens, strict=True)):
                d = cache.pool.decode
                if not cache.decoding:
                    cache.ring.sync_decode(d)
                    cache.decoding = True
                cache.ring.decode_into(d, new_rows_as_columns=False)
                b.set_row(i, cache.index, token, d)
            self._batch.run(len(caches))
            for i, cache in enumerate(caches):
                pool = cache.pool
                pool.logits[0, 0] = b.logits[0, i]
                if pool.next_token is not None and b.next_token is not None:
                    pool.next_token[0, 0, 0] = b.next_token[0, i, 0]

    def decoded_argmax(self, cache: KVCache) -> int:
        """numpy.argmax of `cache`'s last decode step's logits, as the graph computed it (fused_argmax only)."""
        token = int(cache.pool.next_token[0, 0, 0])
        vocab = self.manifest.model.vocab_size
        check_token(token, cache.pool.logits[0, 0, token] if 0 <= token < vocab else 0.0, vocab, "a decode step")
        return token

    @property
    def fused_argmax(self) -> bool:
        """Whether a decode step also leaves its greedy token (graphs whose LM head is a MatMulQ4/Q8)."""
        return self.caches[0].pool.next_token is not None  # every cache's pool is allocated alike

    @cached_property
    def exact_rows(self) -> int:
        """Most rows one chunk computes bit for bit as that many decode steps (1..exactness.WIDEST), measured
        on this graph here (exactness.py) and never above what the edge ops document (kernels.exact_rows).
        The first call may probe on the first cache, its stream put back after (a few hundred rows of
        compute, then cached per bundle and CPU)."""
        from . import exactness, kernels

        documented = kernels.exact_rows(self.backend.kernel_ops())
        widest = exactness.WIDEST if documented is None else min(documented, exactness.WIDEST)
        return exactness.exact_rows(Engine(self, self.caches[0]), widest)


class Engine:
    """A model and one of its caches: one stream, driven as a unit (what Session, the decode loops, the
    exactness probe and the tools take). Cheap to make; the state is the cache's."""

    def __init__(self, model: Model, cache: KVCache):
        self.model, self.cache = model, cache
        # The model's facts, read per step by the loops: plain attributes, not properties.
        self.bundle, self.manifest, self.geometry = model.bundle, model.manifest, model.geometry
        self.local_geometry, self.weight_bytes, self.threads = model.local_geometry, model.weight_bytes, model.threads
        self.ring, self.pool, self.backend = cache.ring, cache.pool, cache.backend

    def on(self, index: int) -> Engine:
        """The same model on its cache `index` (0 .. len(model.caches) - 1): another stream beside this one."""
        if not 0 <= index < len(self.model.caches):
            raise EdgeRuntimeError(
                f"cache {index} does not exist: this model was loaded with {len(self.model.caches)} "
                "(LoadOptions.caches)"
            )
        return Engine(self.model, self.model.caches[index])

    @property
    def tokens(self) -> int:
        return self.cache.ring.tokens

    def reset(self) -> None:
        """Start a new stream (the buffers stay; every row is masked until rewritten)."""
        self.cache.reset()

    def prefill(self, ids: list[int] | np.ndarray, *, all_logits: bool = False) -> np.ndarray:
        """Feed prompt tokens; logits of the last one [V] (or of every one [n, V])."""
        return self.model.prefill(self.cache, ids, all_logits=all_logits)

    def decode(self, token: int) -> np.ndarray:
        """Feed one token; its logits [V] (a view into the pool, overwritten by the next call)."""
        return self.model.decode(self.cache, token)

    @property
    def engine(self) -> Engine:
        """Itself: an engine is the source of a fresh stream (decoding.Source), as a Session is of a conversation."""
        return self

    def begin(self, ids: Sequence[int]) -> Reply:
        """Start a fresh stream on `ids` (reset, prefill): the reply a decode loop advances (decoding.Turn)."""
        return Reply(self, ids)

    def resume(self, conversation: Sequence[int]) -> list[int]:
        """The ids to send for a reply to the whole `conversation` (decoding.Source): all of them, since a fresh
        stream holds nothing."""
        return list(conversation)

    def truncate(self, n: int) -> None:
        """Drop the last n tokens fed (at most `ring.rollback_limit()`, else RollbackError); the stream
        continues as if they had never been fed."""
        self.cache.truncate(n)

    def restore_state(self, tokens: int, written: int, row_pos: np.ndarray) -> None:
        """Set the ring's bookkeeping (after the caller put the matching K/V rows back into the pool)."""
        self.cache.restore_state(tokens, written, row_pos)

    @property
    def fused_argmax(self) -> bool:
        return self.model.fused_argmax

    @property
    def exact_rows(self) -> int:
        return self.model.exact_rows

    def decoded_argmax(self) -> int:
        """numpy.argmax of the last decode step's logits, as the graph computed it (fused_argmax only)."""
        return self.model.decoded_argmax(self.cache)


class Reply:
    """A reply on a fresh stream of the engine (decoding.Turn): its tokens go straight to the engine; nothing
    outlives the stream, so tokens fed but never handed out need no taking back."""

    def __init__(self, engine: Engine, ids: Sequence[int]):
        self.engine, self.context_ids, self._last = engine, list(ids), -1
        engine.reset()
        self.logits = engine.prefill(self.context_ids)
        # Bound once, as the reply starts: the decode loop calls them per token.
        self.decode, self.feed = engine.decode, engine.prefill

    def context(self) -> Sequence[int]:
        return self.context_ids

    def sampled(self, token: int) -> None:
        self._last = token

    def extend(self, tokens: Sequence[int]) -> np.ndarray:
        return self.engine.prefill([self._last, *tokens], all_logits=True)

    def drop(self, n: int) -> None:
        self.engine.truncate(n)

    def unsay(self, n: int) -> None:
        pass


def _geometry(bundle: Bundle, opts: LoadOptions) -> RingGeometry:
    c = bundle.manifest.cache
    sinks = c.sinks if opts.sinks is None else opts.sinks
    window = c.window if opts.window is None else opts.window
    context = bundle.manifest.model.max_position_embeddings
    problem = geometry_problem(sinks, window, context)
    if problem:
        raise BundleError(problem)
    slack = c.slack if opts.slack is None else opts.slack
    return RingGeometry(sinks=sinks, window=window, slack=slack)


class TargetMismatchWarning(UserWarning):
    """A bundle loaded under another target than the one it was exported for."""


def load(
    bundle_dir: str | Path, opts: LoadOptions | None = None, *, target: str | TargetProfile | None = None
) -> Engine:
    """Open, verify and load a bundle, optionally for a target (a profile, a name, a YAML path or "auto": the
    target the bundle was exported for where it fits this machine, else detected; targets/choose.py).

    Raises an EdgeRuntimeError subclass naming the problem (bad checksum, version, geometry, budget).
    """
    opts = opts or LoadOptions()
    bundle = open_bundle(bundle_dir, verify=opts.verify)
    if isinstance(target, str):
        import warnings

        from .targets.choose import choose_target

        own = bundle.manifest.provenance.get("target")
        choice = choose_target(target, own if isinstance(own, str) else None)
        if choice.warning:
            warnings.warn(choice.warning, TargetMismatchWarning, stacklevel=2)
        target = choice.profile
    if target is not None:
        opts = apply_target(opts, target, bundle)
    model = Model(bundle, opts)
    return Engine(model, model.caches[0])


def _local_layers(path: Path, m: Manifest) -> LocalLayers | None:
    """The model's local layers from the manifest (e.g. Gemma 3), None where every layer is global. Their
    graph must give them their own ring (refused otherwise: a bundle exported before it had one)."""
    if m.model.local_window is None or m.model.local_rope_inv_freq is None:
        return None
    if not m.graph.local_cache_layers:
        raise BundleError(
            f"'{path}' holds a model with local layers exported before they had their own ring (every layer's "
            "cache was the global ring's); re-export it with edge-export"
        )
    return LocalLayers(window=m.model.local_window, inv_freq=np.asarray(m.model.local_rope_inv_freq, np.float64))
