"""rss.trim_heap: freed heap memory that glibc would keep goes back to the OS (the tokenizer calls it after
reading tokenizer.json, whose parse buffers for a large vocabulary are hundreds of MB)."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import pytest

from edge_runtime.rss import trim_heap


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_freed_small_allocations_go_back_to_the_os():
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 80 MB in 1 KB blocks (below any mmap threshold: heap), every 64th kept so the heap's top cannot shrink
    # on its own, the rest freed: glibc holds the freed pages until trimmed.
    blocks = [libc.malloc(1024) for _ in range(80 * 1024)]
    for b in blocks:
        ctypes.memset(b, 1, 1024)
    kept = blocks[::64]
    for i, b in enumerate(blocks):
        if i % 64:
            libc.free(b)
    before = _rss_mb()
    assert trim_heap()
    after = _rss_mb()
    for b in kept:
        libc.free(b)
    assert before - after > 40, (before, after)
