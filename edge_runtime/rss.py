"""The process's peak resident set size, as every report records it (generation stats, exports, /metrics)."""

from __future__ import annotations

import resource
import sys


def peak_rss_bytes() -> int:
    """getrusage's ru_maxrss in bytes: the process's peak so far (Linux reports KiB, macOS bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024
