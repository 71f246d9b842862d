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


def return_large_buffers() -> bool:
    """Make every allocation of LARGE_BUFFER_BYTES or more its own mapping, returned to the OS when freed (glibc
    only; False elsewhere, where nothing changes).

    glibc raises its mmap threshold after each large free (up to 32 MiB), so later large buffers come from the
    heap of the thread that asked, and each thread's heap keeps its high-water mark: with two edge-serve workers,
    six refused 2 MB requests grew RSS by 126 MiB (tests/test_serve_errors.py, in CI), 17-40 MiB with the
    threshold fixed. Nothing allocates per token, so the mappings cost nothing in steady state."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # musl has no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES) == 1
