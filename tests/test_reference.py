"""The reference forward's own invariants, and the demo model's recorded quality."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from edge_runtime.exporters import DenseKVCache, ReferenceModel, load_checkpoint
from edge_runtime.exporters.reference import apply_rope, perplexity
from edge_runtime.models import DEMO_CHECKPOINT

from .tiny_models import save_tiny_checkpoint


@pytest.mark.parametrize("name", ["llama-untied", "mistral-window", "qwen2"])
def test_growing_cache_equals_full_sequence(name, tmp_path):
    save_tiny_checkpoint(name, tmp_path)
    ckpt = load_checkpoint(tmp_path)
    model = ReferenceModel(ckpt.args, ckpt.weights)
    ids = np.random.default_rng(2).integers(0, ckpt.args.vocab_size, 40)
    full = model.forward(ids)
    cache = DenseKVCache()
    chunks = [model.forward(ids[:7], cache)] + [model.forward(ids[t : t + 1], cache) for t in range(7, 40)]
    assert len(cache) == 40 and cache.keys[0].shape == (ckpt.args.num_kv_heads, 40, ckpt.args.head_dim)
    np.testing.assert_allclose(np.concatenate(chunks), full, rtol=0, atol=1e-12 * np.abs(full).max())


@pytest.mark.parametrize("name", ["llama-untied", "qwen2"])
def test_large_model_path_computes_in_float32_on_the_weights_as_given(name, tmp_path, monkeypatch):
    """Past F64_COPY_MAX_PARAMS the reference keeps the float32 weights (no 8-byte copy) and computes in
    float32: within 1e-5 of the float64 path, far inside the 1e-4 export tolerance."""
    from edge_runtime.exporters import reference
    from edge_runtime.exporters.reference import StreamingReference

    save_tiny_checkpoint(name, tmp_path)
    ckpt = load_checkpoint(tmp_path)
    ids = np.random.default_rng(3).integers(0, ckpt.args.vocab_size, 12)
    copied = ReferenceModel(ckpt.args, ckpt.weights)
    monkeypatch.setattr(reference, "F64_COPY_MAX_PARAMS", 0)
    kept = ReferenceModel(ckpt.args, ckpt.weights)
    assert copied.layers[0].q.dtype == np.float64 and kept.layers[0].q.dtype == np.float32
    assert kept.layers[0].q is ckpt.weights.layers[0].q  # no copy at all
    want, got = copied.forward(ids), kept.forward(ids)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    s_want, s_got = StreamingReference(copied, 2, 6), StreamingReference(kept, 2, 6)
    for t in ids:
        a, b = s_want.step(int(t)), s_got.step(int(t))
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * np.abs(a).max())


def test_rope_rotation_preserves_norm_and_relative_angle():
    rng = np.random.default_rng(3)
    q, k = rng.normal(size=(1, 1, 16)), rng.normal(size=(1, 1, 16))
    inv = 1.0 / (10000 ** (np.arange(0, 16, 2) / 16))

    def rot(x, pos):
        a = np.array([[pos]], dtype=np.float64) * inv
        return apply_rope(x, np.cos(a), np.sin(a))

    assert np.linalg.norm(rot(q, 123)) == pytest.approx(np.linalg.norm(q))
    # q.k depends only on the position difference: the property the StreamingLLM cache relies on.
    assert np.sum(rot(q, 10) * rot(k, 3)) == pytest.approx(np.sum(rot(q, 1007) * rot(k, 1000)), rel=1e-9)


def test_partial_rope_leaves_tail_untouched():
    x = np.random.default_rng(4).normal(size=(2, 3, 16))
    a = np.arange(3, dtype=np.float64)[:, None] * np.ones(4)
    y = apply_rope(x, np.cos(a), np.sin(a))
    assert np.array_equal(y[..., 8:], x[..., 8:]) and not np.allclose(y[..., :8], x[..., :8])


def _card_value(label: str) -> float:
    card = (DEMO_CHECKPOINT / "README.md").read_text(encoding="utf-8")
    m = re.search(rf"^\| {re.escape(label)} \| ([0-9.]+)", card, re.MULTILINE)
    assert m, f"model card has no '{label}' row"
    return float(m.group(1))


def test_demo_model_heldout_perplexity_matches_card():
    """Recompute the first-512-token held-out perplexity with our loader and reference forward."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(DEMO_CHECKPOINT / "tokenizer.json"))
    text = (DEMO_CHECKPOINT / "heldout.txt").read_text(encoding="utf-8")
    ckpt = load_checkpoint(DEMO_CHECKPOINT)
    body = tok.encode(text[:20000], add_special_tokens=False).ids[:511]
    ids = [ckpt.args.bos_token_id, *body]
    ppl = perplexity(ReferenceModel(ckpt.args, ckpt.weights), ids)
    card = _card_value("held-out perplexity, first 512 tokens")
    stats = json.loads((DEMO_CHECKPOINT / "training_stats.json").read_text())
    print(f"held-out ppl (first 512 tokens): ours {ppl:.4f}, card {card}, whole held-out text {stats['heldout_ppl']}")
    assert ppl == pytest.approx(card, rel=0.01)


def test_demo_model_shape_and_size():
    ckpt = load_checkpoint(DEMO_CHECKPOINT)
    a = ckpt.args
    assert (a.model_type, a.num_kv_heads < a.num_heads, a.tie_word_embeddings) == ("llama", True, True)
    n = sum(t.size for t in (ckpt.tensors[k] for k in ckpt.tensors))
    assert 3e6 <= n <= 8e6
    assert {f.name for f in ckpt.tensors.files} == {"model.safetensors"}
    assert ckpt.tensors.files[0].stat().st_size == pytest.approx(2 * n, rel=0.01)  # bf16 on disk
    total = sum(p.stat().st_size for p in DEMO_CHECKPOINT.iterdir())
    assert total <= 25 * 2**20


@pytest.mark.parametrize("name", ["llama-untied", "qwen2", "gemma3", "smollm3"])
def test_streaming_run_computes_what_step_does_token_by_token(name, tmp_path):
    """run() (layer by layer over a known stream, what validation uses) against step() past two wraps of a
    tiny ring: the same tokens attended at the same cache positions, so equal to float64 rounding."""
    from edge_runtime.exporters.reference import StreamingReference

    save_tiny_checkpoint(name, tmp_path)
    ckpt = load_checkpoint(tmp_path)
    model = ReferenceModel(ckpt.args, ckpt.weights)
    ids = np.random.default_rng(4).integers(0, ckpt.args.vocab_size, 40)
    stepped = StreamingReference(model, 2, 9)
    want = np.stack([stepped.step(int(t)) for t in ids])
    whole = StreamingReference(model, 2, 9)
    got = whole.run(ids.tolist())
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
    with pytest.raises(ValueError, match="run"):
        whole.step(0)
