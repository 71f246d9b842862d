"""What a load verifies, and how cheaply: a memo of files hashed and matched, re-checked by sampling.

A file with no usable memo is hashed in full (sha256, against the manifest). That pass also records a
CRC-32 of every CHUNK_BYTES chunk, and the memo keeps them next to the file's stat identity (device,
inode, size, mtime and ctime in ns) and the time of this full check. On a later load of an unchanged
file (same stat identity) the memo stands in for the full hash, but not blindly:

- Files of at most FULL_HASH_BYTES (the graph, tokenizer, small bundles' data) are hashed in full anyway.
- A bigger file has SAMPLE_CHUNKS chunks, chosen at random on each load, read and compared with their
  recorded CRCs. A mismatch triggers a full sha256: a changed file is refused, and a memo that was
  itself corrupted (while the file is fine) is rewritten.
- A file whose last full check is older than FULL_EVERY_S is hashed in full again (and re-memoised).
- `--verify full` (`LoadOptions(verify="full")`, `edge-export inspect`) hashes every byte.

The guarantee, honestly: any write through the file system changes ctime, so a modified file is always
re-hashed in full. Corruption that bypasses the file system (bit rot, a raw write to the SD card) leaves
the stat data alone; a load catches it with probability 1 - (1 - c/n)^SAMPLE_CHUNKS for c corrupted
chunks of the file's n. The issue's 1 MiB XOR spans 16 chunks: 26% per load on the 1B int4 bundle's
876 MB data file (95% within 10 loads), 95% per load on a 135M int4 one (90 MB); a single flipped bit,
1.9% and 17% per load. Whatever the sample misses is caught with certainty by the first load
FULL_EVERY_S after the last full hash, or at once with --verify full. In between, run time is the
backstop: non-finite or degenerate logits are refused (logits_check.py), which is how a corrupted scale
block usually shows. Costs, measured on the 1B int4 bundle (scripts/verify_cost.py): sampled ~40 ms
per load, the full pass ~2.4 s (sha256 alone was ~1.7 s; the chunk CRCs add ~40% to the full pass).

"Racy" files (changed within RACY_NS of the check, as right after an export) are never memoised: a write
landing in the same timestamp tick as the hash could otherwise go unnoticed.

The memo guards against corrupted or half-copied bundles, as the checksums do; it is not a signature
(whoever can rewrite a bundle can rewrite its manifest). A memo that cannot be read or written (read-only
home, full disk) only means the file is hashed again. Records are ~300 bytes plus 85 bytes per MiB of
file, one per file path, under `<cache>/verified/`; records of deleted bundles are never read again, and
removing the folder is safe.
"""

from __future__ import annotations

import array
import base64
import hashlib
import json
import os
import random
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from .cachedir import cache_dir

RACY_NS = 2_000_000_000  # files changed this recently are hashed every time
# Small chunks spread a load's sample over many places: a corrupted region of R bytes is hit with
# probability ~ 1 - exp(-SAMPLE_CHUNKS * R / size) when R >> CHUNK_BYTES, so more chunks per byte read
# catch regions sooner; 64 KiB keeps random reads on an SD card efficient and the memo ~6 KB per 100 MB.
CHUNK_BYTES = 64 << 10
_READ_BYTES = 1 << 20  # the full pass reads this much at a time
FULL_HASH_BYTES = 32 << 20  # files up to this size are hashed in full on every load
SAMPLE_CHUNKS = 256  # chunks of a bigger file checked per load: 16 MiB read
FULL_EVERY_S = 7 * 86400  # a memoised file is hashed in full again after this long
_VERSION = 2  # records of other versions (v1 had no chunk CRCs) are ignored: the file is re-hashed


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _memo_path(file: Path) -> Path:
    key = hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:32]
    return cache_dir() / "verified" / key


@dataclass(frozen=True)
class Digest:
    """A full pass over a file: its sha256 and the CRC-32 of each CHUNK_BYTES chunk."""

    sha256: str
    crcs: array.array


def hash_file(path: Path) -> Digest:
    h = hashlib.sha256()
    crcs = array.array("I")
    with path.open("rb") as f:
        while block := f.read(_READ_BYTES):
            h.update(block)
            view = memoryview(block)
            for i in range(0, len(view), CHUNK_BYTES):
                crcs.append(zlib.crc32(view[i : i + CHUNK_BYTES]))
    return Digest(h.hexdigest(), crcs)


@dataclass(frozen=True)
class Memo:
    crcs: array.array
    full_at_s: float  # wall time of the last full hash


def memo_for(file: Path, sha256: str) -> Memo | None:
    """The memo of `file` when it was hashed to `sha256` before and its stat data is unchanged since."""
    try:
        record = json.loads(_memo_path(file).read_text())
        if record.get("v") != _VERSION or record.get("sha256") != sha256:
            return None
        if record.get("stat") != _identity(file.stat()) or record.get("chunk") != CHUNK_BYTES:
            return None
        crcs = array.array("I")
        crcs.frombytes(base64.b64decode(record["crcs"], validate=True))
        if len(crcs) != -(-record["stat"][2] // CHUNK_BYTES):
            return None
        return Memo(crcs, float(record["full_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def needs_full_hash(file_size: int, memo: Memo | None, now_s: float | None = None) -> bool:
    if memo is None or file_size <= FULL_HASH_BYTES:
        return True
    return (time.time() if now_s is None else now_s) - memo.full_at_s >= FULL_EVERY_S


def sampled_chunks_match(file: Path, memo: Memo, k: int | None = None) -> bool:
    """Read `k` (default SAMPLE_CHUNKS) random chunks of `file`; True when each CRC matches the memo's."""
    n = len(memo.crcs)
    picks = random.SystemRandom().sample(range(n), min(n, SAMPLE_CHUNKS if k is None else k))
    with file.open("rb") as f:
        for i in sorted(picks):  # in file order: sequential-ish reads on slow media
            f.seek(i * CHUNK_BYTES)
            if zlib.crc32(f.read(CHUNK_BYTES)) != memo.crcs[i]:
                return False
    return True


def remember(file: Path, digest: Digest, st: os.stat_result) -> None:
    """Record that `file`, with stat `st` taken before hashing, matched `digest`. Best effort."""
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
    record = {
        "v": _VERSION,
        "file": str(file.resolve()),
        "sha256": digest.sha256,
        "stat": _identity(st),
        "chunk": CHUNK_BYTES,
        "crcs": base64.b64encode(digest.crcs.tobytes()).decode(),
        "full_at": time.time(),
    }
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)  # atomic: concurrent loaders see the old record or the new one
    except OSError:
        Path(tmp).unlink(missing_ok=True)
