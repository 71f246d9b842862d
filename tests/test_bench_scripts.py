"""The llama.cpp comparison reads llama-bench's JSON the way the issue's figures need it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

# `llama-bench -p 16 -n 8 -d 0,16 -t 2 -r 1 -o json` on the 135M shape (Q4_0), trimmed to the fields read.
SAMPLE = [
    {"n_prompt": 16, "n_gen": 0, "n_depth": 0, "avg_ts": 520.993278, "samples_ts": [520.993]},
    {"n_prompt": 0, "n_gen": 8, "n_depth": 0, "avg_ts": 161.628194, "samples_ts": [161.628]},
    {"n_prompt": 16, "n_gen": 0, "n_depth": 16, "avg_ts": 547.24973, "samples_ts": [547.25]},
    {"n_prompt": 0, "n_gen": 8, "n_depth": 16, "avg_ts": 181.030555, "samples_ts": [181.031]},
]


@pytest.fixture
def llamacpp_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the script imports its sibling, as when run directly
    import bench_vs_llamacpp

    return bench_vs_llamacpp


def test_prefill_at_depth_zero_and_decode_after_the_prompt(llamacpp_bench):
    got = llamacpp_bench.parse_llama_bench(json.dumps(SAMPLE), prompt=16, gen=8)
    assert got == {"prefill_tps": 520.993278, "decode_tps": 181.030555, "decode_samples": [181.031]}


def test_missing_test_is_an_error_not_a_wrong_number(llamacpp_bench):
    without_deep_decode = [t for t in SAMPLE if not (t["n_gen"] and t["n_depth"])]
    with pytest.raises(SystemExit, match="tg8@d16"):
        llamacpp_bench.parse_llama_bench(json.dumps(without_deep_decode), prompt=16, gen=8)
