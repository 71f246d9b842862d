"""The process's peak resident set size, as every report records it (generation stats, exports, /metrics)."""

from __future__ import annotations

import resource
import sys


def peak_rss_bytes() -> int:
    """getrusage's ru_maxrss in bytes: the process's peak so far (Linux reports KiB, macOS bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


# glibc's mallopt parameter: allocations of at least this many bytes are mmapped, and unmapped when freed.
_M_MMAP_THRESHOLD = -3
LARGE_BUFFER_BYTES = 1 << 20


def _libc():
    """glibc through ctypes, or None (not Linux, no C library found)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return None if name is None else ctypes.CDLL(name)
    except OSError:
        return None


def trim_heap() -> bool:
    """Give the heap's free memory back to the OS now (glibc's malloc_trim; False elsewhere, where nothing
    changes). For after a load that frees far more than it keeps: reading Gemma 3's 262,144-token tokenizer.json
    leaves 96 MB of tokenizer and 194 MB of freed parse buffers that glibc would otherwise hold for good."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)  # musl has none
    if trim is None:
        return False
    import ctypes

    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def return_large_buffers() -> bool:
    """Make every allocation of LARGE_BUFFER_BYTES or more its own mapping, returned to the OS when freed (glibc
    only; False elsewhere, where nothing changes).

    glibc raises its mmap threshold after each large free (up to 32 MiB), so later large buffers come from the
    heap of the thread that asked, and each thread's heap keeps its high-water mark: with two edge-serve workers,
    six refused 2 MB requests grew RSS by 126 MiB (tests/test_serve_errors.py, in CI), 17-40 MiB with the
    threshold fixed. Nothing allocates per token, so the mappings cost nothing in steady state."""
    import ctypes

    mallopt = getattr(_libc(), "mallopt", None)  # musl has none
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES) == 1
