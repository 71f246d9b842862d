"""First-use bundles: what `edge-run` exports for a checkpoint and a target, kept in cache_dir()/bundles.

A bundle's directory name says what it is and what it was built from:

    {checkpoint}-{flavor}-{quant}[-b{block}[-mixed-{plan}]][-t4][-edge]-{content key}-v{edge-runtime version}

The content key hashes the checkpoint's content, not where it lies or when it was copied (a reinstall
copies the demo checkpoint with new mtimes into a new site-packages: it must find the same bundle).
`edge-cache ls | rm | prune` manage the directory (cli/cache.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cachedir import cache_dir
from .errors import EdgeRuntimeError

BUNDLES = "bundles"
# Small files that decide the bundle's tokens and defaults: hashed whole.
_SMALL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)
_EDGE_MIB = 1 << 20
_NAME = re.compile(r"^(?P<stem>.+)-(?P<key>[0-9a-f]{12})-v(?P<version>[^-/]+)$")


def bundles_dir() -> Path:
    return cache_dir() / BUNDLES


def checkpoint_key(checkpoint: Path) -> str:
    """12 hex digits identifying a checkpoint's content, cheaply: the small files' bytes, and per weight file
    its name, size and the sha256 of its first and last MiB (the first holds a safetensors file's whole
    header: every tensor's name, dtype, shape and offsets). Independent of paths and timestamps. A .gguf
    file is its own one weight file (its first MiB holds the metadata and the tensor table's start)."""
    h = hashlib.sha256()
    if checkpoint.is_file():
        _hash_ends(h, checkpoint)
        return h.hexdigest()[:12]
    for name in _SMALL_FILES:
        f = checkpoint / name
        if f.is_file():
            h.update(f"{name}:".encode() + hashlib.sha256(f.read_bytes()).digest())
    for f in sorted(checkpoint.glob("*.safetensors")):
        _hash_ends(h, f)
    return h.hexdigest()[:12]


def _hash_ends(h: Any, f: Path) -> None:  # h: a hashlib object
    size = f.stat().st_size
    h.update(f"{f.name}:{size}:".encode())
    with f.open("rb") as fh:
        h.update(hashlib.sha256(fh.read(_EDGE_MIB)).digest())
        fh.seek(max(0, size - _EDGE_MIB))
        h.update(hashlib.sha256(fh.read(_EDGE_MIB)).digest())


def is_source(path: Path) -> bool:
    """Whether `path` is something a first-use export reads: a checkpoint directory or a .gguf file."""
    if path.is_dir():
        return (path / "config.json").is_file()
    return path.is_file() and path.suffix.lower() == ".gguf"


def first_use_name(
    checkpoint: Path, flavor: str, quant: str, block: int, kernel: str, table_bits: int, mixed: str = "none"
) -> str:
    from . import __version__

    parts = [checkpoint.stem if checkpoint.is_file() else checkpoint.name, flavor, quant]
    if quant.startswith("int4"):
        parts.append(f"b{block}")
        if mixed != "none":
            parts.append(f"mixed-{mixed}")
    if quant != "none" and table_bits == 4:
        parts.append("t4")
    if kernel == "edge":
        parts.append("edge")
    return f"{'-'.join(parts)}-{checkpoint_key(checkpoint)}-v{__version__}"


@dataclass(frozen=True)
class CachedBundle:
    name: str
    path: Path
    size_bytes: int
    source: str  # the checkpoint or .gguf it was exported from (the manifest's provenance), "" if unreadable
    version: str  # edge-runtime version that wrote it, from the name
    key: str  # the checkpoint content key, from the name
    complete: bool  # has a manifest (an export killed mid-way leaves a partial, not listed as complete)

    def stale_reason(self) -> str | None:
        """Why `prune` removes it, or None: another edge-runtime version, or a source that is gone or changed."""
        from . import __version__

        if not self.complete:
            return "incomplete (no manifest.json)"
        if self.version != __version__:
            return f"written by edge-runtime {self.version or 'unknown'}, this is {__version__}"
        src = Path(self.source) if self.source else None
        if src is None or not is_source(src):
            return f"its checkpoint {self.source or '(unknown)'} is gone"
        if checkpoint_key(src) != self.key:
            return f"its checkpoint {self.source} has changed since"
        return None


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += (Path(root) / f).lstat().st_blocks * 512
            except OSError:
                pass
    return total


def _source(path: Path) -> str:
    from .bounded_read import read_bounded
    from .manifest import MANIFEST_MAX_BYTES

    try:  # bounded, regular files only: a FIFO or a huge file in the cache must not hang or swamp `ls`
        data = json.loads(read_bounded(path / "manifest.json", MANIFEST_MAX_BYTES, "manifest"))
        return str(data.get("provenance", {}).get("source", ""))
    except (EdgeRuntimeError, ValueError, AttributeError, RecursionError):
        return ""


def list_bundles() -> list[CachedBundle]:
    """Every bundle directory in the cache, by name (partial directories of running exports excluded)."""
    root = bundles_dir()
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.iterdir()):
        if not path.is_dir() or path.name.startswith("."):  # hidden: exporters' scratch directories
            continue
        m = _NAME.match(path.name)
        found.append(
            CachedBundle(
                name=path.name,
                path=path,
                size_bytes=tree_bytes(path),
                source=_source(path),
                version=m["version"] if m else "",
                key=m["key"] if m else "",
                complete=(path / "manifest.json").is_file(),
            )
        )
    return found


def remove(bundle: CachedBundle) -> None:
    shutil.rmtree(bundle.path)


def find(name: str) -> CachedBundle:
    """The cached bundle called `name` (exactly, or the one whose name starts with it)."""
    # An empty prefix starts every name (`edge-cache rm ''` removed the only bundle), a path or a hidden name is
    # no bundle's name: refused before anything is listed, let alone removed.
    if not name.strip() or name != name.strip() or name.startswith(".") or any(c in name for c in "/\\\0"):
        raise EdgeRuntimeError(f"{name!r} is not a cached bundle's name; give one as `edge-cache ls` prints it")
    bundles = list_bundles()
    exact = [b for b in bundles if b.name == name]
    matches = exact or [b for b in bundles if b.name.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(b.name for b in bundles) or "none"
        raise EdgeRuntimeError(f"no cached bundle named {name!r} in {bundles_dir()}; cached: {known}")
    raise EdgeRuntimeError(
        f"{name!r} names {len(matches)} cached bundles ({', '.join(b.name for b in matches)}); give the full name"
    )
