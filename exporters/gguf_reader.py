"""Read a GGUF file (llama.cpp's format) as plain metadata and float32 tensors, torch-free.

gg = GGUFFile("SmolLM2-135M-Instruct.Q4_1.gguf")
gg.architecture, gg.meta("llama.block_count"), gg.tensor("blk.0.attn_q.weight").shape  # [out, in]

Tensors come back in Hugging Face orientation: GGUF lists dimensions innermost first (ne0 = the
input features of a Linear), numpy's row-major view of the data is therefore already [out, in].
Everything else (names, llama.cpp's Q/K permutation, config keys) is `gguf_convert`'s business.
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from collections.abc import Iterator
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


# Bounds on what a GGUF's header and metadata may claim, checked by `check_layout` before gguf's reader sees
# the file. That reader makes a numpy view per array element (about 400 bytes each, two per string) and
# follows a claimed count past the end of the file, so a file of a few hundred bytes claiming a 2^40-entry
# array would take it minutes and gigabytes before it failed, and a real 20M-entry array 8 GB. Real files
# are far inside these: tens of keys, under a thousand tensors (Llama 3.1 70B has 724), per-layer arrays
# of block_count entries, and tokenizer arrays of the vocabulary's size (Gemma 3: 262,144 tokens, scores
# and token types; Llama 3: 128,256 tokens and 280,147 merges). Four arrays of 262,144 (Gemma 3's three
# and as many merges) already cost gguf's reader about 1 GB and 12 s, so the total bound keeps a file
# within bounds near twice that.
MAX_KEY_BYTES = 65_535  # the GGUF spec's limit on a key's length; also applied to tensor names
MAX_KV = 65_536
MAX_TENSORS = 65_536
MAX_TENSOR_DIMS = 4  # GGML_MAX_DIMS: llama.cpp reads no tensor of more
MAX_TOKENIZER_ARRAY = 1 << 20  # entries of one `tokenizer.ggml.*` array (vocabulary, merges, scores, types)
MAX_ARRAY = 1 << 16  # entries of any other array
MAX_ARRAY_ENTRIES = 1 << 21  # entries of all arrays together
CHUNK_BYTES = 16 << 20  # float32 output of one tensor_rows block

_STRING, _ARRAY = 8, 9
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType -> size
_TYPE_NAMES = {
    0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32", 6: "FLOAT32", 7: "BOOL",
    8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64", 12: "FLOAT64",
}  # fmt: skip


class _Layout:
    """A bounds-checked walk over a GGUF's header, metadata and tensor infos (never the tensor data)."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path
        self.order = "<"

    def corrupt(self, why: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"'{self.path}' is not a valid GGUF file (truncated or corrupt?): {why}")

    def skip(self, n: int, what: str) -> int:
        left = len(self.buf) - self.pos
        if n > left:
            raise self.corrupt(f"{what} needs {n} bytes but only {left} remain in the file")
        start, self.pos = self.pos, self.pos + n
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from(self.order + "I", self.buf, self.skip(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from(self.order + "Q", self.buf, self.skip(8, what))[0]

    def name(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        if n > MAX_KEY_BYTES:
            raise self.corrupt(f"{what} claims a length of {n} bytes (at most {MAX_KEY_BYTES})")
        start = self.skip(n, what)
        return bytes(self.buf[start : start + n]).decode("utf-8", errors="replace")

    def run(self) -> None:
        if self.buf[:4] != b"GGUF":
            raise self.corrupt(f"it starts with {bytes(self.buf[:4])!r}, not the magic b'GGUF'")
        self.pos = 4
        version = self.u32("the version")
        if version & 0xFFFF == 0:  # written on a machine of the other byte order, as gguf's reader infers
            self.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
        if version not in (2, 3):
            raise CheckpointError(f"'{self.path}' is GGUF version {version}; edge-export reads versions 2 and 3")
        tensors, kvs = self.u64("the tensor count"), self.u64("the metadata count")
        # Smallest encodings: a key/value is a length, a type and a 1-byte value; a tensor info a name's
        # length, a dimension count, a type and an offset.
        need, left = 13 * kvs + 24 * tensors, len(self.buf) - self.pos
        if need > left:
            raise self.corrupt(
                f"its header claims {tensors} tensors and {kvs} metadata entries, which need at least {need} "
                f"bytes; {left} follow the header"
            )
        if kvs > MAX_KV or tensors > MAX_TENSORS:
            raise CheckpointError(
                f"'{self.path}': its header claims {tensors} tensors and {kvs} metadata entries; edge-export "
                f"reads at most {MAX_TENSORS} and {MAX_KV}"
            )
        entries = 0
        for _ in range(kvs):
            key = self.name("a metadata key")
            kind = self.u32(f"the type of metadata '{key}'")
            if kind in _SCALAR_BYTES:
                self.skip(_SCALAR_BYTES[kind], f"metadata '{key}'")
            elif kind == _STRING:
                self.skip(self.u64(f"the length of metadata '{key}'"), f"metadata '{key}' (a string)")
            elif kind == _ARRAY:
                entries += self.array(key, entries)
            else:
                raise self.corrupt(f"metadata '{key}' has unknown value type {kind}")
        for _ in range(tensors):
            name = self.name("a tensor name")
            dims = self.u32(f"the dimension count of tensor '{name}'")
            if dims > MAX_TENSOR_DIMS:
                raise self.corrupt(f"tensor '{name}' claims {dims} dimensions (at most {MAX_TENSOR_DIMS})")
            self.skip(8 * dims + 12, f"the shape, type and offset of tensor '{name}'")

    def array(self, key: str, entries: int) -> int:
        """Skip one array value, checking its count against the bytes left and the bounds; its count."""
        kind = self.u32(f"the element type of metadata '{key}'")
        count = self.u64(f"the length of metadata '{key}'")
        if kind not in _SCALAR_BYTES and kind != _STRING:
            what = "arrays of arrays, which llama.cpp does not read either" if kind == _ARRAY else f"type {kind}"
            raise self.corrupt(f"metadata '{key}' is an array of {what}")
        size = _SCALAR_BYTES.get(kind, 8)  # a string is at least its 8-byte length
        left = len(self.buf) - self.pos
        if count * size > left:
            raise self.corrupt(
                f"metadata '{key}' claims {count} {_TYPE_NAMES[kind]} entries, at least {count * size} bytes, "
                f"but only {left} remain in the file"
            )
        limit = MAX_TOKENIZER_ARRAY if key.startswith("tokenizer.ggml.") else MAX_ARRAY
        if count > limit or entries + count > MAX_ARRAY_ENTRIES:
            raise CheckpointError(
                f"'{self.path}': metadata '{key}' is an array of {count} entries; edge-export reads at most "
                f"{limit} per array ({MAX_TOKENIZER_ARRAY} for tokenizer.ggml.* arrays) and {MAX_ARRAY_ENTRIES} "
                "in all, to bound the memory gguf's reader takes"
            )
        if kind != _STRING:
            self.skip(count * size, f"metadata '{key}'")
            return count
        buf, unpack, fmt, pos, end = self.buf, struct.unpack_from, self.order + "Q", self.pos, len(self.buf)
        for i in range(count):  # the hot loop of a real vocabulary: inlined
            if end - pos < 8:
                self.pos = pos
                self.skip(8, f"the length of entry {i} of metadata '{key}'")
            pos += 8 + unpack(fmt, buf, pos)[0]
            if pos > end:
                raise self.corrupt(f"entry {i} of metadata '{key}' (a string) runs {pos - end} bytes past the end")
        self.pos = pos
        return count


def check_layout(path: Path) -> None:
    """Refuse, in one line and before gguf's reader is handed the file, a GGUF whose header, metadata or
    tensor infos claim a count or length past the end of the file or beyond the bounds above."""
    try:
        with path.open("rb") as f:
            if path.stat().st_size < 24:  # mmap refuses an empty file; no GGUF header is shorter
                raise CorruptCheckpointError(
                    f"'{path}' is not a valid GGUF file (truncated or corrupt?): {path.stat().st_size} bytes"
                )
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise CheckpointError(f"cannot read '{path}': {e.strerror or e}") from e
    try:
        _Layout(buf, path).run()
    finally:
        buf.close()


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise CheckpointError(
            "reading a .gguf file needs the `gguf` package: pip install 'edge-runtime[gguf]'"
        ) from None
    return gguf


_INTS = frozenset({"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64"})
# GGUF value types each `GGUFFile.meta` kind accepts ("float": any number, as an int-valued score is still one)
_KINDS = {"str": {"STRING"}, "int": _INTS, "float": _INTS | {"FLOAT32", "FLOAT64"}, "bool": {"BOOL"}}
_KIND_NAMES = {"str": ("STRING", "STRING"), "int": ("an integer", "integers"), "float": ("a number", "numbers"),
               "bool": ("BOOL", "BOOL")}  # fmt: skip


class GGUFFile:
    """One GGUF file, parsed and checked on open; tensor data memory-mapped, dequantized on demand."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        gguf = _import_gguf()
        if not self.path.is_file():
            raise CheckpointError(f"GGUF file '{self.path}' does not exist")
        check_layout(self.path)
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

    def meta(self, key: str, default: Any = None, *, kind: str | None = None) -> Any:
        """A metadata value as Python data (str, int, float, bool, or a list of them). `kind` ("str", "int",
        "float", "bool", or one of them + "[]" for an array) refuses, in one line, a value stored as another
        GGUF type: code that reads it would otherwise fail deep inside with a traceback, or misread it."""
        field = self._reader.fields.get(key)
        if field is None:
            return default
        if kind is not None:
            self._check_kind(key, [t.name for t in field.types], kind)
        try:
            return field.contents()
        except (UnicodeDecodeError, IndexError, ValueError) as e:
            raise CorruptCheckpointError(f"'{self.path}': metadata '{key}' cannot be decoded: {e}") from e

    def entries(self, key: str) -> int:
        """How many values an array holds (0 where the key is absent), without decoding them."""
        field = self._reader.fields.get(key)
        return 0 if field is None else len(field.data)

    def _check_kind(self, key: str, types: list[str], kind: str) -> None:
        element = kind.removesuffix("[]")
        if kind.endswith("[]"):  # an empty array records no element type: any will do
            ok = types[0] == "ARRAY" and (len(types) == 1 or types[-1] in _KINDS[element])
        else:
            ok = len(types) == 1 and types[0] in _KINDS[element]
        if not ok:
            stored = types[0] if len(types) == 1 else f"an array of {types[-1]}"
            one, many = _KIND_NAMES[element]
            wanted = f"an array of {many}" if kind.endswith("[]") else one
            raise CheckpointError(f"'{self.path.name}': metadata '{key}' is {stored}, expected {wanted}")

    def require(self, key: str, *, kind: str | None = None) -> Any:
        value = self.meta(key, kind=kind)
        if value is None:
            raise CheckpointError(f"'{self.path}' has no '{key}' metadata; it is needed to rebuild the model")
        return value

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture", kind="str"))

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
        return self._dequantize(name, self._tensors[name].data, self.shape(name))

    def tensor_rows(self, name: str, max_bytes: int = CHUNK_BYTES) -> Iterator[np.ndarray]:
        """The tensor dequantized to float32 a block of outermost rows at a time, each block at most `max_bytes`
        (one row at least): gguf's dequantizer holds about twice its output in temporaries, which for a
        262k-token embedding whole (Gemma 3 270M's, 671 MB) was 1.4 GB more than the conversion needed."""
        shape = self.shape(name)
        data = self._tensors[name].data
        if len(shape) < 2:
            yield self.tensor(name)
            return
        row_bytes = 4 * int(np.prod(shape[1:]))
        step = max(1, max_bytes // row_bytes)
        for start in range(0, shape[0], step):
            stop = min(start + step, shape[0])
            yield self._dequantize(name, data[start:stop], (stop - start, *shape[1:]))

    def _dequantize(self, name: str, data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        gguf = _import_gguf()
        t = self._tensors[name]
        if t.tensor_type.name not in SUPPORTED_TYPES:
            self.check_types()
        try:
            out = gguf.quants.dequantize(data, t.tensor_type)
        except (ValueError, NotImplementedError) as e:
            raise CorruptCheckpointError(f"'{self.path}': tensor '{name}' cannot be dequantized: {e}") from e
        return np.ascontiguousarray(out, dtype=np.float32).reshape(shape)
