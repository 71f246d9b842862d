"""Continuous batching of one model's steps across threads, each driving a cache of its own.

edge-serve runs each request on a thread of its own (`--parallel`), every one a Session on its own cache of one
Model. Decode is memory-bound: a step that decodes one token for each of B caches reads the weights once, so it
costs far less than B steps. `StepBatcher` is where those threads meet:

    thread A: model.decode(cache 0, t) ─┐
    thread B: model.decode(cache 2, t) ─┼─► one Model.decode_batch([0, 2, 3], ...) ─► each thread wakes with its
    thread C: model.decode(cache 3, t) ─┘   cache's logits in its own pool, as a decode of its own leaves them

- A decode step waits until every stream that is not busy with a prompt has asked for its step (the batch is
  then whole), or `wait_s` after the first one asked (a stream busy on the host, sampling under a grammar say,
  does not hold the others back for longer than that).
- A prompt goes in chunks of at most CHUNK_BESIDE_STREAMS tokens, each a call of its own; the running streams'
  decode steps take turns with them, so a long new prompt delays each running stream by one chunk per step, not
  by the whole prompt.
- Whichever waiting thread finds the batch ready runs it (no thread of the batcher's own); one model call runs at
  a time.

Rows of one batch round as one row alone does where the graph's kernels say so (Model.exact_rows: the batch is at
most that many rows, then every stream's tokens are those it would decode alone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kv_cache import KVCache

# Tokens of a prompt per call while other streams decode. It bounds the stall a new prompt puts between a running
# stream's tokens to one chunk's call (SmolLM2-135M int4 on 2 AMD EPYC cores: a lone 64-token prompt's TTFT was
# 59 ms in benchmarks/batched-serving.md, so some 120 ms for 128, against a 3.5 ms decode step), and a chunk still
# has rows enough for the prompt kernels' tiles. Not tuned: a smaller one trades the new request's TTFT for the
# running streams' worst gap.
CHUNK_BESIDE_STREAMS = 128
# How long a decode step waits for streams that have not asked yet. A stream's host work between its steps took
# about 0.4 ms a token (sampling, detokenizing: cProfile of stream_generate, same CPU); four threads' calls were
# 0.27 ms apart at the median, so 4 ms waits out a slow stream without holding the others a step's time.
DEFAULT_WAIT_S = 0.004


@dataclass
class _Step:
    cache: KVCache
    token: int
    done: bool = False
    error: BaseException | None = None


class StepBatcher:
    def __init__(
        self,
        run: Callable[[Sequence[KVCache], Sequence[int]], None],
        max_batch: int,
        *,
        wait_s: float = DEFAULT_WAIT_S,
        observe: Callable[[int], None] | None = None,
    ):
        """`run(caches, tokens)`: one step over those caches (Model.decode_batch); `max_batch`: most rows a call;
        `observe(rows)`: told each batch's size (edge-serve's occupancy histogram)."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._run, self.max_batch, self.wait_s, self._observe = run, max_batch, wait_s, observe
        self._cond = threading.Condition()
        self._pending: list[_Step] = []
        self._oldest = 0.0  # when the first pending step asked
        self._running = False
        self._streams = 0  # generations in progress (stream())
        self._prefilling = 0  # of them, inside a prompt
        self._chunks_waiting = 0
        self._last_was_chunk = False

    @contextmanager
    def stream(self) -> Iterator[None]:
        """Around one generation: the batcher waits for the streams it knows of before running a step."""
        with self._cond:
            self._streams += 1
        try:
            yield
        finally:
            with self._cond:
                self._streams -= 1
                self._cond.notify_all()

    @contextmanager
    def prefilling(self) -> Iterator[None]:
        """Around a prompt (Model.prefill): decode steps do not wait for this stream meanwhile."""
        with self._cond:
            self._prefilling += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._prefilling -= 1
                self._cond.notify_all()

    @contextmanager
    def chunk(self) -> Iterator[None]:
        """Around one chunk's call: runs alone, taking turns with the decode steps waiting."""
        with self._cond:
            self._chunks_waiting += 1
            try:
                # after a chunk, the decode steps waiting take their turn first
                while self._running or (self._pending and self._last_was_chunk):
                    self._cond.wait()
            finally:
                self._chunks_waiting -= 1
            self._running = True
        try:
            yield
        finally:
            with self._cond:
                self._running, self._last_was_chunk = False, True
                self._cond.notify_all()

    def decode(self, cache: KVCache, token: int) -> None:
        """One decode step of `cache`, in a batch with the other streams' that arrive with it; returns when its
        logits are in the cache's pool (raising what the call raised)."""
        step = _Step(cache, token)
        with self._cond:
            if not self._pending:
                self._oldest = time.perf_counter()
            self._pending.append(step)
            self._cond.notify_all()
            while not step.done:
                delay = self._delay()
                if delay is None:
                    self._cond.wait()
                elif delay > 0:
                    self._cond.wait(delay)
                else:
                    self._run_pending()
        if step.error is not None:
            raise step.error

    def _delay(self) -> float | None:
        """Seconds until the pending steps should run (0: now), None: not this thread's turn (a call runs)."""
        if self._running or not self._pending:
            return None
        if self._chunks_waiting and not self._last_was_chunk:
            return None  # a prompt's chunk goes first, then these steps
        if self._chunks_waiting or len(self._pending) >= min(self.max_batch, self._streams - self._prefilling):
            return 0.0
        return max(0.0, self._oldest + self.wait_s - time.perf_counter())

    def _run_pending(self) -> None:
        """Run the oldest pending steps as one call (the condition held on entry and on return)."""
        batch = self._pending[: self.max_batch]
        del self._pending[: self.max_batch]
        if self._pending:
            self._oldest = time.perf_counter()
        self._running = True
        self._cond.release()
        error: BaseException | None = None
        try:
            if self._observe is not None:
                self._observe(len(batch))
            self._run([s.cache for s in batch], [s.token for s in batch])
        except BaseException as e:  # every stream of the batch sees it (KeyboardInterrupt included)
            error = e
        finally:
            self._cond.acquire()
            self._running, self._last_was_chunk = False, False
            for s in batch:
                s.done, s.error = True, error
            self._cond.notify_all()
