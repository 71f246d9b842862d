"""The engine's worker threads, their bounded queue, and the bridge from their tokens to asyncio.

`parallel` worker threads (edge-serve --parallel) take requests in arrival order, each running one generation
on a slot of its own (a Session on its own cache of the one model). With more than one, the model's decode
steps go through a StepBatcher (batching.py): the steps the running generations ask for together run as one
batched call, and a new request's prompt goes in chunks between them (continuous batching). Requests wait in a
bounded queue; a full queue is a 503 with Retry-After at once rather than a client left hanging. A worker posts
each token to the request's asyncio queue with `call_soon_threadsafe`; a request whose client went away sets its
`cancelled` event and its worker stops before feeding the next token, leaving the tokens said so far in the
slot's ring.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from edge_runtime.errors import ConstraintError, EdgeRuntimeError, RingOverflowError
from edge_runtime.generate import FinishReason, GenerationConfig, stream_generate
from edge_runtime.sampling import LogitBias
from edge_runtime.telemetry import Sampler as PowerSampler
from edge_runtime.telemetry.accounting import energy_figures
from edge_runtime.tokenizer import Tokenizer

from .errors import APIError
from .metrics import Metrics
from .schemas import GenParams, TokenLogprob
from .slots import SlotPool

if TYPE_CHECKING:
    from edge_runtime.speculative import SpeculativeDecoder

log = logging.getLogger("edge_serve")


@dataclass(frozen=True)
class Piece:
    """One generated token: the text it completed (may be empty; the last token's carries any text held back
    for a stop string that never came) and, if asked, its logprobs."""

    text: str
    logprob: TokenLogprob | None


@dataclass(frozen=True)
class Finished:
    finish_reason: Literal["stop", "length", "cancelled"]  # OpenAI's words ("tool_calls" is the route's)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    slot: int
    timings: dict[str, Any]
    energy: dict[str, Any] | None


@dataclass(frozen=True)
class Failure:
    error: APIError


Event = Piece | Finished | Failure


@dataclass
class Job:
    prompt: list[int]
    params: GenParams
    loop: asyncio.AbstractEventLoop
    arrival: float = field(default_factory=time.perf_counter)
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def post(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop closed (server stopping): nobody is listening any more
            pass

    def cancel(self) -> None:
        self.cancelled.set()


class Scheduler:
    def __init__(
        self,
        pool: SlotPool,
        tokenizer: Tokenizer,
        eos_ids: Sequence[int],
        metrics: Metrics,
        *,
        queue_size: int,
        power: PowerSampler | None = None,
        speculative: SpeculativeDecoder | None = None,
        parallel: int = 1,
    ):
        """`parallel`: generations run at once (at most one a slot; speculation needs 1)."""
        if not 1 <= parallel <= len(pool.slots):
            raise EdgeRuntimeError(
                f"--parallel {parallel} needs as many --slots, one per generation; got {len(pool.slots)}"
            )
        if parallel > 1 and speculative is not None:
            raise EdgeRuntimeError("speculative decoding runs one generation at a time: use --parallel 1 with it")
        self.pool, self.tok, self.eos, self.metrics = pool, tokenizer, frozenset(eos_ids), metrics
        self.power = power
        # One decoder for every slot: the worker runs one generation at a time, and each starts its
        # proposer from that slot's ring; its measured call costs carry over between requests.
        self.speculative = speculative
        self.queue_size = queue_size
        self.parallel = parallel
        self._q: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._closing = False
        self._current: list[Job] = []
        self._avg_job_s = 1.0  # an EWMA of generation time, for Retry-After
        # Busy periods (some generation running): their seconds and tokens give the aggregate tokens per second;
        # with several generations at once the power meter samples whole busy periods, not one request's.
        self._busy_since: float | None = None
        self._busy_s = 0.0
        self._busy_tokens = 0
        self._period_tokens = 0
        self.batcher = None
        if parallel > 1:
            self.batcher = pool.engine.model.batch_steps(observe=metrics.batch_rows.observe)
        metrics.queue_capacity.set(queue_size)
        metrics.slots.set(len(pool.slots))
        metrics.parallel.set(parallel)
        self._threads = [
            threading.Thread(target=self._work, name=f"edge-serve-engine-{i}", daemon=True) for i in range(parallel)
        ]
        for t in self._threads:
            t.start()

    # -- the asyncio side ------------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return self._waiting

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._closing:
                raise APIError(503, "the server is shutting down", code="shutting_down")
            if self._waiting >= self.queue_size:
                self.metrics.rejected.labels("queue_full").inc()
                retry = max(1, math.ceil(self._avg_job_s * (self._waiting + 1) / self.parallel))
                raise APIError(
                    503,
                    f"the queue is full ({self._waiting} requests waiting for the engine); retry in {retry} s",
                    code="queue_full",
                    headers={"Retry-After": str(retry)},
                )
            self._waiting += 1
            self.metrics.queue_depth.set(self._waiting)
        self._q.put(job)

    def close(self, timeout: float = 10.0) -> None:
        """Refuse new work, cancel what waits and what runs, and stop the worker (bounded wait)."""
        with self._lock:
            self._closing = True
            current = list(self._current)
        for job in current:
            job.cancel()
        while True:
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.post(Failure(APIError(503, "the server is shutting down", code="shutting_down")))
        for _ in self._threads:
            self._q.put(None)
        end = time.perf_counter() + timeout
        for t in self._threads:
            t.join(max(0.0, end - time.perf_counter()))

    # -- the worker thread -----------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            t0 = time.perf_counter()
            with self._lock:
                self._waiting -= 1
                self.metrics.queue_depth.set(self._waiting)
                self._current.append(job)
                if len(self._current) == 1:
                    self._busy_start(t0)
                self.metrics.slots_busy.set(len(self._current))
            self.metrics.queue_wait.observe(t0 - job.arrival)
            try:
                self._run(job)
            except Exception:  # a bug of ours: the worker must survive it, the client gets a 500 without it
                log.exception("generation failed")
                job.post(Failure(APIError(500, "internal error while generating; see the server log")))
            finally:
                self.metrics.slots_used.set(self.pool.used())
                with self._lock:
                    self._current.remove(job)
                    self.metrics.slots_busy.set(len(self._current))
                    if not self._current:
                        self._busy_end(time.perf_counter())
                self._avg_job_s = 0.8 * self._avg_job_s + 0.2 * (time.perf_counter() - t0)

    def _busy_start(self, t: float) -> None:
        """The first generation of a busy period began (the lock held)."""
        self._busy_since, self._period_tokens = t, 0
        if self.parallel > 1 and self.power is not None:
            self.power.start()
            self.power.mark("decode")

    def _busy_end(self, t: float) -> None:
        """The last generation of a busy period ended (the lock held): the aggregate rate, and its energy."""
        if self._busy_since is not None:
            self._busy_s += t - self._busy_since
            self._busy_since = None
        if self._busy_s > 0:
            self.metrics.aggregate_tokens_per_s.set(self._busy_tokens / self._busy_s)
        if self.parallel > 1 and self.power is not None and self.power.running:
            report = self.power.stop()
            decode = report.by_phase().get("decode")
            if decode is not None:
                labels = (report.meter, report.boundary.value, str(report.estimate).lower())
                self.metrics.observe_energy(labels, 0.0, decode.joules, self._period_tokens)

    def _run(self, job: Job) -> None:
        if job.cancelled.is_set():  # the client left while it waited
            self.metrics.generations.labels("cancelled").inc()
            job.post(Finished("cancelled", len(job.prompt), 0, 0, -1, {}, None))
            return
        t_start = time.perf_counter()
        slot, _ = self.pool.acquire(job.prompt)
        try:
            self._on_slot(job, slot, t_start)
        finally:
            self.pool.release(slot)

    def _on_slot(self, job: Job, slot: Any, t_start: float) -> None:
        try:
            session = slot.session
            rest = session.resume(job.prompt)  # what the slot's cache does not hold yet, never empty
            slot.tokens = job.prompt[: session.length]
        except EdgeRuntimeError as e:
            self.pool.forget(slot)
            log.error("slot %d could not be prepared: %s", slot.index, e)
            job.post(Failure(APIError(500, f"the slot could not be prepared: {e}")))
            return
        try:
            if self.batcher is None:
                self._generate(job, slot, rest, t_start)
            else:
                with self.batcher.stream():  # its decode steps are batched with the other generations'
                    self._generate(job, slot, rest, t_start)
        except RingOverflowError as e:  # raised by the session before it fed anything
            self.metrics.rejected.labels("context_length").inc()
            job.post(Failure(APIError(413, str(e), param="messages", code="context_length_exceeded")))
        except ConstraintError as e:  # a schema or regex llguidance cannot follow: the client's, not the model's
            self.pool.forget(slot)  # it may have failed mid-reply: what the session holds is not slot.tokens
            job.post(Failure(APIError(400, str(e), param="response_format", code="unsatisfiable_constraint")))
        except EdgeRuntimeError as e:  # corrupt output and the like: the model's fault, not the client's
            self.pool.forget(slot)
            log.error("generation failed on slot %d: %s", slot.index, e)
            job.post(Failure(APIError(500, f"generation failed: {e}")))

    def _generate(self, job: Job, slot: Any, rest: list[int], t_start: float) -> None:
        p, m, session = job.params, self.metrics, slot.session
        # The bias first: a constraint's mask then has the last word over what may follow. Built before the power
        # sampler starts: a constraint refused here must not leave it running for the next request to trip on.
        processors: list[Any] = [LogitBias(dict(p.logit_bias))] if p.logit_bias else []
        if p.grammar is not None:
            processors.append(_constraint(session, p.grammar))
        power = self.power if self.parallel == 1 else None  # else sampled per busy period (_busy_start)
        if power is not None:
            power.start()
            power.mark("prefill")
        config = GenerationConfig(max_tokens=p.max_tokens, sampling=p.sampling, stop_strings=p.stop)
        generated: list[int] = []
        reason = "length"
        first = last = t_start
        cached = 0
        spec = self.speculative
        before = replace(spec.stats) if spec is not None else None
        # stream_generate on the session (it feeds only `rest`): EOS, stop strings and max_tokens end it there,
        # its last event releasing any text held back for a stop string; a cancel ends it here.
        stream = stream_generate(
            session, self.tok, rest, config, logits_processors=processors, logprobs=p.logprobs, speculative=spec
        )
        try:
            for ev in stream:
                now = time.perf_counter()
                generated.append(ev.token_id)
                if ev.index == 0:
                    first, cached = now, session.last_cached
                    m.ttft.observe(now - job.arrival)
                    if power is not None:
                        power.mark("decode")
                else:
                    m.itl.observe(now - last)
                last = now
                lp = None
                if p.logprobs is not None and ev.token_id not in self.eos and ev.logprob is not None:
                    lp = TokenLogprob(ev.token_id, ev.logprob, ev.top_logprobs)
                if ev.text or lp is not None or ev.index == 0:
                    job.post(Piece(ev.text, lp))
                if ev.finish_reason is not None:  # OpenAI's words: EOS and a stop string are both "stop"
                    reason = "length" if ev.finish_reason is FinishReason.LENGTH else "stop"
                    break
                if job.cancelled.is_set():
                    reason = "cancelled"
                    break
        finally:
            stream.close()
            report = power.stop() if power is not None and power.running else None
            if spec is not None and before is not None:
                d = spec.stats.since(before)
                m.speculative_proposed.inc(d.proposed)
                m.speculative_accepted.inc(d.accepted)
                m.target_calls.inc(d.steps)
        end = time.perf_counter()
        slot.tokens = [*slot.tokens, *rest, *generated] if generated else slot.tokens
        n = len(generated)
        with self._lock:
            self._busy_tokens += n
            self._period_tokens += n
        m.generations.labels(reason).inc()
        m.prompt_tokens.inc(len(job.prompt))
        m.cached_tokens.inc(cached)
        m.generated_tokens.inc(n)
        timings = {
            "queue_ms": round((t_start - job.arrival) * 1e3, 3),
            "ttft_ms": round((first - job.arrival) * 1e3, 3),
            "prefill_tokens": len(rest),
            "prefill_ms": round((first - t_start) * 1e3, 3),
            "decode_ms": round((end - first) * 1e3, 3),
            "decode_tokens_per_s": round((n - 1) / (end - first), 2) if n > 1 and end > first else None,
        }
        job.post(Finished(reason, len(job.prompt), n, cached, slot.index, timings, self._energy(report, n)))

    def _energy(self, report: Any, tokens: int) -> dict[str, Any] | None:
        if report is None:
            return None
        phases = report.by_phase()
        if "prefill" not in phases or "decode" not in phases:
            return None
        fig = energy_figures(tokens, phases["prefill"], phases["decode"], report)
        labels = (report.meter, report.boundary.value, str(report.estimate).lower())
        self.metrics.observe_energy(labels, fig["prefill_j"], fig["decode_j"], tokens)
        keep = ("prefill_j", "decode_j", "total_j", "avg_watts", "tokens_per_joule", "covered_fraction")
        return {
            "sensor": report.meter,
            "boundary": report.boundary.value,
            "estimate": report.estimate,
            **{k: fig[k] for k in keep},
        }


def _constraint(session: Any, grammar: Any) -> Any:
    from edge_runtime.constrain import Constraint  # llguidance loads only for structured output

    return Constraint.for_engine(session, grammar)
