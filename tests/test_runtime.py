"""The runtime against the references: greedy parity, StreamingLLM past capacity, chunked prefill,
a static pool whose buffers never move, and no Python allocation growth in the decode loop."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from edge_runtime.engine import LoadOptions, MemoryBudgetError, load
from edge_runtime.errors import BundleError
from edge_runtime.exporters import ReferenceModel, load_checkpoint
from edge_runtime.exporters.decoder import Flavor, Precision
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.reference import StreamingReference, greedy_generate
from edge_runtime.models import DEMO_CHECKPOINT

from .tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny qwen2 checkpoint (biases, GQA) and its bundles in both flavors."""
    d = tmp_path_factory.mktemp("ckpt")
    save_tiny_checkpoint("qwen2", d)
    bundles = {}
    for flavor in Flavor:
        bundles[flavor] = tmp_path_factory.mktemp("b") / flavor.value
        export(ExportOptions(checkpoint=d, out=bundles[flavor], flavor=flavor, window=400))
    ckpt = load_checkpoint(d)
    return ReferenceModel(ckpt.args, ckpt.weights), bundles


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "ort"
    export(ExportOptions(checkpoint=DEMO_CHECKPOINT, out=out))
    ckpt = load_checkpoint(DEMO_CHECKPOINT)
    return ReferenceModel(ckpt.args, ckpt.weights), out


def engine_greedy(engine, prompt, n):
    logits, out = engine.prefill(prompt), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = engine.decode(out[-1])
    return out


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
def test_greedy_matches_reference_tiny(tiny, flavor):
    ref, bundles = tiny
    prompt = [0, 17, 33, 99, 250, 7]
    assert engine_greedy(load(bundles[flavor]), prompt, 100) == greedy_generate(ref, prompt, 100)


def test_greedy_matches_reference_demo_model(demo):
    from tokenizers import Tokenizer

    ref, bundle = demo
    tok = Tokenizer.from_file(str(DEMO_CHECKPOINT / "tokenizer.json"))
    prompt = tok.encode("ROMEO.\nWhat light through yonder window breaks?\n").ids
    ours = engine_greedy(load(bundle), prompt, 100)
    assert ours == greedy_generate(ref, prompt, 100)


def _stream_check(engine, ref, ids, prompt_len):
    stream = StreamingReference(ref, engine.geometry.sinks, engine.geometry.window)
    got = engine.prefill(ids[:prompt_len], all_logits=True)
    want = np.stack([stream.step(int(t)) for t in ids[:prompt_len]])
    errs = [rel(got[i], want[i]) for i in range(prompt_len)]
    for t in ids[prompt_len:]:
        errs.append(rel(engine.decode(int(t)), stream.step(int(t))))
    return np.array(errs)


@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
def test_beyond_capacity_1000_tokens_matches_streamingllm(tiny, flavor):
    ref, bundles = tiny
    engine = load(bundles[flavor], LoadOptions(sinks=4, window=64, position_offset=10_000_000))
    ids = np.random.default_rng(1).integers(0, 320, 1000)
    errs = _stream_check(engine, ref, ids, prompt_len=100)  # prompt longer than the window, then decode
    assert errs.max() <= 1e-4, f"step {errs.argmax()}: {errs.max():.2e}"


def test_beyond_capacity_demo_model(demo):
    """The trained model's real attention (sinks matter there) through many ring wraps, cheaply: the float64
    reference costs tens of ms a step, so the ring is made small instead of the run long. 4 sinks + 16 window
    + 3 slack rows: 180 tokens wrap the 19 ring rows 9 times; the 30-token prompt is already past capacity
    (chunks of slack + 1), and positions start past the trained context (512)."""
    ref, bundle = demo
    engine = load(bundle, LoadOptions(sinks=4, window=16, slack=3, position_offset=1000))
    ids = np.random.default_rng(2).integers(0, 4096, 180)
    errs = _stream_check(engine, ref, ids, prompt_len=30)
    assert engine.ring.written > engine.geometry.capacity + 8 * engine.geometry.ring
    assert errs.max() <= 1e-4, f"step {errs.argmax()}: {errs.max():.2e}"


@pytest.mark.slow
def test_beyond_capacity_demo_model_1000_steps(demo):
    ref, bundle = demo
    engine = load(bundle, LoadOptions(sinks=4, window=64))
    ids = np.random.default_rng(2).integers(0, 4096, 1000)
    errs = _stream_check(engine, ref, ids, prompt_len=10)
    assert errs.max() <= 1e-4, f"step {errs.argmax()}: {errs.max():.2e}"


@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
def test_prompt_of_three_capacities_is_chunked(tiny, flavor):
    ref, bundles = tiny
    engine = load(bundles[flavor], LoadOptions(sinks=4, window=32))
    capacity = 4 + 32
    assert len(engine.ring.chunks(3 * capacity)) > 1  # the prompt really goes in several chunks
    errs = _stream_check(engine, ref, np.random.default_rng(3).integers(0, 320, 3 * capacity + 20), 3 * capacity)
    assert errs.max() <= 1e-4


@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
def test_a_long_prompt_goes_in_calls_of_at_most_prefill_chunk_tokens(tiny, flavor, monkeypatch):
    """A prompt longer than engine.PREFILL_CHUNK (here made 16) runs in calls of at most that many tokens (a
    call's activation memory grows with its rows), and gives the reference's logits as one call does."""
    import edge_runtime.engine as engine_module

    ref, bundles = tiny
    prompt = np.random.default_rng(5).integers(0, 320, 150)
    whole = load(bundles[flavor]).prefill(prompt).copy()
    monkeypatch.setattr(engine_module, "PREFILL_CHUNK", 16)
    engine = load(bundles[flavor])
    sizes = []
    run_chunk = engine.backend.run_chunk

    def counted(ids, *args, **kwargs):
        sizes.append(len(ids))
        return run_chunk(ids, *args, **kwargs)

    monkeypatch.setattr(engine.backend, "run_chunk", counted)
    chunked = engine.prefill(prompt)
    assert sum(sizes) == 150 and max(sizes) <= 16 and len(sizes) >= 10, sizes
    assert rel(chunked, whole) <= 1e-4
    stream = StreamingReference(ref, engine.geometry.sinks, engine.geometry.window)
    want = [stream.step(int(t)) for t in prompt][-1]
    assert rel(chunked, want) <= 1e-4


@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
def test_static_pool_pointers_and_no_allocation_growth(tiny, flavor):
    _, bundles = tiny
    engine = load(bundles[flavor], LoadOptions(sinks=4, window=64))
    buffers = [*engine.pool.keys, *engine.pool.values, engine.pool.logits, engine.pool.decode.attn_mask]
    pointers = [b.ctypes.data for b in buffers]
    engine.prefill([0, 5, 9])
    token = 1
    for step in range(2000):
        if step == 500:
            tracemalloc.start()
            before = tracemalloc.take_snapshot()
        token = int(np.argmax(engine.decode(token)))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert [b.ctypes.data for b in buffers] == pointers
    assert growth <= 4096, f"Python allocations grew by {growth} bytes over 1500 decode steps"


def test_in_place_update_writes_the_pool_without_a_copy(tiny, capfd):
    """The bound K/V buffer itself receives the new row, and ORT does not fall back to copying."""
    from edge_runtime.backends.onnxruntime import OrtBackend

    _, bundles = tiny
    engine = load(bundles[Flavor.ORT], LoadOptions(sinks=4, window=64))
    engine.backend = OrtBackend(engine.bundle.graph_file, engine.manifest, engine.pool, log_severity=1)
    engine.prefill([0, 5, 9])
    engine.decode(3)
    row = engine.geometry.slot(3)
    keys = engine.pool.keys[0][0]  # [Hkv, capacity, D]: heads-first, as GroupQueryAttention reads it
    m = engine.manifest.model
    assert keys.shape == (m.num_kv_heads[0], engine.geometry.capacity, m.head_dim)
    assert np.abs(keys[:, row]).sum() > 0
    assert np.abs(keys[:, row + 1]).sum() == 0
    assert "in-place" not in capfd.readouterr().err.lower()


def test_memory_budget_is_enforced_with_numbers(tiny):
    _, bundles = tiny
    with pytest.raises(MemoryBudgetError, match=r"needs .* MiB .* budget is 0\.1 MiB"):
        load(bundles[Flavor.ORT], LoadOptions(memory_budget=100_000))


@pytest.mark.parametrize("sinks,window,message", [(4, 600, "trained context 512"), (-1, 16, "sinks=-1")])
def test_bad_geometry_is_refused(tiny, sinks, window, message):
    _, bundles = tiny
    with pytest.raises(BundleError, match=message):
        load(bundles[Flavor.ORT], LoadOptions(sinks=sinks, window=window))


def test_fp16_trt_bundle_runs_on_cpu(tiny, tmp_path):
    ref, _ = tiny
    ckpt_dir = tmp_path / "c"
    save_tiny_checkpoint("qwen2", ckpt_dir)
    export(
        ExportOptions(checkpoint=ckpt_dir, out=tmp_path / "b", flavor=Flavor.TRT, precision=Precision.FP16, window=400)
    )
    engine = load(tmp_path / "b")
    errs = _stream_check(engine, ref, np.random.default_rng(4).integers(0, 320, 60), 20)
    assert errs.max() <= 2e-2
