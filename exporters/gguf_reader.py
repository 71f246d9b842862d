"""Read a GGUF file (llama.cpp's format) as plain metadata and float32 tensors, torch-free.

gg = GGUFFile("SmolLM2-135M-Instruct.Q4_1.gguf")
gg.architecture, gg.meta("llama.block_count"), gg.tensor("blk.0.attn_q.weight").shape  # [out, in]

Tensors come back in Hugging Face orientation: GGUF lists dimensions innermost first (ne0 = the
input features of a Linear), numpy's row-major view of the data is therefore already [out, in].
Everything else (names, llama.cpp's Q/K permutation, config keys) is `gguf_convert`'s business.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.errors import CheckpointError, CorruptCheckpointError

# What we dequantize. gguf.quants also decodes the IQ*/TQ*/MXFP4 families, but those are codebook or
# ternary formats this project has never been checked against; refusing them by name beats a
# silently wrong model.
SUPPORTED_TYPES = (
    "F32",
    "F16",
    "BF16",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise CheckpointError(
            "reading a .gguf file needs the `gguf` package: pip install 'edge-runtime[gguf]'"
        ) from None
    return gguf


class GGUFFile:
    """One GGUF file, parsed and checked on open; tensor data memory-mapped, dequantized on demand."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        gguf = _import_gguf()
        if not self.path.is_file():
            raise CheckpointError(f"GGUF file '{self.path}' does not exist")
        try:
            self._reader = gguf.GGUFReader(self.path, "r")
        except OSError as e:
            raise CheckpointError(f"cannot read '{self.path}': {e.strerror or e}") from e
        except Exception as e:  # any failure of the third-party parser means a damaged file
            raise CorruptCheckpointError(
                f"'{self.path}' is not a valid GGUF file (truncated or corrupt?): {type(e).__name__}: {e}"
            ) from e
        self._tensors = {t.name: t for t in self._reader.tensors}
        for t in self._tensors.values():
            # A file cut inside its tensor data can still parse when the cut falls in padding.
            if t.data.nbytes != t.n_bytes:
                raise CorruptCheckpointError(
                    f"'{self.path}': tensor '{t.name}' holds {t.data.nbytes} of its {t.n_bytes} bytes (truncated?)"
                )

    def has(self, key: str) -> bool:
        return key in self._reader.fields

    def meta(self, key: str, default: Any = None) -> Any:
        """A metadata value as Python data (str, int, float, bool, or a list of them)."""
        field = self._reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except (UnicodeDecodeError, IndexError, ValueError) as e:
            raise CorruptCheckpointError(f"'{self.path}': metadata '{key}' cannot be decoded: {e}") from e

    def require(self, key: str) -> Any:
        value = self.meta(key)
        if value is None:
            raise CheckpointError(f"'{self.path}' has no '{key}' metadata; it is needed to rebuild the model")
        return value

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def type_name(self, name: str) -> str:
        return self._tensors[name].tensor_type.name

    def shape(self, name: str) -> tuple[int, ...]:
        """Hugging Face order (outermost first)."""
        return tuple(int(d) for d in reversed(self._tensors[name].shape.tolist()))

    def type_counts(self) -> Counter[str]:
        return Counter(t.tensor_type.name for t in self._tensors.values())

    def check_types(self) -> None:
        """Refuse, naming them, quant types outside SUPPORTED_TYPES (before any work is done)."""
        bad = sorted({t.tensor_type.name for t in self._tensors.values()} - set(SUPPORTED_TYPES))
        if bad:
            example = next(t.name for t in self._tensors.values() if t.tensor_type.name in bad)
            raise CheckpointError(
                f"'{self.path.name}' holds tensors of GGUF type {', '.join(bad)} (e.g. '{example}'), which "
                f"edge-export does not dequantize; supported: {', '.join(SUPPORTED_TYPES)}"
            )

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes (uint8, memory-mapped), for reading quantization codes as they are."""
        return self._tensors[name].data.view(np.uint8)

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32, shaped like `shape(name)`."""
        gguf = _import_gguf()
        t = self._tensors[name]
        if t.tensor_type.name not in SUPPORTED_TYPES:
            self.check_types()
        try:
            out = gguf.quants.dequantize(t.data, t.tensor_type)
        except (ValueError, NotImplementedError) as e:
            raise CorruptCheckpointError(f"'{self.path}': tensor '{name}' cannot be dequantized: {e}") from e
        return np.ascontiguousarray(out, dtype=np.float32).reshape(self.shape(name))
