"""Open a bundle directory: read the manifest, check its format version and every file's sha256
(once per file change: verified.py)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .errors import BundleError
from .manifest import MANIFEST_FILE, Manifest
from .verified import memo_matches, remember

_CHUNK = 1 << 20


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


def open_bundle(path: str | Path, *, verify: bool = True, memo: bool = True) -> Bundle:
    """Read `path/manifest.json`; with `verify`, refuse a bundle whose files are missing or altered.

    With `memo`, a file hashed and matched before and unchanged since (verified.py) is not hashed again.
    """
    path = Path(path)
    if not path.is_dir():
        raise BundleError(f"bundle directory '{path}' does not exist")
    manifest = Manifest.read(path / MANIFEST_FILE)
    if verify:
        for name, expected in manifest.files.items():
            file = path / name
            if not file.is_file():
                raise BundleError(f"bundle '{path}' is missing '{name}'; re-export it")
            if memo and memo_matches(file, expected):
                continue
            st = file.stat()
            if sha256_file(file) != expected:
                raise BundleError(
                    f"'{file}' does not match the checksum in {MANIFEST_FILE} (corrupted or modified); "
                    "re-export the bundle"
                )
            if memo:
                remember(file, expected, st)
    return Bundle(path=path, manifest=manifest)
