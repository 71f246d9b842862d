"""The bundle manifest: the one schema shared by the exporter (writer) and the runtime (reader).

A leaf module (stdlib only). Everything the runtime needs to drive a graph is here, so it never
needs to know the architecture: dims per layer, RoPE frequencies, the graph's I/O contract, cache
geometry, tokenizer ids, generation defaults, and the quantization/validation/provenance records.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import stat
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import BundleError, ManifestVersionError

# Version 2 adds DIGEST_KEY; version 1 bundles (no digest) are still read.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MANIFEST_FILE = "manifest.json"
# sha256 of the manifest's canonical form (every other key; canonical_json): the checksums in `files`
# cover every other file, and this covers the manifest itself (RoPE frequencies, dims, token ids), so
# a flipped bit anywhere in a bundle is caught. A guard against corruption, not a signature.
DIGEST_KEY = "manifest_sha256"
MANIFEST_MAX_BYTES = 16 << 20  # real manifests are tens of KB; a bigger file is not read
# graph.kv["layout"]: how each layer's K/V buffer is shaped.
KV_HEADS_FIRST = "[1, num_kv_heads, capacity, head_dim]"  # `trt`, and `ort` bundles before 0.2
# `ort` graphs since 0.3 attend with GroupQueryAttention until the ring is full, then the whole buffer.
LINEAR_UNTIL_FULL = "seqlens_k_until_full_then_capacity"
# graph.kv["dtype"]: the K/V buffers' element types a runtime allocates, as (numpy storage dtype, extra
# elements a row). "q8": each row is its fp32 scale then its int8 codes, uint8 [.., 4 + head_dim] (csrc/simd.h).
KV_DTYPES = {"float32": ("float32", 0), "float16": ("float16", 0), "q8": ("uint8", 4)}
# Graph output of bundles whose LM head is a MatMulQ4 or MatMulQ8: numpy.argmax of each kept row's logits, [1, kept, 1]
# int64 (the greedy token, computed where the logits were written; older bundles lack it).
NEXT_TOKEN = "next_token"


# The symbolic row dimension of a layer's past_key/past_value: the global ring's, or the local ring's for the
# local layers of a model with a sliding window (Gemma 3, Ministral; docs/architecture.md §5.2).
CAPACITY_DIM = "capacity"
LOCAL_CAPACITY_DIM = "capacity_local"
# Graphs whose RingAttention takes a batch of caches (edge kernels): their `row_cache` input [BATCH_ROWS_DIM] names
# each row's cache, past_key's first dimension is CACHES_DIM, and write_index holds one row each [WRITE_ROWS_DIM]
# (or one for a call on one cache). Older graphs lack the input and decode one sequence a call.
ROW_CACHE = "row_cache"
CACHES_DIM = "caches"
BATCH_ROWS_DIM = "batch_rows"
WRITE_ROWS_DIM = "write_rows"


class KvUpdate(str, enum.Enum):
    """graph.kv["update"]: how a call's new K/V rows reach the cache."""

    IN_PLACE_SCATTER = "in_place_scatter"  # `ort`: the graph writes the bound buffer itself
    HOST_COPY = "host_copy"  # `trt`: the graph outputs the new rows, the host copies them into their slots


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
    # Local layers (e.g. Gemma 3): the tokens they attend back and their RoPE; None where every layer is global.
    local_window: int | None = None
    local_rope_inv_freq: list[float] | None = None


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

    @property
    def kv_update(self) -> KvUpdate:
        value = self.kv.get("update")
        try:
            return KvUpdate(value)
        except ValueError:
            known = ", ".join(u.value for u in KvUpdate)
            raise BundleError(f"graph.kv.update {value!r} is not one this runtime knows ({known})") from None

    @property
    def kv_dtype(self) -> str:
        """The K/V cache's element type (a KV_DTYPES name): graph.kv["dtype"], the activation dtype in bundles
        written before the cache could differ from it (`edge-export --kv-dtype`)."""
        value = self.kv.get("dtype", self.activation_dtype)
        if value not in KV_DTYPES:
            raise BundleError(f"graph.kv.dtype {value!r} is not one this runtime knows ({', '.join(KV_DTYPES)})")
        return value

    @property
    def kv_storage(self) -> str:
        """The numpy dtype of the K/V buffers (uint8 for q8 rows)."""
        return KV_DTYPES[self.kv_dtype][0]

    @property
    def local_cache_layers(self) -> frozenset[int]:
        """Layers whose K/V buffers are the local ring's (their past_key rows are LOCAL_CAPACITY_DIM)."""
        return frozenset(
            int(name.rsplit(".", 1)[1])
            for name, spec in self.inputs.items()
            if name.startswith("past_key.") and spec["shape"][2] == LOCAL_CAPACITY_DIM
        )

    @property
    def batched(self) -> bool:
        """Whether one call may decode several caches' tokens (the graph takes ROW_CACHE)."""
        return ROW_CACHE in self.inputs

    def kv_shape(self, kv_heads: int, capacity: int, head_dim: int) -> tuple[int, ...]:
        """One layer's K (or V) buffer shape under this graph's layout (a q8 row holds its scale too)."""
        return (1, kv_heads, capacity, head_dim + KV_DTYPES[self.kv_dtype][1])


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


TEMPLATE_SOURCES = ("checkpoint", "gguf", "file")
# provenance[TEMPLATE_ORIGIN_KEY]: a TemplateOrigin as a dict, or null for a bundle without a template. In
# provenance, not TokenizerSpec: the runtime never needs it, and runtimes that predate it read these bundles.
TEMPLATE_ORIGIN_KEY = "chat_template"


@dataclass(frozen=True)
class TemplateOrigin:
    """Where a bundle's chat template came from: the checkpoint's own files ("checkpoint": chat_template.jinja
    or tokenizer_config.json), a GGUF's metadata ("gguf": the .gguf file), or a file given at export
    ("file": `edge-export --chat-template`, the path as given). `sha256`: of the template text in UTF-8, the
    bytes of the bundle's template file."""

    source: str  # one of TEMPLATE_SOURCES
    path: str
    sha256: str

    def describe(self) -> str:
        what = {"checkpoint": "the checkpoint's", "gguf": "the GGUF's", "file": "--chat-template"}
        return f"{what.get(self.source, self.source)} '{self.path}'"


@dataclass(frozen=True)
class ValidationCase:
    name: str
    tokens: int
    max_rel_err: float
    float32_rel_err: float | None = None  # a numpy float32 forward of the same weights and tokens (fp32 dense cases)


@dataclass(frozen=True)
class ValidationRecord:
    reference: str
    tolerance: float
    max_rel_err: float
    cases: list[ValidationCase]
    seconds: float
    # How `tolerance` was set: fixed per compute type, or measured from the weights' float32 error
    # (exporters/validate.py fp32_tolerance); empty in bundles written before it was recorded.
    tolerance_basis: dict[str, Any] = field(default_factory=dict)


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
        return json.dumps(with_digest(dataclasses.asdict(self)), indent=2) + "\n"

    @property
    def chat_template_origin(self) -> TemplateOrigin | None:
        """Where the chat template came from; None for a bundle without one, or one exported before the
        origin was recorded (tokenizer.chat_template tells the two apart)."""
        record = self.provenance.get(TEMPLATE_ORIGIN_KEY)
        if record is None:
            return None
        where = f"{MANIFEST_FILE}: provenance.{TEMPLATE_ORIGIN_KEY}"
        origin = _build(TemplateOrigin, record, where)
        if origin.source not in TEMPLATE_SOURCES:
            raise BundleError(f"{where}: source {origin.source!r} is not one of {', '.join(TEMPLATE_SOURCES)}")
        return origin

    @classmethod
    def from_dict(cls, data: Any, source: str = MANIFEST_FILE) -> Manifest:
        if not isinstance(data, dict):
            raise BundleError(f"{source}: expected a JSON object")
        version = data.get("format_version")
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            raise ManifestVersionError(
                f"{source}: bundle format version {version!r} is not supported by this runtime (reads "
                f"versions {', '.join(map(str, READABLE_VERSIONS))}); re-export the bundle with this version of "
                "edge-export"
            )
        _check_digest(data, source, required=version >= 2)
        manifest = _build(cls, {k: v for k, v in data.items() if k != DIGEST_KEY}, source)
        _check_files(manifest, source)
        _check_shapes(manifest, source)
        return manifest

    @classmethod
    def read(cls, path: str | Path) -> Manifest:
        path = Path(path)
        if not path.parent.is_dir():
            raise BundleError(f"bundle directory '{path.parent}' does not exist")
        try:
            with path.open("rb") as f:  # bounded: a manifest replaced by a huge or endless file is not read
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise BundleError(f"'{path}' is not a regular file")
                raw = f.read(MANIFEST_MAX_BYTES + 1)
            if len(raw) > MANIFEST_MAX_BYTES:
                raise BundleError(f"'{path}' is over {MANIFEST_MAX_BYTES >> 20} MiB; it is not a bundle manifest")
            data = json.loads(raw.decode("utf-8"))
        except FileNotFoundError:
            raise BundleError(f"'{path.parent}' is not a bundle: it has no {MANIFEST_FILE}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise BundleError(f"'{path}' is not valid JSON: {e}") from e
        return cls.from_dict(data, str(path))


def canonical_json(data: dict[str, Any]) -> bytes:
    """The bytes DIGEST_KEY hashes: every key but the digest, sorted, compact, UTF-8. Floats are written
    as Python's shortest round-trip repr, so reading and re-writing a manifest never changes them."""
    rest = {k: v for k, v in data.items() if k != DIGEST_KEY}
    return json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def with_digest(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with its DIGEST_KEY (re)computed, last."""
    rest = {k: v for k, v in data.items() if k != DIGEST_KEY}
    return {**rest, DIGEST_KEY: hashlib.sha256(canonical_json(rest)).hexdigest()}


def _check_digest(data: dict[str, Any], source: str, *, required: bool) -> None:
    digest = data.get(DIGEST_KEY)
    if digest is None and not required:
        return  # a version 1 bundle: written before the manifest was covered
    if not isinstance(digest, str):
        raise BundleError(f"{source}: '{DIGEST_KEY}' is missing; the manifest cannot be checked, re-export the bundle")
    if hashlib.sha256(canonical_json(data)).hexdigest() != digest:
        raise BundleError(f"{source} does not match its own '{DIGEST_KEY}' (corrupted or edited); re-export the bundle")


def is_plain_name(name: Any) -> bool:
    """A file directly in the bundle directory: no path separators, no `..`, not absolute, not empty."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..", MANIFEST_FILE)
        and not any(c in name for c in ("/", "\\", "\0"))
        and len(name.encode("utf-8", "surrogatepass")) <= 255
    )


def referenced_files(m: Manifest) -> list[str]:
    """Every file the manifest points at besides `files` itself: each must also be checksummed there."""
    names = [m.graph.file, m.graph.data_file, m.tokenizer.file]
    template = getattr(m.tokenizer, "chat_template", None)  # a file in the bundle, where there is one
    return [*names, *([template] if isinstance(template, str) else [])]


def _check_files(m: Manifest, source: str) -> None:
    """Every path confined to the bundle directory, and every file the runtime reads covered by a checksum."""
    if not m.files:
        raise BundleError(f"{source}: 'files' lists no checksums, so nothing could be verified; re-export the bundle")
    for name, digest in m.files.items():
        if not is_plain_name(name):
            raise BundleError(f"{source}: file name {name!r} is not a plain name inside the bundle directory")
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise BundleError(f"{source}: the sha256 of '{name}' is not 64 hex digits: {digest!r}")
    for name in referenced_files(m):
        if not is_plain_name(name):
            raise BundleError(f"{source}: file name {name!r} is not a plain name inside the bundle directory")
        if name not in m.files:
            raise BundleError(f"{source}: '{name}' has no checksum in 'files'; re-export the bundle")


# Bounds no real model comes near: a manifest past them is edited or corrupt, and would have the runtime
# allocate for it (a vocab_size of 10^12) before anything else fails.
_LIMITS = {"num_layers": 4096, "hidden_size": 1 << 20, "vocab_size": 1 << 24, "head_dim": 1 << 14}
_ACTIVATION_DTYPES = ("float32", "float16")


def _check_shapes(m: Manifest, source: str) -> None:
    """The dims the runtime allocates and binds by, checked against each other and against the graph's own
    I/O shapes: an edited manifest (one with a recomputed digest) is one line here, not a numpy or ONNX
    Runtime traceback when the buffers are made or the graph first runs."""
    model, graph = m.model, m.graph

    def bad(why: str) -> BundleError:
        return BundleError(f"{source}: {why}; re-export the bundle")

    for key, limit in _LIMITS.items():
        value = getattr(model, key)
        if not 1 <= value <= limit:
            raise bad(f"model.{key} = {value!r} is outside [1, {limit}]")
    n = model.num_layers
    for key in ("num_heads", "num_kv_heads", "intermediate_size"):
        values = getattr(model, key)
        if len(values) != n or any(not 0 <= v <= 1 << 20 for v in values):
            raise bad(f"model.{key} must list {n} counts (one a layer), got {values!r:.80}")
    r = model.rotary_dim
    if not (0 < r <= model.head_dim and r % 2 == 0 and len(model.rope_inv_freq) == r // 2):
        raise bad(f"model.rotary_dim {r!r} must be even, at most head_dim {model.head_dim}, and rope_inv_freq hold "
                  f"half of it ({len(model.rope_inv_freq)} values)")  # fmt: skip
    local = model.local_rope_inv_freq
    if (local is not None and len(local) != r // 2) or (model.local_window is not None and model.local_window < 1):
        raise bad("model.local_window / local_rope_inv_freq do not fit the model's rotary_dim")
    if graph.activation_dtype not in _ACTIVATION_DTYPES:
        raise bad(f"graph.activation_dtype {graph.activation_dtype!r:.40} is not one of {_ACTIVATION_DTYPES}")
    kv_dtype = graph.kv.get("dtype", graph.activation_dtype)
    if not isinstance(kv_dtype, str) or kv_dtype not in KV_DTYPES:
        raise bad(f"graph.kv.dtype {kv_dtype!r:.40} is not one of {', '.join(KV_DTYPES)}")
    extra = KV_DTYPES[kv_dtype][1]
    for side, specs in (("inputs", graph.inputs), ("outputs", graph.outputs)):
        for name, spec in specs.items():
            shape = spec.get("shape") if isinstance(spec, dict) else None
            if not (isinstance(shape, list) and all(_dim(d) for d in shape)):
                raise bad(f"graph.{side}['{name}'] must be an object with a 'shape' list of dims, got {spec!r:.80}")
            head, _, layer = name.partition(".")
            if head in ("past_key", "past_value", "present_key", "present_value", "new_key", "new_value"):
                i = int(layer) if layer.isdigit() else -1
                if not 0 <= i < n:
                    raise bad(f"graph.{side}['{name}'] names no layer of the {n}")
                # the first dimension is 1, or the caches of a batch (graphs that take ROW_CACHE)
                first = CACHES_DIM if shape and shape[0] == CACHES_DIM and ROW_CACHE in graph.inputs else 1
                want = [first, model.num_kv_heads[i], None, model.head_dim + extra]
                if len(shape) != 4 or any(w is not None and d != w for d, w in zip(shape, want, strict=True)):
                    raise bad(f"graph.{side}['{name}'] has shape {shape}, the model's dims give [1, "
                              f"{model.num_kv_heads[i]}, capacity, {model.head_dim + extra}]")  # fmt: skip


def _dim(d: Any) -> bool:
    """A graph dimension: a size, or a symbolic name."""
    return isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0)


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
