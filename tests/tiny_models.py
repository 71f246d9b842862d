"""Tiny random Hugging Face checkpoints, made on the fly with `transformers` (dev extra).

`TINY_CONFIGS` is the registry the meta-test checks: every architecture and alias in
`edge_runtime.models` must have at least one entry here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_BASE: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    bos_token_id=0,
    eos_token_id=1,
)

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-tied": {**_BASE, "model_type": "llama", "tie_word_embeddings": True},
    "llama-untied": {**_BASE, "model_type": "llama", "tie_word_embeddings": False, "num_hidden_layers": 3},
    # original_max_position 32 with head_dim 16 puts frequencies in all three llama3 bands.
    "llama-llama3-rope": {
        **_BASE,
        "model_type": "llama",
        "tie_word_embeddings": True,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    "llama-linear-rope-bias": {
        **_BASE,
        "model_type": "llama",
        "tie_word_embeddings": False,
        "attention_bias": True,
        "mlp_bias": True,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
    },
    # A window shorter than the 64-token parity prompt, so the sliding mask is exercised.
    "mistral-window": {**_BASE, "model_type": "mistral", "tie_word_embeddings": False, "sliding_window": 24},
    # Ministral 8B's interleaving: layers 0 and 2 slide over 12 tokens (shorter than the parity prompt), 1 and
    # 3 attend everything; one RoPE for both.
    "ministral": {
        **_BASE,
        "model_type": "ministral",
        "tie_word_embeddings": False,
        "head_dim": 16,  # MinistralAttention (transformers 5.25) fails on the class default None
        "num_hidden_layers": 4,
        "sliding_window": 12,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    },
    "qwen2": {
        **_BASE,
        "model_type": "qwen2",
        "tie_word_embeddings": False,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "use_sliding_window": False,
    },
    # use_sliding_window: layers from max_window_layers (1) on slide over 12 tokens, layer 0 attends everything.
    "qwen2-sliding": {
        **_BASE,
        "model_type": "qwen2",
        "tie_word_embeddings": True,
        "num_hidden_layers": 3,
        "use_sliding_window": True,
        "sliding_window": 12,
        "max_window_layers": 1,
    },
    # head_dim 32 with 4 heads: the attention width (128) differs from hidden, as in Qwen3-0.6B (2048 vs 1024).
    "qwen3-tied": {**_BASE, "model_type": "qwen3", "tie_word_embeddings": True, "head_dim": 32},
    "qwen3-bias": {
        **_BASE,
        "model_type": "qwen3",
        "tie_word_embeddings": False,
        "attention_bias": True,
        "num_attention_heads": 8,
        "head_dim": 8,
    },
    # An explicit list: layer 0 slides (with its q/k norms), layer 1 attends everything.
    "qwen3-sliding": {
        **_BASE,
        "model_type": "qwen3",
        "tie_word_embeddings": True,
        "head_dim": 16,
        "use_sliding_window": True,
        "sliding_window": 12,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    # Layers 0, 1, 3 local (window 12, shorter than the parity prompt), 2 global; head_dim 32 > hidden / heads.
    "gemma3": {
        **{k: v for k, v in _BASE.items() if k != "rope_theta"},
        "model_type": "gemma3_text",
        "num_hidden_layers": 4,
        "head_dim": 32,
        "query_pre_attn_scalar": 24,
        "sliding_window": 12,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        "pad_token_id": 2,
    },
    # All four multipliers away from 1 (and the softmax scale away from 1/sqrt(head_dim) = 0.25); tied head.
    "granite": {
        **_BASE,
        "model_type": "granite",
        "tie_word_embeddings": True,
        "embedding_multiplier": 4.0,
        "attention_multiplier": 0.05,
        "residual_multiplier": 0.3,
        "logits_scaling": 6.0,
    },
    # Layers 1 and 3 without RoPE (every second one); the 3B checkpoint has every fourth.
    "smollm3": {
        **_BASE,
        "model_type": "smollm3",
        "tie_word_embeddings": True,
        "num_hidden_layers": 4,
        "no_rope_layer_interval": 2,
        "pad_token_id": 2,
    },
    # The per-layer list (0: NoPE) wins over the interval; biases on attention and MLP.
    "smollm3-list-bias": {
        **_BASE,
        "model_type": "smollm3",
        "tie_word_embeddings": False,
        "num_hidden_layers": 3,
        "no_rope_layers": [0, 1, 1],
        "attention_bias": True,
        "mlp_bias": True,
        "pad_token_id": 2,
    },
}


def make_hf_model(name: str, seed: int = 0, **overrides: Any):
    """A `transformers` model of a tiny config with every parameter randomised (biases and norms too)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {**TINY_CONFIGS[name], **overrides}
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    offset_norms = config.model_type.startswith("gemma")  # Gemma's norms scale by 1 + w: w is near 0
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_((0.0 if offset_norms else 1.0) + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model.eval()


_TEXT = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
    "arrows of outrageous fortune, or to take arms against a sea of troubles and by opposing end them. "
) * 4


def write_tiny_tokenizer(path: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer (BOS prepended like Llama's) sized to a tiny config's vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_TEXT], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(path))


def save_tiny_checkpoint(
    name: str,
    directory: Path,
    seed: int = 0,
    dtype: str = "float32",
    max_shard_size: str | None = None,
    **overrides: Any,
):
    """Save a tiny random checkpoint to `directory`; returns the fp32 `transformers` model it came from."""
    import torch

    model = make_hf_model(name, seed, **overrides)
    saved = model.to(getattr(torch, dtype))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    saved.save_pretrained(directory, safe_serialization=True, **kwargs)
    write_tiny_tokenizer(Path(directory) / "tokenizer.json", model.config.vocab_size)
    return saved.to(torch.float32)


def save_prune_checkpoint(directory: Path) -> Path:
    """The pruning tests' model: 4 layers, 4 KV heads of 2 query heads (head_dim 16), MLP 128 (room for
    per-layer differences), with a calibration text beside it."""
    save_tiny_checkpoint(
        "llama-untied", directory, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
        intermediate_size=128,
    )  # fmt: skip
    (Path(directory) / "calibration.txt").write_text(_TEXT * 2)
    return Path(directory)


def demo_with_template(directory: str | Path, template: str) -> Path:
    """A copy of the demo checkpoint with `template` as its chat template (it ships none: not an instruct model)."""
    import json
    import shutil

    from edge_runtime.models import DEMO_CHECKPOINT

    ck = Path(directory)
    shutil.copytree(DEMO_CHECKPOINT, ck)
    config = json.loads((ck / "tokenizer_config.json").read_text())
    (ck / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return ck
