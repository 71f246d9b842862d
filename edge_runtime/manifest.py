"""The bundle manifest: the one schema shared by the exporter (writer) and the runtime (reader).

A leaf module (stdlib only). Everything the runtime needs to drive a graph is here, so it never
needs to know the architecture: dims per layer, RoPE frequencies, the graph's I/O contract, cache
geometry, tokenizer ids, generation defaults, and the quantization/validation/provenance records.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import BundleError, ManifestVersionError

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
# graph.kv["layout"]: how each layer's K/V buffer is shaped.
KV_HEADS_FIRST = "[1, num_kv_heads, capacity, head_dim]"  # `trt`, and `ort` bundles before 0.2
# `ort` graphs since 0.3 attend with GroupQueryAttention until the ring is full, then the whole buffer.
LINEAR_UNTIL_FULL = "seqlens_k_until_full_then_capacity"
# Graph output of bundles whose LM head is a MatMulQ4 or MatMulQ8: numpy.argmax of each kept row's logits, [1, kept, 1]
# int64 (the greedy token, computed where the logits were written; older bundles lack it).
NEXT_TOKEN = "next_token"


@dataclass(frozen=True)
class ModelSpec:
    source_model_type: str
    arch: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    head_dim: int
    num_heads: list[int]  # per layer (pruning may make layers differ)
    num_kv_heads: list[int]
    intermediate_size: list[int]
    rotary_dim: int
    rope_inv_freq: list[float]  # [rotary_dim / 2], scaling already applied; the runtime only multiplies
    max_position_embeddings: int
    parameters: int
    tied_embeddings: bool


@dataclass(frozen=True)
class GraphSpec:
    file: str
    data_file: str
    flavor: str  # "ort" | "trt"
    opset: int
    weight_dtype: str
    activation_dtype: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    kv: dict[str, Any]
    weight_bytes: int  # bytes of weights read per token (for achieved-bandwidth figures)

    def kv_shape(self, kv_heads: int, capacity: int, head_dim: int) -> tuple[int, ...]:
        """One layer's K (or V) buffer shape under this graph's layout."""
        return (1, kv_heads, capacity, head_dim)


@dataclass(frozen=True)
class CacheSpec:
    sinks: int
    window: int
    slack: int  # extra ring rows so a prefill chunk of slack + 1 tokens fits past capacity


@dataclass(frozen=True)
class TokenizerSpec:
    file: str
    bos_token_id: int | None
    eos_token_ids: list[int]
    pad_token_id: int | None
    adds_bos: bool  # the tokenizer's post-processor prepends BOS itself (informational: encode() applies it)
    # The checkpoint's Jinja chat template, a file in the bundle (None: no template; chat is refused).
    chat_template: str | None = None
    # bos_token, eos_token, ... as strings: what `transformers` hands a chat template beside the messages.
    special_tokens: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ValidationCase:
    name: str
    tokens: int
    max_rel_err: float


@dataclass(frozen=True)
class ValidationRecord:
    reference: str
    tolerance: float
    max_rel_err: float
    cases: list[ValidationCase]
    seconds: float


@dataclass(frozen=True)
class Manifest:
    format_version: int
    model: ModelSpec
    graph: GraphSpec
    cache: CacheSpec
    tokenizer: TokenizerSpec
    generation: dict[str, Any]
    quantization: dict[str, Any]
    validation: ValidationRecord
    provenance: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256 (hex), every file but this one

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any, source: str = MANIFEST_FILE) -> Manifest:
        if not isinstance(data, dict):
            raise BundleError(f"{source}: expected a JSON object")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ManifestVersionError(
                f"{source}: bundle format version {version!r} is not supported by this runtime (reads "
                f"version {FORMAT_VERSION}); re-export the bundle with this version of edge-export"
            )
        return _build(cls, data, source)

    @classmethod
    def read(cls, path: str | Path) -> Manifest:
        path = Path(path)
        if not path.parent.is_dir():
            raise BundleError(f"bundle directory '{path.parent}' does not exist")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BundleError(f"'{path.parent}' is not a bundle: it has no {MANIFEST_FILE}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BundleError(f"'{path}' is not valid JSON: {e}") from e
        return cls.from_dict(data, str(path))


def _build(cls: type, data: Any, where: str) -> Any:
    """Construct dataclass `cls` from JSON data, checking keys and (shallow) types."""
    if not isinstance(data, dict):
        raise BundleError(f"{where}: expected an object for {cls.__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise BundleError(f"{where}: unknown key(s) {unknown} in {cls.__name__}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise BundleError(f"{where}: missing key '{f.name}' in {cls.__name__}")
            continue
        kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}: {cls.__name__}.{f.name}")
    return cls(**kwargs)


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        return _convert(next(a for a in typing.get_args(hint) if a is not type(None)), value, where)
    if origin is list:
        if not isinstance(value, list):
            raise BundleError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(hint)
        return [_convert(item, v, where) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise BundleError(f"{where}: expected an object, got {value!r}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool, float) and (not isinstance(value, hint) or (hint is int and isinstance(value, bool))):
        raise BundleError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value
