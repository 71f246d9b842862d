"""The float64 reference forward against `transformers` (an independent implementation), in fp32.

Metric: max |ours - theirs| / max |ours| over the logits of a 64-token prompt; bound 1e-4.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from edge_runtime.exporters import ReferenceModel, load_checkpoint
from edge_runtime.models import DEMO_CHECKPOINT

from .tiny_models import TINY_CONFIGS, save_tiny_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4


def rel_err(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.abs(ours - theirs).max() / np.abs(ours).max())


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)[None]).logits[0].double().numpy()


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_tiny_parity(name, tmp_path):
    hf = save_tiny_checkpoint(name, tmp_path)
    ckpt = load_checkpoint(tmp_path)
    ids = np.random.default_rng(1).integers(0, ckpt.args.vocab_size, 64)
    ours = ReferenceModel(ckpt.args, ckpt.weights).forward(ids)
    err = rel_err(ours, hf_logits(hf, ids))
    print(f"{name}: rel err {err:.2e}")
    assert err <= TOL


SENSITIVITY = ["llama-llama3-rope", "llama-linear-rope-bias", "mistral-window", "ministral", "qwen2-sliding"]
SENSITIVITY += ["qwen3-tied", "qwen3-sliding", "gemma3", "granite"]


@pytest.mark.parametrize("name", SENSITIVITY)
def test_parity_is_sensitive_to_the_feature(name, tmp_path):
    """Dropping the feature under test (RoPE scaling, sliding window, q/k norms, local layers, Granite's
    multipliers) must break parity, or the test proves nothing."""
    hf = save_tiny_checkpoint(name, tmp_path)
    ckpt = load_checkpoint(tmp_path)
    args, weights = ckpt.args, ckpt.weights
    if args.local_layers:
        args = dataclasses.replace(args, local_layers=())
    elif args.qk_norm:
        layers = [dataclasses.replace(lw, q_norm=None, k_norm=None) for lw in weights.layers]
        weights = dataclasses.replace(weights, layers=layers)
    elif args.model_type == "granite":  # the multipliers in the args (test_granite.py: those folded into weights)
        args = dataclasses.replace(args, embed_scale=1.0, attn_scale=None)
    elif args.sliding_window is not None:
        args = dataclasses.replace(args, sliding_window=None)
    else:
        args = dataclasses.replace(args, rope=dataclasses.replace(args.rope, rope_type="default"))
    ids = np.random.default_rng(1).integers(0, args.vocab_size, 64)
    assert rel_err(ReferenceModel(args, weights).forward(ids), hf_logits(hf, ids)) > 1e-3


def test_demo_model_parity():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(DEMO_CHECKPOINT, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(DEMO_CHECKPOINT)
    text = (DEMO_CHECKPOINT / "heldout.txt").read_text(encoding="utf-8")[:2000]
    ids = np.asarray(tok(text).input_ids[:64])
    assert ids[0] == tok.bos_token_id and len(ids) == 64
    ckpt = load_checkpoint(DEMO_CHECKPOINT)
    err = rel_err(ReferenceModel(ckpt.args, ckpt.weights).forward(ids), hf_logits(hf, ids))
    print(f"demo model: rel err {err:.2e}")
    assert err <= TOL
