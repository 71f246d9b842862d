"""edge-runtime's own ONNX Runtime kernels (`csrc/`): the `ai.edge_runtime` ops MatMulQ4 (INT4 x int8
matmul on MatMulNBits' bytes), MatMulQ8 (INT8 per-channel x int8), MatMulGGUF (a GGUF tensor's llama.cpp
blocks, Q4_0 to Q6_K, as stored, x int8: csrc/ggml_blocks.h), SiluMul (silu(gate) * up of a fused
gate|up row), LinearAttention (GroupQueryAttention's packed-qkv decode/prefill over the ring while it is
a linear cache) and RingAttention (the ring at any fill: wrapped rows, the window as a mask, sinks seeing
the query at its cache-logical position).

The shared library is built by `pip install` on x86-64 with a C compiler (an optional extension: where it
cannot be built, or the CPU lacks AVX2/FMA/F16C, `--kernel edge` exports are refused and bundles that need
the ops say so when loaded). MatMulQ4 and MatMulQ8 have three implementations each, chosen when a session
is created: AMX (Intel Sapphire Rapids and later: tiles for calls of more than 16 rows, the VNNI code for
fewer), else AVX-512 VNNI where the CPU has it (Zen 4, Intel Ice Lake and later), else AVX2;
`EDGE_KERNELS_ISA=avx2` (or `avx512vnni`, `amx`) pins one for both ops, for A/B runs. MatMulGGUF runs its
AVX-512 VNNI code where they run VNNI or AMX, its AVX2 code elsewhere (the same integers either way).

    so = onnxruntime.SessionOptions()
    kernels.register(so)          # True if the ops are now available to sessions made from `so`
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from functools import cache
from pathlib import Path

import onnxruntime as ort

from edge_runtime.errors import KernelPinError

DOMAIN = "ai.edge_runtime"
MATMUL_Q4 = "MatMulQ4"
MATMUL_Q8 = "MatMulQ8"
MATMUL_GGUF = "MatMulGGUF"
SILU_MUL = "SiluMul"
LINEAR_ATTENTION = "LinearAttention"
RING_ATTENTION = "RingAttention"
GATHER_GGUF = "GatherGGUF"
OPS = (MATMUL_Q4, MATMUL_Q8, MATMUL_GGUF, SILU_MUL, LINEAR_ATTENTION, RING_ATTENTION, GATHER_GGUF)
_MODULE = "edge_runtime._edge_kernels"
ISA_VARIABLE = "EDGE_KERNELS_ISA"
ISAS = ("avx2", "avx512vnni", "amx")
# Most rows one call of an op computes bit for bit as that many one-row calls (None: any number), per
# implementation; tests/test_kernels_q8.py holds each entry to it. Both close a column's float sums at the
# same K chunks at every row count; MatMulQ8 keeps decode's sum tree up to 16 rows (csrc/q8kernel.h); the
# AVX2 MatMulQ4 sums up to four rows in decode's two-accumulator order, and more rows (prompt tiles of
# eight, K in chunks past four rows) in their own; the AMX implementations run VNNI's code up to 16 rows
# and AMX tiles above (csrc/qgemm_amx.c). SiluMul, LinearAttention and RingAttention
# compute each row alike at any row count, and so does MatMulGGUF (one body for every row, its float sums closed at
# the same K chunks).
_EXACT_ROWS: dict[tuple[str, str], int | None] = {
    (MATMUL_Q4, "avx512vnni"): None,
    (MATMUL_Q4, "avx2"): 4,
    (MATMUL_Q8, "avx512vnni"): 16,
    (MATMUL_Q8, "avx2"): 16,
    (MATMUL_Q4, "amx"): 16,
    (MATMUL_Q8, "amx"): 16,
}


@cache
def library() -> Path | None:
    """The built kernel library, or None where it was not built (non-x86 hosts, no compiler)."""
    spec = importlib.util.find_spec(_MODULE)
    return Path(spec.origin) if spec is not None and spec.origin else None


@cache
def unavailable_reason() -> str | None:
    """Why sessions here cannot run the edge ops, or None if they can."""
    lib = library()
    if lib is None:
        return "edge-runtime's kernel library was not built on this machine (x86-64 with a C compiler needed)"
    try:
        ort.SessionOptions().register_custom_ops_library(str(lib))
    except Exception as e:  # onnxruntime raises its own Fail type; the library's status message says why
        return f"{lib.name} cannot be used here: {e}"
    return None


def available() -> bool:
    return unavailable_reason() is None


def isa() -> str | None:
    """The MatMulQ4/MatMulQ8 implementation sessions created now run ("amx", "avx512vnni" or "avx2"), or None where the
    ops are unavailable or EDGE_KERNELS_ISA names one this CPU lacks (such sessions then fail to load)."""
    lib = library()
    if lib is None or not available():
        return None
    query = ctypes.CDLL(str(lib)).EdgeKernelsIsa
    query.restype = ctypes.c_char_p
    name = query()
    return name.decode() if name else None


def check_pin() -> None:
    """Raise KernelPinError where EDGE_KERNELS_ISA names an implementation this CPU does not run, so the
    mistake is one line at the start, not an ONNX Runtime exception from inside a session."""
    pinned = os.environ.get(ISA_VARIABLE)
    if pinned and available() and isa() is None:
        raise KernelPinError(
            f"{ISA_VARIABLE}={pinned} is not a MatMulQ4 implementation this CPU runs (it runs: "
            f"{', '.join(runnable())}); unset {ISA_VARIABLE} to pick the fastest"
        )


def exact_rows(ops: set[str], implementation: str | None = None) -> int | None:
    """Most rows a chunk of a graph using these edge ops computes bit for bit as one-row decode steps
    (None: any), under `implementation` (default: the one sessions created now run). Speculative
    decoding's greedy exactness verifies at most this many rows a step."""
    implementation = implementation or isa()
    caps = [_EXACT_ROWS.get((op, implementation or ""), 1) for op in ops if op in (MATMUL_Q4, MATMUL_Q8)]
    caps = [c for c in caps if c is not None]
    return min(caps) if caps else None


def runnable() -> list[str]:
    """The MatMulQ4/MatMulQ8 implementations this CPU runs (EDGE_KERNELS_ISA may name any of them)."""
    query = ctypes.CDLL(str(library())).EdgeKernelsIsaRuns
    query.argtypes, query.restype = [ctypes.c_char_p], ctypes.c_int
    return [name for name in ISAS if query(name.encode())]


def register(so: ort.SessionOptions, *, check: bool = True) -> bool:
    """Make the edge ops available to sessions created from `so`; False (nothing done) where unavailable.
    Raises KernelPinError where EDGE_KERNELS_ISA names an implementation this CPU lacks."""
    if check and not available():
        return False
    lib = library()
    if lib is None:
        return False
    check_pin()
    so.register_custom_ops_library(str(lib))
    return True
