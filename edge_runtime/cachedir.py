"""Where edge-runtime keeps per-user state: first-use bundles (`edge-run --model`) and verified-file memos.

`$EDGE_RUNTIME_CACHE` if set, else `$XDG_CACHE_HOME/edge-runtime`, else `~/.cache/edge-runtime`.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    if os.environ.get("EDGE_RUNTIME_CACHE"):
        return Path(os.environ["EDGE_RUNTIME_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge-runtime"
