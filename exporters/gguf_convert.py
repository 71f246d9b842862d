"""GGUF -> Hugging Face checkpoint directory, torch-free, so the normal export pipeline can read it.

convert_gguf(Path("model.gguf"), Path("hf_dir"))            # bf16 model.safetensors + config + tokenizer
with checkpoint_dir(Path("model.gguf"), out=out) as d:   # what `edge-export x.gguf` does
    export(ExportOptions(checkpoint=d, out=out))

Undone on the way: llama.cpp's name scheme (blk.N.attn_q -> model.layers.N.self_attn.q_proj), its
Q/K row permutation for the llama architecture (convert_hf_to_gguf.py `LlamaModel.permute`, which
interleaves each head's two rotary halves for llama.cpp's rope kernel), and its quantization
(dequantized to float32, then stored as the caller asks). Every check runs before the first byte is
written, and the directory is filled in place: callers that need atomicity convert into a temporary
directory and rename it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.errors import CheckpointError, UnsupportedArchitectureError
from edge_runtime.models import ARCHITECTURES as MODEL_ARCHITECTURES
from edge_runtime.models import get_arch
from edge_runtime.models.gguf_layout import GGUFLayout

from .gguf_reader import GGUFFile
from .gguf_tokenizer import build_tokenizer
from .progress import Progress, as_progress

ProgressArg = Progress | Callable[[str], None]

# GGUF architecture -> (HF model_type, its layout): every architecture file in models/ that declares one.
ARCHITECTURES: dict[str, tuple[str, GGUFLayout]] = {
    a.gguf.arch: (name, a.gguf) for name, a in MODEL_ARCHITECTURES.items() if a.gguf is not None
}

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",  # Qwen3
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
_ROPE_FREQS = "rope_freqs.weight"  # llama3 rope factors, folded into config.json's rope_scaling

_ST_DTYPES = {"bf16": ("BF16", 2), "f32": ("F32", 4)}


def is_gguf(path: Path) -> bool:
    """A .gguf name, or any file that starts with the GGUF magic."""
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:  # a directory, or nothing there
        return False


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor of architecture `arch` (the Llama names, as its layout amends them)."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m is None:
        return None
    own = ARCHITECTURES[arch][1].layer_names if arch in ARCHITECTURES else {}
    name = own.get(m.group(2), _LAYER.get(m.group(2)))
    return None if name is None else f"model.layers.{m.group(1)}.{name}"


def layout(gg: GGUFFile) -> GGUFLayout:
    """The layout of the file's architecture; refuses one no architecture file declares."""
    if gg.architecture not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"'{gg.path.name}' is a GGUF of architecture {gg.architecture!r}; edge-export reads "
            f"{', '.join(ARCHITECTURES)}"
        )
    return ARCHITECTURES[gg.architecture][1]


def reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's `permute(w, n_head)`: per head, rows [r0 r1 ... | i0 i1 ...] (HF, rotary
    halves) were stored as [r0 i0 r1 i1 ...]; same as transformers' `_reverse_permute_weights`."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even (finite inputs)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)


def _f32(value: Any) -> float:
    """A FLOAT32 metadata value as the decimal it was written from (9.999999747e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def _int(gg: GGUFFile, key: str, default: int | None = None) -> int:
    value = gg.meta(key, default) if default is not None else gg.require(key)
    if isinstance(value, list):  # per-layer values (e.g. OpenELM's head counts)
        raise CheckpointError(f"'{gg.path.name}': '{key}' varies per layer ({value[:4]}...); not supported")
    gg.meta(key, kind="int")  # a float or a string here is a damaged file, not a value to round or parse
    return int(value)


class _Meta:
    """`GGUFMeta` over a file, for the architecture files' `config` readers."""

    def __init__(self, gg: GGUFFile) -> None:
        self._gg = gg

    def int(self, key: str, default: int | None = None) -> int:
        return _int(self._gg, key, default)

    def has_tensor(self, name: str) -> bool:
        return self._gg.has_tensor(name)


def _rope_scaling(gg: GGUFFile, arch: str, head_dim: int, theta: float) -> dict[str, Any] | None:
    kind = gg.meta(f"{arch}.rope.scaling.type", "none", kind="str")
    if gg.has_tensor(_ROPE_FREQS):
        return _llama3_rope(gg, head_dim, theta)
    if kind in ("none", None):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(gg.require(f"{arch}.rope.scaling.factor", kind="float"))}
    raise CheckpointError(f"'{gg.path.name}': RoPE scaling {kind!r} is not supported (supported: linear, llama3)")


def _llama3_rope(gg: GGUFFile, head_dim: int, theta: float) -> dict[str, Any]:
    """llama.cpp stores Llama 3.1+'s frequency scaling as per-frequency divisors (`rope_freqs`);
    find llama3 parameters that reproduce them. Only the band edges orig/low and orig/high matter,
    so with original_max_position fixed, low and high follow from a line fitted to the smooth band."""
    freqs = gg.tensor(_ROPE_FREQS).astype(np.float64)
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv
    factor = float(freqs.max())
    orig = _int(gg, f"{gg.architecture}.rope.scaling.original_context_length", 8192)
    candidates = [(1.0, 4.0)]  # Meta's releases
    mid = (freqs > 1 + 1e-6) & (freqs < factor - 1e-6)
    if factor > 1 and mid.sum() >= 2:
        smooth = (1 / freqs[mid] - 1 / factor) / (1 - 1 / factor)  # (orig / wavelen - low) / (high - low)
        slope, intercept = np.polyfit(1 / wavelen[mid], smooth, 1)
        span = orig / slope
        candidates.insert(0, (round(float(-intercept * span), 6), round(float(-intercept * span + span), 6)))
    elif factor > 1 and (freqs <= 1 + 1e-6).any() and (freqs >= factor - 1e-6).any():
        # No frequency in the smooth band: any edges between the last unscaled and the first
        # scaled wavelength give the same model; put both just either side of their geometric mean.
        edge = float(np.sqrt(wavelen[freqs <= 1 + 1e-6].max() * wavelen[freqs >= factor - 1e-6].min()))
        candidates.insert(0, (orig / (edge * 1.001), orig / (edge / 1.001)))
    for low, high in candidates:
        smooth = np.clip((orig / wavelen - low) / (high - low), 0.0, 1.0)
        if freqs.shape == wavelen.shape and np.allclose(freqs, 1.0 / ((1 - smooth) / factor + smooth), rtol=1e-4):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": orig,
            }
    raise CheckpointError(f"'{gg.path.name}': its rope_freqs.weight matches no llama3 RoPE scaling")


def build_config(gg: GGUFFile) -> dict[str, Any]:
    """config.json for the file; raises naming what is unsupported."""
    arch, lay = gg.architecture, layout(gg)
    model_type = ARCHITECTURES[arch][0]
    hidden = _int(gg, f"{arch}.embedding_length")
    heads = _int(gg, f"{arch}.attention.head_count")
    if heads <= 0 or hidden <= 0:  # hidden // heads below would divide by zero
        raise CheckpointError(
            f"'{gg.path.name}': {arch}.embedding_length = {hidden} and {arch}.attention.head_count = {heads} "
            "must both be positive"
        )
    head_dim = _int(gg, f"{arch}.attention.key_length", hidden // heads)
    rope_dim = _int(gg, f"{arch}.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise CheckpointError(f"'{gg.path.name}': rotary dimension {rope_dim} != head dim {head_dim} (partial RoPE)")
    theta = _f32(gg.meta(f"{arch}.rope.freq_base", 10000.0, kind="float"))
    vocab = gg.shape("token_embd.weight")[0] if gg.has_tensor("token_embd.weight") else None
    if vocab is None:
        raise CheckpointError(f"'{gg.path.name}' has no token_embd.weight tensor")
    config: dict[str, Any] = {
        "architectures": [lay.hf_class],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": _int(gg, f"{arch}.feed_forward_length"),
        "num_hidden_layers": _int(gg, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _int(gg, f"{arch}.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _f32(gg.meta(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6, kind="float")),
        "rope_theta": theta,
        "max_position_embeddings": _int(gg, f"{arch}.context_length", 2048),
        "vocab_size": vocab,
        "tie_word_embeddings": not gg.has_tensor("output.weight"),
    }
    config = lay.config(_Meta(gg), config)
    rope = _rope_scaling(gg, arch, head_dim, theta)
    if rope is not None:
        config["rope_scaling"] = rope
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        value = gg.meta(f"tokenizer.ggml.{key}", kind="int")
        if isinstance(value, int):
            config[key.replace("padding", "pad")] = value
    return config


def _tensor_plan(gg: GGUFFile, config: dict[str, Any]) -> list[tuple[str, str, tuple[int, ...]]]:
    """(gguf name, hf name, shape) for every tensor; refuses tensors we would have to drop."""
    plan, unknown = [], []
    for name in gg.tensor_names:
        target = hf_name(name, gg.architecture)
        if target is None:
            if name != _ROPE_FREQS:
                unknown.append(name)
            continue
        plan.append((name, target, gg.shape(name)))
    if unknown:
        raise CheckpointError(
            f"'{gg.path.name}' holds {len(unknown)} tensors no {config['model_type']} layer uses "
            f"(e.g. {', '.join(unknown[:3])}); is it a variant edge-export does not read?"
        )
    return plan


def _check_shapes(gg: GGUFFile, config: dict[str, Any], plan: list[tuple[str, str, tuple[int, ...]]]) -> None:
    """The config built from the metadata against the tensors' shapes, through the architecture's weight map,
    before any tensor is dequantized: the export would refuse the converted checkpoint anyway, but only after
    the whole file had been read and written. Shapes only (zero-byte broadcast placeholders)."""
    arch, shapes = get_arch(config), {target: shape for _, target, shape in plan}
    try:
        arch.weights.bind(arch.parse(config), shapes, lambda name: np.broadcast_to(np.uint8(0), shapes[name]))
    except CheckpointError as e:
        raise type(e)(f"'{gg.path.name}': {e} (config.json: what its metadata converts to)") from e


def _safetensors_header(plan: list[tuple[str, str, tuple[int, ...]]], dtype: str) -> bytes:
    st_dtype, itemsize = _ST_DTYPES[dtype]
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "source": "gguf (edge-runtime gguf_convert)"}}
    offset = 0
    for _, target, shape in plan:
        size = int(np.prod(shape, dtype=np.int64)) * itemsize
        header[target] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)  # data 8-byte aligned, as the reference writer does


def convert_gguf(
    src: Path, out: Path, *, dtype: str = "bf16", progress: ProgressArg | None = None, gg: GGUFFile | None = None
) -> dict[str, Any]:
    """Write a Hugging Face checkpoint for `src` into directory `out` (created); returns config.json's dict.
    `gg`: `src` already opened (an export reads a file's metadata once: seconds for a large vocabulary)."""
    if dtype not in _ST_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_ST_DTYPES)}")
    progress = as_progress(progress)
    t0 = time.perf_counter()
    # The metadata is parsed in Python, a value at a time: seconds for a 262k-token vocabulary, which the stage's
    # heartbeat covers. No line before it: a file refused here says only why.
    with progress.stage(f"reading {src.name}", 1, "file"):
        gg = GGUFFile(src) if gg is None else gg
        split = gg.meta("split.count", 1)
        if isinstance(split, int) and split > 1:
            raise CheckpointError(
                f"'{src.name}' is part 1 of a {split}-part split GGUF; merge it first (gguf-split --merge)"
            )
        config = build_config(gg)
        gg.check_types()
        plan = _tensor_plan(gg, config)
        _check_shapes(gg, config, plan)
        tokenizer, tokenizer_config = build_tokenizer(gg)
    counts = ", ".join(f"{n} {t}" for t, n in gg.type_counts().most_common())
    progress(f"reading {src.name}: {gg.architecture}, {config['num_hidden_layers']} layers, {counts}")

    lay = layout(gg)
    q_heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    out.mkdir(parents=True, exist_ok=True)
    header = _safetensors_header(plan, dtype)
    # Counted in weights, not tensors: the embedding alone can be a third of a model (Gemma 3 270M's 262k-token
    # vocabulary), and a rate taken from it per tensor projected 26 minutes for a 15-second stage.
    sizes = [math.prod(shape) for _, _, shape in plan]
    total = max(1, round(sum(sizes) / 1e6))
    per_weight = total / max(1, sum(sizes))  # so the stage ends at exactly its total
    dequantizing = progress.stage("dequantizing", total, "M weight", plan=f"{len(plan)} tensors to {dtype}")
    with (out / "model.safetensors").open("wb") as f, dequantizing as stage:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for name, _, shape in plan:
            stage.status(name)
            permuted = lay.permuted_qk and (".attn_q." in name or ".attn_k." in name)
            plus_one = lay.norms_plus_one and name.endswith("norm.weight")
            # Whole where a transform needs the whole tensor (small ones); else a block of rows at a time, so
            # the largest tensor's dequantization temporaries stay bounded (GGUFFile.tensor_rows).
            blocks = [gg.tensor(name)] if permuted or plus_one else gg.tensor_rows(name)
            count = 0
            for w in blocks:
                if permuted:
                    w = reverse_permute(w, q_heads if ".attn_q." in name else kv_heads)
                if plus_one:
                    w = w - np.float32(1.0)
                # cannot fail for a well-formed file; guards the header we wrote
                if w.shape[1:] != shape[1:] or count + w.size > math.prod(shape):
                    raise CheckpointError(f"'{src.name}': tensor '{name}' dequantized to more or other than {shape}")
                count += w.size
                f.write((f32_to_bf16_bits(w) if dtype == "bf16" else np.ascontiguousarray(w, np.float32)).tobytes())
                stage.advance(w.size * per_weight)
            if count != math.prod(shape):
                raise CheckpointError(f"'{src.name}': tensor '{name}' dequantized to {count} values, expected {shape}")
    config["torch_dtype"] = {"bf16": "bfloat16", "f32": "float32"}[dtype]
    _write_json(out / "config.json", config)
    tokenizer.save(str(out / "tokenizer.json"))
    _write_json(
        out / "tokenizer_config.json", {**tokenizer_config, "model_max_length": config["max_position_embeddings"]}
    )
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    _write_json(out / "generation_config.json", generation)
    progress(f"converted {src.name} to a {dtype} checkpoint in {time.perf_counter() - t0:.1f}s")
    return config


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


@contextlib.contextmanager
def checkpoint_dir(
    path: Path, *, out: Path | None = None, progress: ProgressArg | None = None, gg: GGUFFile | None = None
) -> Iterator[Path]:
    """`path` itself when it is not a GGUF; else a float32 conversion of it in a temporary directory,
    removed on exit.

    The directory sits beside `out` (the output's filesystem, where the user expects the space) and
    is named and locked like the bundle writer's partials (`.OUT.partial-PID-RAND`), so if this
    process is killed outright the next export to `out` removes it as a dead exporter's leftover.
    SIGTERM and SIGHUP remove it at once, as they do the bundle's partial (bundle_writer.py): it lives through
    the whole export (the weights phase included, before the bundle's partial exists) and is as large as the
    model in float32.
    float32, not bf16: dequantized Q4/Q8 values need more than bf16's 8 mantissa bits and an F16
    GGUF loses 3 bits in bf16, so only float32 hands the exporter exactly the weights in the file.
    """
    if not is_gguf(path):
        yield path
        return
    from .bundle_writer import cleanup_on_termination
    from .partials import lock_directory, partial_name

    with cleanup_on_termination():  # before the directory exists: a signal in between leaves nothing
        tmp, lock = None, None
        try:
            if out is not None and out.parent.is_dir():
                tmp = partial_name(out)
                tmp.mkdir()
                lock = lock_directory(tmp)
            else:
                tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}.gguf-"))
            convert_gguf(path, tmp, dtype="f32", progress=progress, gg=gg)
            gg = None  # this frame lives through the export: the reader's objects must not
            yield tmp
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if lock is not None:
                os.close(lock)
