"""Open a bundle directory: read the manifest, check its format version and digest, confine every
file it names to the directory, and check every file's sha256: in full when it changed, re-checked by
sampled chunk CRCs while it did not, in full again weekly or on demand (verified.py has the scheme).

Confinement is checked on every open, verified or not: a manifest could otherwise point the runtime
at any file on the machine (`graph.file` in another directory, bypassing ONNX Runtime's own
confinement of external data; `files` entries like `../../secret.txt` hashed, an existence and
content oracle; `tokenizer.file` of `/dev/zero`, read until out of memory). Names are plain names
(manifest.py), each a regular file; a symlink may point only inside the bundle; sizes are bounded.
"""

from __future__ import annotations

import hashlib
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import verified
from .errors import BundleError
from .manifest import MANIFEST_FILE, Manifest, referenced_files
from .verified import hash_file, memo_for, needs_full_hash, remember, sampled_chunks_match

_CHUNK = 1 << 20
# off: no checksums (confinement still checked); sampled: the default (verified.py); full: every byte.
VerifyMode = Literal["off", "sampled", "full"]
VERIFY_MODES: tuple[VerifyMode, ...] = ("off", "sampled", "full")
# The biggest tokenizer.json files in use are tens of MB (Gemma 3: 33 MB); the tokenizer is read whole.
TOKENIZER_MAX_BYTES = 256 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def stored_bytes(path: Path) -> int:
    """Bytes a file holds: its size less any holes (exports seek over the gaps that align the weights,
    exporters/external_data.py; nothing maps them, so they cost neither disk nor memory)."""
    st = path.stat()
    blocks = getattr(st, "st_blocks", None)
    return st.st_size if blocks is None else min(st.st_size, blocks * 512)


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: Manifest

    @property
    def graph_file(self) -> Path:
        return self.path / self.manifest.graph.file

    @property
    def tokenizer_file(self) -> Path:
        return self.path / self.manifest.tokenizer.file

    def size_bytes(self) -> int:
        return sum(stored_bytes(p) for p in self.path.iterdir() if p.is_file())


def verify_mode(verify: bool | str) -> VerifyMode:
    """`True`/`False` (the older boolean API) or a mode name, as a mode."""
    if verify is True:
        return "sampled"
    if verify is False:
        return "off"
    if verify not in VERIFY_MODES:
        raise BundleError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
    return verify  # type: ignore[return-value]


def open_bundle(path: str | Path, *, verify: bool | VerifyMode = True, memo: bool = True) -> Bundle:
    """Read `path/manifest.json`; unless `verify` is off, refuse a bundle whose files are missing or altered.

    `verify`: "sampled" (or True) re-checks a file memoised as verified by sampled chunk CRCs, "full"
    hashes every byte (and refreshes the memos), "off" (or False) checks no checksums. Without `memo`,
    no memo is read or written: every byte is hashed.
    """
    mode = verify_mode(verify)
    path = Path(path)
    if not path.is_dir():
        raise BundleError(f"bundle directory '{path}' does not exist")
    manifest = Manifest.read(path / MANIFEST_FILE)
    _confine(path, manifest)
    if mode != "off":
        for name, expected in manifest.files.items():
            _verify_file(path / name, expected, sampled=memo and mode == "sampled", memo=memo)
    return Bundle(path=path, manifest=manifest)


def _verify_file(file: Path, expected: str, *, sampled: bool, memo: bool) -> None:
    st = file.stat()
    small = st.st_size <= verified.FULL_HASH_BYTES  # hashed on every load: no memo to read or write
    record = memo_for(file, expected) if sampled and not small else None
    if record is not None and not needs_full_hash(st.st_size, record) and sampled_chunks_match(file, record):
        return
    # No memo, a small file, a week since the last full hash, --verify full, or a sampled chunk that
    # differs from the memo: the full hash decides (a mismatch there may be the memo's own corruption).
    digest = hash_file(file)
    if digest.sha256 != expected:
        raise BundleError(
            f"'{file}' does not match the checksum in {MANIFEST_FILE} (corrupted or modified); re-export the bundle"
        )
    if memo and not small:
        remember(file, digest, st)


def _confine(path: Path, manifest: Manifest) -> None:
    """Every file the manifest names is a regular file inside `path` (names are plain: manifest.py)."""
    root = path.resolve()
    for name in {*manifest.files, *referenced_files(manifest)}:
        file = path / name
        try:
            st = file.lstat()
            if stat.S_ISLNK(st.st_mode):  # allowed only if it stays inside the bundle
                target = file.resolve(strict=True)
                if target.parent != root and root not in target.parents:
                    raise BundleError(f"'{file}' is a symbolic link out of the bundle directory; refusing to read it")
                st = target.stat()
        except FileNotFoundError:
            raise BundleError(f"bundle '{path}' is missing '{name}'; re-export it") from None
        except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop on older Pythons
            raise BundleError(f"cannot read '{file}': {getattr(e, 'strerror', None) or e}") from e
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"'{file}' is not a regular file; a bundle holds only plain files")
    tok = path / manifest.tokenizer.file
    if tok.stat().st_size > TOKENIZER_MAX_BYTES:
        raise BundleError(
            f"'{tok}' is {tok.stat().st_size / 2**20:.0f} MiB, over the {TOKENIZER_MAX_BYTES >> 20} MiB a tokenizer "
            "may be; it is not a tokenizer.json"
        )
