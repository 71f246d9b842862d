"""ITL percentiles from the fixed histogram stay within 1% of exact ones, in constant memory."""

from __future__ import annotations

import numpy as np
import pytest

from edge_runtime.latency import BUCKETS, RATIO, LatencyHistogram


@pytest.mark.parametrize("seed", [0, 1])
def test_percentiles_within_the_bucket_error_of_numpy(seed):
    ms = np.random.default_rng(seed).lognormal(mean=np.log(20), sigma=0.6, size=20_000)
    h = LatencyHistogram()
    for x in ms:
        h.add(float(x))
    for q in (50, 90, 99):
        exact = float(np.percentile(ms, q, method="nearest"))
        assert h.percentile(q) == pytest.approx(exact, rel=RATIO**0.5 - 1 + 1e-9)


def test_edges_constant_samples_and_empty():
    assert LatencyHistogram().percentile(50) == 0.0
    h = LatencyHistogram()
    for _ in range(100):
        h.add(7.25)
    assert h.percentile(50) == h.percentile(99) == 7.25  # clamped to the exact min and max
    h.add(0.0)
    h.add(1e9)
    assert h.percentile(0) == 0.0 and h.percentile(100) == 1e9
    assert len(h.counts) == BUCKETS < 1000
