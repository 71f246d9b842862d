"""Several caches decoded in one call: a batched step gives each cache what a decode of its own gives.

The demo's int4 `--kernel edge` bundle takes a batch (its RingAttention reads row_cache); loaded with several caches
they share one K/V array per layer. Rows of a batch round as a row alone where the kernels say so
(`Model.exact_rows`): logits then equal bit for bit, else within the export's tolerance. Threads stepping through
a StepBatcher meet in batched calls and each gets its own tokens.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edge_runtime import kernels
from edge_runtime.engine import LoadOptions, load
from edge_runtime.session import Session

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the edge kernels are not built here")

VOCAB = 256


def ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def same(a: np.ndarray, b: np.ndarray, rows: int, exact_rows: int) -> bool:
    """Bit for bit where `rows` rows round as one does, else close (the kernels' rows rules differ)."""
    if rows <= exact_rows:
        return np.array_equal(a, b)
    return bool(np.abs(a - b).max() <= 1e-3 * max(1.0, np.abs(b).max()))


def test_a_batched_step_is_each_cache_decoded_alone(demo_bundles):
    bundle = demo_bundles["int4-edge"]
    engine = load(bundle, LoadOptions(caches=4))
    model = engine.model
    assert model.manifest.graph.batched and model.batched
    keys = model.caches[0].pool.keys[0]
    assert all(np.shares_memory(c.pool.keys[0].base, keys.base) for c in model.caches)  # one array, a slice each
    assert not np.shares_memory(model.caches[0].pool.keys[0], model.caches[1].pool.keys[0])
    # prompts of 5, 40 and 198 tokens: the last one's ring fills (window 200) while it decodes
    prompts = {2: ids(1, 5), 0: ids(2, 40), 3: ids(3, 198)}
    alone = {c: load(bundle) for c in prompts}
    logits, last = {}, {}
    for c, p in prompts.items():
        logits[c] = model.prefill(model.caches[c], p)
        assert np.array_equal(logits[c], alone[c].prefill(p))
        last[c] = int(np.argmax(logits[c]))
    exact = model.exact_rows
    for step in range(30):
        batch = [c for c in prompts if not (c == 0 and step % 7 == 3)]  # cache 0 sits some steps out
        model.decode_batch([model.caches[c] for c in batch], [last[c] for c in batch])
        for c in batch:
            got = model.caches[c].pool.logits[0, 0]
            want = alone[c].decode(last[c])
            assert same(got, want, len(batch), exact), (step, c)
            if model.fused_argmax:
                assert model.decoded_argmax(model.caches[c]) == alone[c].decoded_argmax()
            last[c] = int(np.argmax(want))
    assert alone[3].ring.tokens > alone[3].geometry.logical_capacity  # the full ring was batched too


def test_threads_meet_in_batched_calls_and_get_their_own_tokens(demo_bundles):
    bundle = demo_bundles["int4-edge"]
    engine = load(bundle, LoadOptions(caches=4))
    model = engine.model
    sizes: list[int] = []
    batcher = model.batch_steps(wait_s=0.05, observe=sizes.append)
    prompts = [ids(10 + i, 6 + 9 * i) for i in range(4)]
    got: dict[int, list[int]] = {}

    def run(i: int) -> None:
        with batcher.stream():
            got[i] = [s.token for s in Session(engine.on(i)).send(prompts[i], max_tokens=24, stop_ids=[])]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    want = {
        i: [s.token for s in Session(load(bundle)).send(p, max_tokens=24, stop_ids=[])] for i, p in enumerate(prompts)
    }
    if model.exact_rows >= 4:
        assert got == want
    else:  # rows may round apart: the first tokens at least agree
        assert all(got[i][:4] == want[i][:4] for i in range(4))
    assert max(sizes) > 1 and sum(sizes) <= 4 * 24  # steps were shared; none ran twice


def test_batched_steps_keep_their_buffers_and_allocate_nothing(demo_bundles):
    """1,500 steps of four caches (the ring wraps: window 200): the shared K/V and the batch's buffers never move,
    RingAttention writes the bound cache in place (no copy), and Python allocations do not grow."""
    import tracemalloc

    from .test_kernels import _cache_copies

    engine = load(demo_bundles["int4-edge"], LoadOptions(caches=4))
    model = engine.model
    b = model._batch_buffers
    buffers = [*b.keys, *b.values, b.logits, b.attn_mask, b.input_ids, *(c.pool.logits for c in model.caches)]
    pointers = [x.ctypes.data for x in buffers]
    caches = list(model.caches)
    last = [int(np.argmax(model.prefill(c, ids(40 + i, 3 + i)))) for i, c in enumerate(caches)]
    copies = _cache_copies(kernels.RING_ATTENTION)
    for step in range(1500):
        if step == 300:
            tracemalloc.start()
            before = tracemalloc.take_snapshot()
        model.decode_batch(caches, last)
        last = [int(c.pool.next_token[0, 0, 0]) for c in caches]
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert [x.ctypes.data for x in buffers] == pointers
    assert _cache_copies(kernels.RING_ATTENTION) == copies
    assert growth <= 4096, f"Python allocations grew by {growth} bytes over 1,200 batched steps"
    assert caches[0].ring.tokens > 1500 > model.geometry.capacity


def test_local_layers_batch_too(tmp_path):
    """Gemma 3's local layers keep a ring of their own: a batched step writes and reads both rings of each cache
    (global 4 + 16 + 8 rows, local 12 + 12), past both wraps, as each cache decoded alone."""
    pytest.importorskip("torch")
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod

    from .tiny_models import save_tiny_checkpoint

    save_tiny_checkpoint("gemma3", tmp_path / "ckpt")
    out = tmp_path / "b"
    quant = QuantConfig(QuantMethod.INT4, kernel=MatMulKernel.EDGE)
    export(ExportOptions(checkpoint=tmp_path / "ckpt", out=out, sinks=4, window=16, quant=quant))
    small = {"sinks": 4, "window": 16, "slack": 8}
    model = load(out, LoadOptions(caches=3, **small)).model
    assert model.batched and model.local_geometry is not None
    alone = [load(out, LoadOptions(**small)) for _ in range(3)]
    vocab = model.manifest.model.vocab_size
    prompts = [np.random.default_rng(i).integers(3, vocab, 5 + 9 * i).tolist() for i in range(3)]
    exact = model.exact_rows  # probed on cache 0 before its stream starts (the probe puts back only the stream)
    last = []
    for c, e, p in zip(model.caches, alone, prompts, strict=True):
        logits = model.prefill(c, p)
        assert np.array_equal(logits, e.prefill(p))
        last.append(int(np.argmax(logits)))
    for _ in range(60):
        model.decode_batch(list(model.caches), last)
        for i, (c, e) in enumerate(zip(model.caches, alone, strict=True)):
            want = e.decode(last[i])
            assert same(c.pool.logits[0, 0], want, 3, exact)
            last[i] = int(np.argmax(want))
    assert alone[0].ring.tokens > alone[0].geometry.capacity


def test_the_budget_counts_the_batch_buffers(demo_bundles):
    from edge_runtime.engine import MemoryBudgetError

    bundle = demo_bundles["int4-edge"]
    model = load(bundle, LoadOptions(caches=4)).model
    b = model._batch_buffers
    held = [b.input_ids, b.cos, b.sin, b.cos_sink, b.sin_sink, b.attn_mask, b.write_index, b.row_cache, b.logits]
    held += [] if b.next_token is None else [b.next_token]
    actual = sum(x.nbytes for x in held)
    assert 0 <= model.batch_bytes - actual <= 8 * 4  # the estimate counts a fused argmax row whether or not
    need = model.weight_bytes + 4 * model.kv_bytes + model.batch_bytes
    assert load(bundle, LoadOptions(caches=4, memory_budget=need)).model.batched
    with pytest.raises(MemoryBudgetError, match="batched steps' buffers"):
        load(bundle, LoadOptions(caches=4, memory_budget=need - 1))
