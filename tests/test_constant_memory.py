"""A long stream runs in constant Python memory: nothing grows per token in stream_generate (ITL
histogram, bounded detokenizer, bounded penalty history). That a sampling step
allocates nothing vocabulary-sized is checked at a real vocabulary size in test_sampling_buffers.py.

tracemalloc sees numpy's and Python's allocations (ONNX Runtime's own arenas are static: the soak
script measures RSS end to end)."""

from __future__ import annotations

import tracemalloc

from edge_runtime.engine import LoadOptions, load
from edge_runtime.generate import GenerationConfig, stream_generate
from edge_runtime.sampling import SamplingParams
from edge_runtime.tokenizer import Tokenizer

N = 1000


def test_stream_generate_with_sampling_does_not_grow_per_token(tied_bundle):
    engine = load(tied_bundle, LoadOptions(window=60))  # wraps the ring many times over
    tok = Tokenizer.for_engine(engine)
    sampling = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, repetition_penalty=1.1, seed=0)
    config = GenerationConfig(max_tokens=4 * N, sampling=sampling, stop_on_eos=False)
    tracemalloc.start()
    try:
        current = {}
        for ev in stream_generate(engine, tok, "hello", config):
            if ev.index in (N, 2 * N, 3 * N):
                current[ev.index] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # Per-token growth shows in both spans of N tokens; a one-off allocation (an interpreter cache filling up, seen
    # once at 2,106 B) in one of them only, so the smaller span is the one held to the bound.
    growth = min(current[2 * N] - current[N], current[3 * N] - current[2 * N])
    # The ITL array alone grew 8 B/token (8 KB here); ids and text kept would be more.
    assert growth < 2048, f"{growth} bytes more after {N} more tokens ({growth / N:.1f} B/token)"
