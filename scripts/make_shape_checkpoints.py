"""Random-weight Hugging Face checkpoints of real model shapes, for speed benchmarks.

    python scripts/make_shape_checkpoints.py [--out /tmp/edge-shapes] [--shape smollm2-135m ...] [--dtype bf16]

Writes one directory per shape under --out (config.json, generation_config.json, model.safetensors,
tokenizer.json, tokenizer_config.json) that `edge-export` and onnxruntime-genai's model builder both
accept. Speed depends on shapes only, so the weights are N(0, 0.02) and the norms 1: activations stay
finite and logits near uniform. No torch: tensors are drawn with numpy and written with a minimal
safetensors writer (bf16 as rounded uint16 bit patterns), one row block at a time, so writing the 1B
shape needs well under 1 GB of RAM.

The tokenizer is the demo model's byte-level BPE (4,096 tokens, `edge_runtime.models.DEMO_CHECKPOINT`)
with its vocabulary padded to the shape's size by unique lowercase-letter tokens (" zq...") that no
merge produces: the model can emit them, and they decode to plain ASCII.

Shapes: smollm2-135m (SmolLM2-135M layout), llama-3.2-1b (Llama-3.2-1B layout, full 128,256 vocab,
llama3 RoPE scaling), llama-3.2-3b, llama-3.1-8b (untied LM head), tiny (a few MB, for tests).
Existing directories are replaced.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.models import DEMO_CHECKPOINT

STD = 0.02  # std of every matrix (embeddings included); RMSNorm weights are 1
BOS, EOS, PAD = 0, 1, 2  # the demo tokenizer's <s>, </s>, <pad>
_ROWS_BUDGET = 1 << 24  # elements drawn per block (64 MB of float32)


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float
    max_positions: int
    rope_scaling: dict[str, Any] | None = None
    tied: bool = True  # tie_word_embeddings (no lm_head.weight)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# Llama 3.2's rope_scaling block, verbatim from its config.json (Llama 3.1's differs only in factor 8)
LLAMA3_ROPE_SCALING = {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}

SHAPES: dict[str, Shape] = {
    # HuggingFaceTB/SmolLM2-135M
    "smollm2-135m": Shape(
        hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152,
        rope_theta=100000.0, max_positions=8192,
    ),
    # meta-llama/Llama-3.2-1B
    "llama-3.2-1b": Shape(
        hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256,
        rope_theta=500000.0, max_positions=131072,
        rope_scaling=LLAMA3_ROPE_SCALING,
    ),
    # meta-llama/Llama-3.2-3B
    "llama-3.2-3b": Shape(
        hidden=3072, layers=28, heads=24, kv_heads=8, intermediate=8192, vocab=128256,
        rope_theta=500000.0, max_positions=131072,
        rope_scaling=LLAMA3_ROPE_SCALING,
    ),
    # meta-llama/Llama-3.1-8B (untied LM head)
    "llama-3.1-8b": Shape(
        hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256,
        rope_theta=500000.0, max_positions=131072, tied=False,
        rope_scaling={**LLAMA3_ROPE_SCALING, "factor": 8.0},
    ),
    # For tests: every code path of the big shapes (GQA, tied head, padded vocab) in a few MB.
    "tiny": Shape(
        hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=4224,
        rope_theta=10000.0, max_positions=512,
    ),
}  # fmt: skip


def config_json(shape: Shape, dtype: str) -> dict[str, Any]:
    """The older config vintage the real checkpoints ship (top-level rope_theta / rope_scaling)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden,
        "initializer_range": STD,
        "intermediate_size": shape.intermediate,
        "max_position_embeddings": shape.max_positions,
        "mlp_bias": False,
        "num_attention_heads": shape.heads,
        "num_hidden_layers": shape.layers,
        "num_key_value_heads": shape.kv_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-5,
        "rope_scaling": shape.rope_scaling,
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": shape.tied,
        "torch_dtype": {"bf16": "bfloat16", "fp32": "float32"}[dtype],
        "use_cache": True,
        "vocab_size": shape.vocab,
        **shape.extra,
    }


def tensor_shapes(shape: Shape) -> Iterator[tuple[str, tuple[int, ...]]]:
    """HF Llama names and [out, in] shapes; lm_head.weight only where the shape is untied."""
    h, d = shape.hidden, shape.head_dim
    yield "model.embed_tokens.weight", (shape.vocab, h)
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (shape.heads * d, h)
        yield p + "self_attn.k_proj.weight", (shape.kv_heads * d, h)
        yield p + "self_attn.v_proj.weight", (shape.kv_heads * d, h)
        yield p + "self_attn.o_proj.weight", (h, shape.heads * d)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (shape.intermediate, h)
        yield p + "mlp.up_proj.weight", (shape.intermediate, h)
        yield p + "mlp.down_proj.weight", (h, shape.intermediate)
    yield "model.norm.weight", (h,)
    if not shape.tied:
        yield "lm_head.weight", (shape.vocab, h)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even (inputs are finite)."""
    bits = x.view(np.uint32)
    return ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)


def _blocks(name: str, dims: tuple[int, ...], rng: np.random.Generator) -> Iterator[np.ndarray]:
    """The tensor's float32 values, a block of rows at a time."""
    if name.endswith("norm.weight"):
        yield np.ones(dims, np.float32)
        return
    rows, cols = dims
    step = max(1, _ROWS_BUDGET // cols)
    for r in range(0, rows, step):
        block = rng.standard_normal((min(step, rows - r), cols), dtype=np.float32)
        block *= STD
        yield block


def write_safetensors(path: Path, shape: Shape, dtype: str, seed: int) -> int:
    """Stream every tensor into one .safetensors file; returns its size in bytes."""
    st_dtype, itemsize = {"bf16": ("BF16", 2), "fp32": ("F32", 4)}[dtype]
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "generator": "edge-runtime make_shape_checkpoints"}}
    offset = 0
    entries = list(tensor_shapes(shape))
    for name, dims in entries:
        size = int(np.prod(dims)) * itemsize
        header[name] = {"dtype": st_dtype, "shape": list(dims), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as the reference writer does
    rng = np.random.default_rng(seed)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, dims in entries:
            for block in _blocks(name, dims, rng):
                f.write((f32_to_bf16_bits(block) if dtype == "bf16" else block).tobytes())  # little-endian hosts
    return path.stat().st_size


def _dummy_tokens(existing: set[str], count: int) -> list[str]:
    """`count` unique byte-level tokens, "Ġ" (a space) + lowercase letters, none already in the vocab."""
    out: list[str] = []
    n = 0
    while len(out) < count:
        k, s = n, ""
        for _ in range(4):  # 26**4 = 456,976 names, enough for any vocabulary here
            k, r = divmod(k, 26)
            s = chr(ord("a") + r) + s
        n += 1
        token = "Ġz" + s
        if token not in existing:
            out.append(token)
    return out


def write_tokenizer(out: Path, vocab_size: int, max_positions: int) -> None:
    src = Path(DEMO_CHECKPOINT)
    tok = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = tok["model"]["vocab"]
    base = max(vocab.values()) + 1
    if vocab_size < base:
        raise SystemExit(f"vocab_size {vocab_size} is below the base tokenizer's {base} tokens; use {base} or more")
    for i, token in enumerate(_dummy_tokens(set(vocab), vocab_size - base)):
        vocab[token] = base + i
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    cfg = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    cfg["model_max_length"] = max_positions
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


def make_checkpoint(name: str, out_dir: Path, *, dtype: str = "bf16", seed: int = 0) -> Path:
    """Write the checkpoint of shape `name` to `out_dir / name` (replacing it); returns that directory."""
    shape = SHAPES[name]
    final = out_dir / name
    tmp = out_dir / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config_json(shape, dtype), indent=2) + "\n", encoding="utf-8")
    gen = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "do_sample": False}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
    write_tokenizer(tmp, shape.vocab, shape.max_positions)
    write_safetensors(tmp / "model.safetensors", shape, dtype, seed)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def parameter_count(shape: Shape) -> int:
    return sum(int(np.prod(dims)) for _, dims in tensor_shapes(shape))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/edge-shapes"), help="parent directory [/tmp/edge-shapes]")
    ap.add_argument(
        "--shape", action="append", choices=sorted(SHAPES), help="shape(s) to write [smollm2-135m, llama-3.2-1b]"
    )
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="stored weight dtype [bf16]")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    names = args.shape or ["smollm2-135m", "llama-3.2-1b"]
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        t0 = time.perf_counter()
        path = make_checkpoint(name, args.out, dtype=args.dtype, seed=args.seed)
        size = (path / "model.safetensors").stat().st_size
        print(
            f"{name}: {parameter_count(SHAPES[name]) / 1e6:.1f} M parameters, {size / 1e9:.2f} GB {args.dtype} "
            f"-> {path} ({time.perf_counter() - t0:.1f}s)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
