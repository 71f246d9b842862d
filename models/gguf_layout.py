"""How llama.cpp's converter (convert_hf_to_gguf.py) writes an architecture, declared by its file in models/.

`exporters/gguf_convert.py` is generic over this: a GGUF whose `general.architecture` some architecture
file declares is read back into that file's Hugging Face names and config.json, and nothing there
branches on the architecture.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class GGUFMeta(Protocol):
    """The file's metadata, as an architecture's `config` reads it."""

    def int(self, key: str, default: int | None = None) -> int:
        """An integer key; without a default a missing key is refused, naming it."""
        ...

    def has_tensor(self, name: str) -> bool: ...


@dataclass(frozen=True)
class GGUFLayout:
    arch: str  # the file's general.architecture
    hf_class: str  # config.json's "architectures"
    # llama.cpp interleaved each head's two rotary halves in the Q and K rows (LlamaModel.permute)
    permuted_qk: bool
    # per-layer tensor names (after "blk.N.") that differ from the Llama ones, GGUF -> Hugging Face
    layer_names: Mapping[str, str] = field(default_factory=dict)
    # every norm weight stored as 1 + w (llama.cpp's RMSNorm multiplies by the weight alone)
    norms_plus_one: bool = False
    # config.json keys beyond the Llama ones, from the metadata: (meta, config) -> the file's config
    config: Callable[[GGUFMeta, dict[str, Any]], dict[str, Any]] = lambda _meta, config: config


def bias_from_tensors(meta: GGUFMeta, config: dict[str, Any]) -> dict[str, Any]:
    """A Llama-family file whose attention has biases has them on blk.0's q (and on k, v, o alike)."""
    return {**config, "attention_bias": meta.has_tensor("blk.0.attn_q.bias"), "mlp_bias": False}
