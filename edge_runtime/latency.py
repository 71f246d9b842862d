"""Inter-token latency percentiles in constant memory: a fixed histogram of log-spaced buckets.

A stream may run for millions of tokens (a device left generating for weeks); keeping every latency
(8 bytes a token) would grow without bound. Buckets are RATIO apart from LOW_MS to HIGH_MS (1 µs to
100 s, 933 buckets, 7.5 KB); a percentile is the geometric centre of the bucket holding that order
statistic, clamped to the exact min and max, so it is within (RATIO^0.5 - 1) = 1% of the value
np.percentile would report for the same rank (and exact when every sample is equal). Recording is an
O(1) log and an array increment: no allocation per token.
"""

from __future__ import annotations

import array
import math

LOW_MS = 1e-3
HIGH_MS = 1e5
RATIO = 1.02
_LOG_RATIO = math.log(RATIO)
BUCKETS = math.ceil(math.log(HIGH_MS / LOW_MS) / _LOG_RATIO) + 2  # + underflow and overflow


class LatencyHistogram:
    def __init__(self) -> None:
        self.counts = array.array("q", bytes(8 * BUCKETS))
        self.n = 0
        self.min = math.inf
        self.max = -math.inf

    def add(self, ms: float) -> None:
        if ms < self.min:
            self.min = ms
        if ms > self.max:
            self.max = ms
        if ms < LOW_MS:
            i = 0
        elif ms >= HIGH_MS:
            i = BUCKETS - 1
        else:
            i = min(BUCKETS - 2, 1 + int(math.log(ms / LOW_MS) / _LOG_RATIO))
        self.counts[i] += 1
        self.n += 1

    def percentile(self, q: float) -> float:
        """The q-th percentile (0..100) of what was added; 0.0 when nothing was."""
        if self.n == 0:
            return 0.0
        rank = round(q / 100 * (self.n - 1))  # the order statistic np.percentile centres on
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen > rank:
                if i == 0:
                    return self.min  # below LOW_MS: no resolution left worth reporting
                if i == BUCKETS - 1:
                    return self.max
                return min(self.max, max(self.min, LOW_MS * RATIO ** (i - 0.5)))  # the bucket's geometric centre
        return self.max
