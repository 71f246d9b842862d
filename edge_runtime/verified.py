"""Remember which bundle files were hashed and matched, so an unchanged bundle loads without re-hashing.

Hashing every load costs ~0.07 s for a 135M int4 bundle and ~0.6 s for a 1B one (1.6 GB/s sha256 here),
a quarter to a half of the whole load. Like git's index, a memo records a file's stat identity (device,
inode, size, mtime and ctime in ns) next to the sha256 it matched; while all of them are unchanged the
file is taken as verified. Any write to the file changes its ctime, which no user tool can set back, so a
modified file is re-hashed even if its size and mtime were restored.

"Racy" files (changed within RACY_NS of the check, as right after an export) are never memoised: a write
landing in the same timestamp tick as the hash could otherwise go unnoticed.

The memo guards against corrupted or half-copied bundles, as the checksums do; it is not a signature
(whoever can rewrite a bundle can rewrite its manifest). A memo that cannot be read or written (read-only
home, full disk) only means the file is hashed again. Records are ~200 bytes, one per file path, under
`<cache>/verified/`; records of deleted bundles are never read again, and removing the folder is safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from .cachedir import cache_dir

RACY_NS = 2_000_000_000  # files changed this recently are hashed every time


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _memo_path(file: Path) -> Path:
    key = hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:32]
    return cache_dir() / "verified" / key


def memo_matches(file: Path, sha256: str) -> bool:
    """True when `file` was hashed to `sha256` before and has not changed since."""
    try:
        record = json.loads(_memo_path(file).read_text())
        return record.get("sha256") == sha256 and record.get("stat") == _identity(file.stat())
    except (OSError, ValueError):
        return False


def remember(file: Path, sha256: str, st: os.stat_result) -> None:
    """Record that `file`, with stat `st` taken before hashing, matched `sha256`. Best effort."""
    if _identity(file.stat()) != _identity(st):  # changed while it was being hashed
        return
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_NS:
        return
    path = _memo_path(file)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"file": str(file.resolve()), "sha256": sha256, "stat": _identity(st)}, f)
        os.replace(tmp, path)  # atomic: concurrent loaders see the old record or the new one
    except OSError:
        Path(tmp).unlink(missing_ok=True)
