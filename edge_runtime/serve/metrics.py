"""The server's Prometheus metrics (prometheus-client, text exposition at GET /metrics).

One registry per app (not the library's global one), so two servers in one process, or tests, never share
counters. Names: `edge_serve_*` for the server's own, `process_*` (RSS, CPU seconds, open fds) from the
library's process collector. Energy comes from the target's power meter, one sampler run per generation (per
busy period with --parallel above 1, when generations overlap);
`sensor`, `boundary` and `estimate` label every energy series, since figures of different boundaries are not
comparable and an estimate (CPU utilisation x TDP, no sensor) must say so.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector, generate_latest
from prometheus_client import exposition as _exposition

CONTENT_TYPE = _exposition.CONTENT_TYPE_LATEST

# Seconds. TTFT spans a cached turn on a 5M model (~1 ms) to a cold 2k-token prefill on a Pi (~tens of s).
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Seconds. Inter-token latency: ~1 ms (tiny model, x86) to ~250 ms (a 1B model on a Pi 4).
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

ENERGY_LABELS = ("sensor", "boundary", "estimate")


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # process_resident_memory_bytes: the server's RSS
        p = "edge_serve_"
        self.info = Info(p + "model", "The model served and how it was loaded.", registry=r)
        self.requests = Counter(
            p + "requests", "HTTP requests answered, by route and status.", ("route", "status"), registry=r
        )
        self.request_seconds = Histogram(
            p + "request_duration_seconds",
            "Request handling time, to the last byte.",
            ("route",),
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.generations = Counter(
            p + "generations", "Generations run, by how they ended.", ("finish_reason",), registry=r
        )
        self.prompt_tokens = Counter(
            p + "prompt_tokens", "Prompt tokens of generations run (cached included).", registry=r
        )
        self.cached_tokens = Counter(
            p + "cached_tokens", "Prompt tokens found in a slot's ring, not fed again.", registry=r
        )
        self.generated_tokens = Counter(p + "generated_tokens", "Tokens generated.", registry=r)
        self.speculative_proposed = Counter(
            p + "speculative_proposed_tokens", "Tokens proposed to speculative verification.", registry=r
        )
        self.speculative_accepted = Counter(
            p + "speculative_accepted_tokens", "Proposed tokens the target model accepted.", registry=r
        )
        self.target_calls = Counter(
            p + "target_calls",
            "Target model calls after each reply's first token (decode steps and "
            "verifications): generated tokens past the first over this are tokens per call.",
            registry=r,
        )
        self.ttft = Histogram(
            p + "time_to_first_token_seconds",
            "Request arrival to its first token (queue wait, slot switch and prefill included).",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            p + "inter_token_latency_seconds",
            "Time between consecutive generated tokens.",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(p + "queue_depth", "Requests waiting for the engine.", registry=r)
        self.queue_wait = Histogram(
            p + "queue_wait_seconds",
            "Request arrival to the start of its generation (waiting for a worker).",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.parallel = Gauge(p + "parallel", "Generations that may run at once (--parallel).", registry=r)
        self.batch_rows = Histogram(
            p + "batch_rows",
            "Sequences decoded per model call with --parallel above 1 (batch occupancy).",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.aggregate_tokens_per_s = Gauge(
            p + "aggregate_tokens_per_second",
            "Tokens generated per second while any generation ran, all at once counted together, over the "
            "server's lifetime.",
            registry=r,
        )
        self.queue_capacity = Gauge(p + "queue_capacity", "Most requests that may wait (then 503).", registry=r)
        self.slots = Gauge(p + "slots", "Slots (conversations kept in a ring).", registry=r)
        self.slots_busy = Gauge(p + "slots_busy", "Slots generating now.", registry=r)
        self.slots_used = Gauge(p + "slots_used", "Slots holding a conversation.", registry=r)
        self.rejected = Counter(
            p + "rejected", "Requests refused before generation, by reason.", ("reason",), registry=r
        )
        self.peak_rss = Gauge(p + "peak_rss_bytes", "Peak resident set size of the server process.", registry=r)
        self.energy = Counter(
            p + "energy_joules",
            "Energy of generations, by phase, from the power meter.",
            (*ENERGY_LABELS, "phase"),
            registry=r,
        )
        self.energy_tokens = Counter(
            p + "energy_generated_tokens",
            "Tokens generated while the meter sampled (the numerator of tokens per joule).",
            ENERGY_LABELS,
            registry=r,
        )
        self.tokens_per_joule = Gauge(
            p + "tokens_per_joule",
            "Generated tokens per joule of prefill + decode, over the server's lifetime.",
            ENERGY_LABELS,
            registry=r,
        )
        self._energy_sum: dict[tuple[str, ...], list[float]] = {}

    def observe_energy(self, labels: tuple[str, str, str], prefill_j: float, decode_j: float, tokens: int) -> None:
        self.energy.labels(*labels, "prefill").inc(max(0.0, prefill_j))
        self.energy.labels(*labels, "decode").inc(max(0.0, decode_j))
        self.energy_tokens.labels(*labels).inc(tokens)
        acc = self._energy_sum.setdefault(labels, [0.0, 0.0])
        acc[0] += max(0.0, prefill_j + decode_j)
        acc[1] += tokens
        if acc[0] > 0:
            self.tokens_per_joule.labels(*labels).set(acc[1] / acc[0])

    def exposition(self) -> bytes:
        from edge_runtime.rss import peak_rss_bytes

        self.peak_rss.set(peak_rss_bytes())
        return generate_latest(self.registry)

    def describe(self, **info: Any) -> None:
        self.info.info({k: str(v) for k, v in info.items()})
