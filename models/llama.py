"""Llama 2/3 and SmolLM/SmolLM2 (shipped as `model_type: llama`); Mistral has its own file (same weights).

Pre-norm decoder: RMSNorm -> GQA attention with RoPE -> residual -> RMSNorm -> SwiGLU MLP -> residual.
`attention_bias` puts a bias on q, k, v and o; `mlp_bias` on gate, up and down.
"""

from __future__ import annotations

from typing import Any

from .base import Architecture, ModelArgs, WeightNames, opt_bool, parse_common
from .gguf_layout import GGUFLayout, bias_from_tensors

WEIGHTS = WeightNames(
    embed="model.embed_tokens.weight",
    final_norm="model.norm.weight",
    lm_head="lm_head.weight",
    layer={
        "attn_norm": "model.layers.{i}.input_layernorm.weight",
        "q": "model.layers.{i}.self_attn.q_proj.weight",
        "k": "model.layers.{i}.self_attn.k_proj.weight",
        "v": "model.layers.{i}.self_attn.v_proj.weight",
        "o": "model.layers.{i}.self_attn.o_proj.weight",
        "q_bias": "model.layers.{i}.self_attn.q_proj.bias",
        "k_bias": "model.layers.{i}.self_attn.k_proj.bias",
        "v_bias": "model.layers.{i}.self_attn.v_proj.bias",
        "o_bias": "model.layers.{i}.self_attn.o_proj.bias",
        "mlp_norm": "model.layers.{i}.post_attention_layernorm.weight",
        "gate": "model.layers.{i}.mlp.gate_proj.weight",
        "up": "model.layers.{i}.mlp.up_proj.weight",
        "down": "model.layers.{i}.mlp.down_proj.weight",
        "gate_bias": "model.layers.{i}.mlp.gate_proj.bias",
        "up_bias": "model.layers.{i}.mlp.up_proj.bias",
        "down_bias": "model.layers.{i}.mlp.down_proj.bias",
    },
    # Checkpoints written by transformers < 4.31 carry the RoPE frequency buffer; it holds no weights.
    ignore=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
)


def parse(config: dict[str, Any]) -> ModelArgs:
    bias = opt_bool(config, "attention_bias", False)
    return parse_common(
        config,
        arch="llama",
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=opt_bool(config, "mlp_bias", False),
    )


ARCH = Architecture(
    name="llama",
    parse=parse,
    weights=WEIGHTS,
    gguf=GGUFLayout("llama", "LlamaForCausalLM", permuted_qk=True, config=bias_from_tensors),
)
