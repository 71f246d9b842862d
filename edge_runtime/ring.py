"""StreamingLLM bookkeeping for the static ring-buffer KV cache (docs/architecture.md §4). Pure numpy, no model
knowledge.

Buffer rows (per layer, K and V each `[1, H_kv, capacity, D]`):

    | sink 0 .. sink S-1 | ring slot 0 .. ring slot R-1 |      R = W + slack
      token t < S -> row t;  token t >= S -> row S + (t - S) mod R

Keys are stored after RoPE at their absolute position and never move. A row attends the sinks plus the
W most recent tokens (itself included). The query is rotated twice: at its absolute position for the
window columns and at its *cache-logical* position min(t, S + W - 1) for the sink columns, which is
exactly StreamingLLM's "positions within the cache". `slack` extra ring slots let a chunk of up to
`slack + 1` tokens be prefilled past capacity without overwriting keys its own earlier rows still need.

cos/sin are computed here in float64 (fp32 angles at position 1e7 are off by ~1 rad) and cast once.

A model with local sliding-window layers (Gemma 3, Ministral, Qwen with a window) keeps a second ring for
them (`local_geometry`: no sinks, their window, as much slack), which the same RingState plans, rolls back
and snapshots in step with this one (docs/architecture.md §5.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import EdgeRuntimeError, RollbackError
from .manifest import ROW_CACHE

MASKED = -1e30  # additive mask value; finite so a fully-masked row would not produce NaN in fp32
MASKED_FP16 = -65504.0
# row_cache of a call on one cache (graphs that take a batch of caches: manifest.ROW_CACHE): no rows named.
ONE_CACHE = np.zeros(0, np.int64)


def geometry_problem(sinks: int, window: int, context: int) -> str | None:
    """Why a cache geometry cannot serve a model trained on `context` positions, or None if it can.
    Positions within the cache run to sinks + window - 1 and must stay inside the trained context."""
    if sinks < 0 or window < 1:
        return f"cache geometry sinks={sinks}, window={window}: need sinks >= 0 and window >= 1"
    if sinks + window > context:
        return (
            f"sinks + window = {sinks + window} exceeds the model's trained context {context} "
            f"(max_position_embeddings); use --window {context - sinks} or less"
        )
    return None


@dataclass(frozen=True)
class RingGeometry:
    sinks: int  # S
    window: int  # W: recent tokens attended, the current one included
    slack: int = 0  # extra ring rows for chunked prefill past capacity

    def __post_init__(self) -> None:
        if self.sinks < 0 or self.window < 1 or self.slack < 0:
            raise EdgeRuntimeError(
                f"invalid cache geometry sinks={self.sinks}, window={self.window}, slack={self.slack}: "
                "need sinks >= 0, window >= 1, slack >= 0"
            )

    @property
    def ring(self) -> int:
        return self.window + self.slack

    @property
    def capacity(self) -> int:
        """Rows of each K/V buffer."""
        return self.sinks + self.ring

    @property
    def sink_rows(self) -> int:
        """Rows the `ort` graph's sink correction reads: the sinks, or one row (whose correction is
        exactly zero, see RingState._sink_position) without sinks: a zero-row operand crashed ONNX
        Runtime 1.32 (SIGFPE, seen with Einsum), so none is ever fed."""
        return max(self.sinks, 1)

    @property
    def logical_capacity(self) -> int:
        """Tokens one row attends at most: S + W."""
        return self.sinks + self.window

    def slot(self, t: int) -> int:
        """The row token t is written to (sinks keep theirs; the rest cycle through the ring's R rows)."""
        return t if t < self.sinks else self.sinks + (t - self.sinks) % self.ring

    def slots(self, t: np.ndarray) -> np.ndarray:
        """`slot` of each token index in `t`."""
        return np.where(t < self.sinks, t, self.sinks + (t - self.sinks) % self.ring)

    def max_chunk(self, t0: int, want: int | None = None) -> int:
        """Most tokens from token index t0 that one graph call may take, of the `want` the caller has
        (default: as many as the ring allows).

        Rows must be contiguous (the in-graph scatter does not wrap), and once a chunk's writes evict
        older tokens (token t >= capacity evicts t - R) it may hold at most slack + 1 tokens, or its
        first row would lose a key inside its window. A chunk that writes sinks ends before any row
        needs the sink-rotated query (t > S + W - 1). That rule is applied to the chunk actually taken:
        a prompt shorter than S + W goes in one call with its sinks, not as the sinks and then the rest
        (a second pass over every weight).
        """
        contiguous = self.capacity - (t0 if t0 < self.sinks else self.slot(t0))
        n = min(contiguous, max(self.capacity - t0, self.slack + 1))
        if want is not None:
            n = min(n, want)
        if t0 < self.sinks and t0 + n > self.logical_capacity:
            # Write the sinks in an earlier call than any row past S + W - 1: no graph call then both
            # creates the sinks and rotates the query apart for them (one case fewer to validate).
            n = self.sinks - t0
        return n


@dataclass(frozen=True)
class LocalLayers:
    """A model's local layers as the runtime sees them (manifest model.local_window / local_rope_inv_freq)."""

    window: int  # tokens a local layer attends back, itself included
    inv_freq: np.ndarray  # [R/2] float64: their RoPE


def local_geometry(geometry: RingGeometry, window: int) -> RingGeometry:
    """The local layers' own ring (docs/architecture.md §5.2): no sinks, their window (at most the global
    W, the most any layer attends), and as many slack rows as window rows, so that once it has wrapped a
    prefill chunk or a rollback may still span a whole local window (both are bounded by slack + 1); but
    never more rows than the global ring (a window W near the local one), nor less slack than it has."""
    w = min(window, geometry.window)
    return RingGeometry(sinks=0, window=w, slack=max(geometry.slack, min(w, geometry.capacity - w)))


@dataclass
class StepInputs:
    """Host-side graph inputs for one call covering tokens [t0, t0 + n)."""

    write_index: np.ndarray  # [1] int64: buffer row of the first new token
    cos: np.ndarray  # [n, R/2] at absolute positions
    sin: np.ndarray
    cos_sink: np.ndarray  # [n, R/2] at cache-logical positions (for the sink columns)
    sin_sink: np.ndarray
    attn_mask: np.ndarray  # [n, K] additive, K = attended columns (capacity, or capacity + n for `trt`)
    sink_mask: np.ndarray  # [K] bool: column uses the sink-rotated query
    sink_rows: np.ndarray  # [1] int64: max(S, 1), the rows the `ort` graph's sink correction reads
    ring_full: np.ndarray  # [] bool: some token is past S + W - 1 (`ort` leaves GroupQueryAttention)
    seqlens_k: np.ndarray  # [1] int32: t0 + n - 1, GroupQueryAttention's last row (row r = token r until full)
    total_len: np.ndarray  # [] int32: t0 + n
    # Local layers (e.g. Gemma 3), where the model has them: their RoPE at absolute positions, their own ring's
    # mask and the row of the first new token in it.
    cos_local: np.ndarray | None = None  # [n, R/2]
    sin_local: np.ndarray | None = None
    attn_mask_local: np.ndarray | None = None  # [n, K_local]
    write_index_local: np.ndarray | None = None  # [1] int64

    def feeds(self, ids: np.ndarray, keep: int) -> dict[str, np.ndarray]:
        """The graph's per-call inputs by name (the I/O contract of exporters/decoder.py); a graph takes
        the subset it declares (`sink_mask`: `trt`; `sink_rows`, `write_index`, `ring_full`, `seqlens_k`,
        `total_sequence_length`: `ort`)."""
        feeds = {
            "input_ids": np.ascontiguousarray(ids, dtype=np.int64).reshape(1, -1),
            "cos": self.cos,
            "sin": self.sin,
            "cos_sink": self.cos_sink,
            "sin_sink": self.sin_sink,
            "attn_mask": self.attn_mask,
            "sink_mask": self.sink_mask,
            "sink_rows": self.sink_rows,
            "ring_full": self.ring_full,
            "seqlens_k": self.seqlens_k,
            "total_sequence_length": self.total_len,
            "num_logits_to_keep": np.array([keep], dtype=np.int64),
            "write_index": self.write_index,
            ROW_CACHE: ONE_CACHE,
        }
        if self.attn_mask_local is not None:
            feeds |= {
                "cos_local": self.cos_local,
                "sin_local": self.sin_local,
                "attn_mask_local": self.attn_mask_local,
                "write_index_local": self.write_index_local,
            }
        return feeds


@dataclass
class DecodeBuffers:
    """Preallocated single-token graph inputs (see `RingState.decode_into`)."""

    cos: np.ndarray  # [1, R/2]
    sin: np.ndarray
    cos_sink: np.ndarray
    sin_sink: np.ndarray
    attn_mask: np.ndarray  # [1, K]
    sink_mask: np.ndarray  # [K]
    write_index: np.ndarray  # [1] int64
    sink_rows: np.ndarray  # [1] int64, constant: max(S, 1)
    ring_full: np.ndarray  # [] bool
    seqlens_k: np.ndarray  # [1] int32
    total_len: np.ndarray  # [] int32
    cos_cache: np.ndarray  # [C, R/2] at the rows' positions while the ring is linear (RingState.rotary_cache)
    sin_cache: np.ndarray
    masked: float
    angle: np.ndarray  # [R/2] float64 scratch
    trig: np.ndarray  # [R/2] float64 scratch
    # The local layers' ring's own buffers (models with local layers only): its cos/sin are the local
    # RoPE's, its attn_mask and write_index the graph's attn_mask_local and write_index_local.
    local: DecodeBuffers | None = None


class RingState:
    """What the host tracks per sequence: tokens processed and the position held by every buffer row."""

    def __init__(
        self,
        geometry: RingGeometry,
        inv_freq: np.ndarray,
        position_offset: int = 0,
        *,
        gqa_while_linear: bool = False,
        local: LocalLayers | None = None,
        sink_query: bool = True,
    ):
        """`gqa_while_linear`: the graph reads only the rotary cache (GroupQueryAttention) until ring_full,
        so decode steps before then skip the cos/sin and sink-angle inputs: the `ort` graphs of 0.3.
        `local`: the model's local layers (their window and RoPE), which keep their own ring
        (`local_geometry`) in step with this one: every call then also gets its inputs. `sink_query`: decode
        writes the sink columns' query angles (False for the local ring: its layers have no sink columns)."""
        self.gqa_while_linear = gqa_while_linear
        self.sink_query = sink_query
        self.geometry = geometry
        self.inv_freq = np.asarray(inv_freq, dtype=np.float64)  # [R/2]
        self.local_ring = None
        if local is not None:
            self.local_ring = RingState(
                local_geometry(geometry, local.window), local.inv_freq, position_offset, sink_query=False
            )
        self.position_offset = position_offset  # absolute position of token 0 (tests start it at 1e7)
        self.tokens = 0
        # High-water mark of `tokens` since the last reset: a rollback lowers `tokens`, not what the
        # writes past it overwrote, so the rows still intact are counted from here.
        self.written = 0
        self.row_pos = np.full(geometry.capacity, -1, dtype=np.int64)  # -1: empty row

    def reset(self) -> None:
        self.tokens = 0
        self.written = 0
        self.row_pos[:] = -1
        if self.local_ring is not None:
            self.local_ring.reset()

    @property
    def rows(self) -> int:
        """Rows of bookkeeping `state` covers: this ring's, then the local ring's."""
        return self.geometry.capacity + (0 if self.local_ring is None else self.local_ring.geometry.capacity)

    def max_chunk(self, t0: int, want: int | None = None) -> int:
        """Most tokens from token t0 one graph call may take of `want`: RingGeometry.max_chunk of every ring."""
        n = self.geometry.max_chunk(t0, want)
        return n if self.local_ring is None else min(n, self.local_ring.geometry.max_chunk(t0, want))

    # -- rollback ----------------------------------------------------------------------------------

    @property
    def overwritten(self) -> int:
        """Tokens [sinks, overwritten) have lost their rows (token t's row is reused by t + R)."""
        return max(self.geometry.sinks, self.written - self.geometry.ring)

    def rollback_limit(self) -> int:
        """Most tokens `truncate` can drop exactly. Until a ring row is reused, all of them; after, the
        next token must still find the W - 1 tokens before it, so `written - tokens` may reach slack + 1
        (the row of the oldest of the window's tokens is the one the next token takes)."""
        g = self.geometry
        if self.written <= g.capacity:
            limit = self.tokens
        else:
            limit = max(0, min(self.tokens, g.slack + 1 - (self.written - self.tokens)))
        return limit if self.local_ring is None else min(limit, self.local_ring.rollback_limit())

    def truncate(self, n: int) -> None:
        """Forget the last n tokens; their rows are masked until rewritten. Refuses more than
        `rollback_limit()`: dropping those would leave the next token's window with evicted keys."""
        limit = self.rollback_limit()
        if not 0 <= n <= limit:
            g, which = self.geometry, "the ring"
            if self.local_ring is not None and self.local_ring.rollback_limit() == limit:
                g, which = self.local_ring.geometry, "the local layers' ring"  # the one that wrapped first
            raise RollbackError(
                f"cannot drop {n} tokens: at most {limit} can be dropped exactly here ({which} has reused "
                f"rows; {g.slack} slack rows allow rolling back {g.slack + 1} tokens past the window of "
                f"{g.window}, less what earlier rollbacks not yet re-fed used); reset and re-feed instead"
            )
        self.tokens -= n
        # Rows of dropped tokens hold keys at positions ahead of the stream: they must not look visible
        # (sync_decode shows every row whose position is within the window, future ones included).
        self.row_pos[self.row_pos >= self.tokens + self.position_offset] = -1
        if self.local_ring is not None:
            self.local_ring.truncate(n)

    def state(self) -> tuple[int, int, np.ndarray]:
        """(tokens, written, row_pos copy): everything `set_state` needs besides the rows' K/V. With local
        layers row_pos covers both rings, this one's rows first (`rows` in all)."""
        if self.local_ring is None:
            return self.tokens, self.written, self.row_pos.copy()
        return self.tokens, self.written, np.concatenate([self.row_pos, self.local_ring.row_pos])

    def set_state(self, tokens: int, written: int, row_pos: np.ndarray) -> None:
        if row_pos.shape != (self.rows,) or not 0 <= tokens <= written:
            raise EdgeRuntimeError(f"ring state of {row_pos.shape[0]} rows, tokens {tokens}, written {written} "
                                   f"does not fit this ring of {self.rows} rows")  # fmt: skip
        self.tokens, self.written = tokens, written
        c = self.geometry.capacity
        self.row_pos[:] = row_pos[:c]
        if self.local_ring is not None:
            self.local_ring.set_state(tokens, written, row_pos[c:])

    def rotary_cache(self, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """cos/sin [C, R/2] of buffer row r's position while the ring is linear (row r holds token r),
        for GroupQueryAttention, which rotates the rows it writes at their row index."""
        return self._angles(np.arange(self.geometry.capacity, dtype=np.int64) + self.position_offset, dtype)

    def _angles(self, positions: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        a = positions.astype(np.float64)[:, None] * self.inv_freq[None, :]
        return np.cos(a).astype(dtype), np.sin(a).astype(dtype)

    def plan(self, n: int, *, new_rows_as_columns: bool, dtype: np.dtype = np.float32) -> StepInputs:
        """Inputs for the next `n` tokens (n <= geometry.max_chunk(tokens)); advances the state.

        `new_rows_as_columns`: the graph attends [buffer rows ..., this call's new rows] (the `trt`
        flavor, which cannot update the buffer in place) instead of the updated buffer (`ort`).
        """
        g = self.geometry
        t0 = self.tokens
        most = self.max_chunk(t0, n)
        if not 1 <= n <= most:
            raise EdgeRuntimeError(f"chunk of {n} tokens at token {t0} exceeds the ring's limit {most}")
        steps = np.arange(t0, t0 + n, dtype=np.int64)
        pos = steps + self.position_offset  # absolute positions
        logical = self._sink_position(steps) + self.position_offset
        first = g.slot(t0)
        rows = np.arange(first, first + n)

        old = self.row_pos.copy()
        self.row_pos[rows] = pos
        if new_rows_as_columns:
            col_pos = np.concatenate([old, pos])
            col_sink = np.concatenate([np.arange(g.capacity) < g.sinks, steps < g.sinks])
        else:
            col_pos = self.row_pos
            col_sink = np.arange(col_pos.shape[0]) < g.sinks
        diff = pos[:, None] - col_pos[None, :]  # [n, K]: how far back each column's token is
        visible = (col_pos[None, :] >= 0) & (diff >= 0) & (col_sink[None, :] | (diff < g.window))
        masked = MASKED_FP16 if np.dtype(dtype) == np.float16 else MASKED
        cos, sin = self._angles(pos, dtype)
        cos_s, sin_s = self._angles(logical, dtype)
        local = {}
        if self.local_ring is not None:  # its cos/sin are at absolute positions with the local RoPE
            lp = self.local_ring.plan(n, new_rows_as_columns=new_rows_as_columns, dtype=dtype)
            local = {
                "cos_local": lp.cos,
                "sin_local": lp.sin,
                "attn_mask_local": lp.attn_mask,
                "write_index_local": lp.write_index,
            }
        self.tokens += n
        self.written = max(self.written, self.tokens)
        return StepInputs(
            **local,
            write_index=np.array([first], dtype=np.int64),
            cos=cos,
            sin=sin,
            cos_sink=cos_s,
            sin_sink=sin_s,
            attn_mask=np.where(visible, 0.0, masked).astype(dtype),
            sink_mask=col_sink.copy(),
            sink_rows=np.array([g.sink_rows], dtype=np.int64),
            ring_full=np.array(t0 + n > g.logical_capacity),
            seqlens_k=np.array([t0 + n - 1], dtype=np.int32),
            total_len=np.array(t0 + n, dtype=np.int32),
        )

    # -- the decode hot path: one token, every input written in place, no array allocated ---------

    def sync_decode(self, bufs: DecodeBuffers) -> None:
        """Rebuild the decode inputs that `decode_into` maintains incrementally, after a prefill:
        the visibility of every buffer row for the next token, and the sink-query angles."""
        g = self.geometry
        pos = self.tokens + self.position_offset
        sinks = np.arange(g.capacity) < g.sinks
        visible = (self.row_pos >= 0) & (sinks | (pos - self.row_pos < g.window))
        bufs.attn_mask[0, : g.capacity] = np.where(visible, 0.0, bufs.masked)
        if self.sink_query:
            self._sink_angles(bufs, self.tokens)
        if self.local_ring is not None:
            self.local_ring.sync_decode(self._local_buffers(bufs))

    def _sink_position(self, t: np.ndarray | int) -> np.ndarray | int:
        """Token index at which a query is rotated for the sink columns: its cache-logical position.
        Without sinks there are no sink columns, and the `ort` graph's correction must vanish: its
        absolute one (then the sink and window rotations are equal)."""
        g = self.geometry
        if g.sinks == 0:
            return t
        last = g.logical_capacity - 1
        return np.minimum(t, last) if isinstance(t, np.ndarray) else min(t, last)  # decode: plain ints

    def _sink_angles(self, bufs: DecodeBuffers, t: int) -> None:
        np.multiply(self.inv_freq, float(self._sink_position(t) + self.position_offset), out=bufs.angle)
        np.cos(bufs.angle, out=bufs.trig)
        bufs.cos_sink[0] = bufs.trig
        np.sin(bufs.angle, out=bufs.trig)
        bufs.sin_sink[0] = bufs.trig

    def decode_into(self, bufs: DecodeBuffers, *, new_rows_as_columns: bool) -> int:
        """Write the inputs for the next single token into `bufs`; returns its buffer row.

        Keeps `bufs.attn_mask` incrementally: the token leaving the window is masked, the new row
        unmasked (for the host-copy flavor only once its row is written: see `decode_done`).
        """
        g = self.geometry
        t = self.tokens
        leaving = t - g.window
        if leaving >= g.sinks:
            bufs.attn_mask[0, g.slot(leaving)] = bufs.masked
        row = g.slot(t)
        self.row_pos[row] = t + self.position_offset
        if new_rows_as_columns:
            bufs.attn_mask[0, g.capacity] = 0.0
            bufs.sink_mask[g.capacity] = t < g.sinks
        else:
            bufs.attn_mask[0, row] = 0.0
        if self.local_ring is not None:
            self.local_ring.decode_into(self._local_buffers(bufs), new_rows_as_columns=new_rows_as_columns)
        full = t >= g.logical_capacity
        # Each numpy call here costs microseconds against caches the step just flushed; the GQA branch
        # reads none of these inputs, so they are first written on the step that turns ring_full on.
        if full or not self.gqa_while_linear:
            np.multiply(self.inv_freq, float(t + self.position_offset), out=bufs.angle)
            np.cos(bufs.angle, out=bufs.trig)
            bufs.cos[0] = bufs.trig
            np.sin(bufs.angle, out=bufs.trig)
            bufs.sin[0] = bufs.trig
            # past S + W - 1 the sink query stays at S + W - 1 (sync_decode, or here on the first full step)
            first_full = self.gqa_while_linear and t == g.logical_capacity
            if self.sink_query and (not full or g.sinks == 0 or first_full):
                self._sink_angles(bufs, t)
        bufs.ring_full[()] = full
        bufs.seqlens_k[0] = t
        bufs.total_len[()] = t + 1
        bufs.write_index[0] = row
        self.tokens = t + 1
        if t >= self.written:
            self.written = t + 1
        return row

    def _local_buffers(self, bufs: DecodeBuffers) -> DecodeBuffers:
        if bufs.local is None:
            # a wiring bug
            raise EdgeRuntimeError("decode buffers without the local ring's, for a model with local layers")
        return bufs.local

    def decode_done(self, bufs: DecodeBuffers, row: int) -> None:
        """Host-copy flavor: the new row now holds its token, so its column becomes visible."""
        bufs.attn_mask[0, row] = 0.0
        if self.local_ring is not None:
            local = self._local_buffers(bufs)
            self.local_ring.decode_done(local, int(local.write_index[0]))

    def chunks(self, n_tokens: int, max_chunk: int | None = None) -> list[int]:
        """Split n_tokens (starting at the current state) into graph calls: at the ring's wrap point and,
        past capacity, every slack + 1 tokens."""
        sizes, t = [], self.tokens
        while n_tokens > 0:
            n = self.max_chunk(t, min(n_tokens, max_chunk or n_tokens))
            sizes.append(n)
            t += n
            n_tokens -= n
        return sizes
