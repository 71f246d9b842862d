"""The CPU as /proc/cpuinfo names it: its model, and the features that decide which kernels run.

Below everything that reports or keys on the machine: benchmark reports (bench/environment.py) and the
exactness probe's cache key (exactness.py) read the same two facts.
"""

from __future__ import annotations

import platform
from pathlib import Path


def read_file(path: Path) -> str:
    """A /proc or /sys file's text, trimmed; "" where it cannot be read (another OS, a container)."""
    try:
        return path.read_bytes().decode("utf-8", "replace").strip("\x00\n ")
    except OSError:
        return ""


def cpu_model(root: Path | str = "/", default: str | None = None) -> str:
    """/proc/cpuinfo's `model name` (what every benchmark figure is recorded with), else `default`, else the
    platform's processor or machine type."""
    for line in read_file(Path(root) / "proc/cpuinfo").splitlines():
        if line.partition(":")[0].strip() == "model name":
            return line.partition(":")[2].strip()
    return default if default is not None else (platform.processor() or platform.machine() or "unknown")


# /proc/cpuinfo flags that decide which kernels run and how fast (x86 `flags`, ARM `Features`), in the
# names reports use: every speed figure names them, since the CPU changes between machines and sessions.
_FEATURES = {
    "avx2": "AVX2",
    "fma": "FMA",
    "f16c": "F16C",
    "avx512f": "AVX-512F",
    "avx512_vnni": "AVX-512 VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "AVX-512 BF16",
    "amx_int8": "AMX-INT8",
    "amx_bf16": "AMX-BF16",
    "asimd": "NEON",
    "asimddp": "NEON dot product",
    "i8mm": "I8MM",
    "sve": "SVE",
}


def cpu_features(root: Path | str = "/") -> list[str]:
    """The kernel-relevant features of the first CPU in /proc/cpuinfo, in _FEATURES' order ([] if unknown)."""
    for line in read_file(Path(root) / "proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            have = set(value.split())
            return [name for flag, name in _FEATURES.items() if flag in have]
    return []
