#!/usr/bin/env bash
# The Raspberry Pi 5 software stack under emulation: an arm64 Debian bookworm root filesystem (Pi OS 12,
# Python 3.11) plus the official aarch64 wheels, run by qemu user-mode with the Pi 5's core (Cortex-A76).
#
#   scripts/aarch64_check.sh [PYTEST ARGS...]     # set up (cached), then run the checks
#   scripts/aarch64_check.sh --setup-only          # only the cached set-up (steps 1-2)
#   scripts/aarch64_check.sh --help                # this text
#
# 1. host tools (qemu-user-static, mmdebstrap) from apt if missing;
# 2. cached set-up: ROOTFS (mmdebstrap, extract variant) and an aarch64 site-packages folder (pip
#    --platform manylinux_*_aarch64), keyed by a hash of the pinned requirement list; a second run
#    skips both; a Pi 5 /proc/cpuinfo goes into ROOTFS (qemu 7.2 would show the host's x86 one);
# 3. on the host: a wheel of this project (the installed layout, with exporters/ -> edge_runtime.exporters),
#    the demo model exported in `ort` flavor (fp32, int4, int4 at accuracy_level 0) and the float64
#    references (scripts/aarch64_host.py refs), in CACHE/run (kept after the run for inspection);
# 4. in the emulated interpreter: pytest on tests/aarch64/ and tests/test_telemetry_rpi.py.
#
# Environment: EDGE_AARCH64_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/edge-runtime/aarch64),
# EDGE_AARCH64_MIRROR (default http://deb.debian.org/debian), QEMU_CPU (default cortex-a76), PYTHON
# (host interpreter with the project installed; default python3).
# Research and measurements: docs/research/aarch64-emulation.md.
set -euo pipefail

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then  # the header above, without its '#'
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
    exit 0
fi

REPO="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${EDGE_AARCH64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edge-runtime/aarch64}"
MIRROR="${EDGE_AARCH64_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm          # Raspberry Pi OS 12
PYVER=3.11              # bookworm's python3
ROOTFS_PACKAGES=python3.11,libstdc++6
PLATFORMS=(manylinux_2_28_aarch64 manylinux_2_17_aarch64 manylinux2014_aarch64)
export QEMU_CPU="${QEMU_CPU:-cortex-a76}"  # the Pi 5's core: asimddp, the int8 dot-product kernels
PYTHON="${PYTHON:-python3}"
T0=$SECONDS

say() { printf '[aarch64 %3ds] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf 'aarch64_check: %s\n' "$*" >&2; exit 1; }

# -- 1. host tools -------------------------------------------------------------------------------
missing=()
command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if ((${#missing[@]})); then
    sudo=()
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "need root or sudo to install ${missing[*]} with apt-get"
        sudo=(sudo)
    fi
    say "installing host tools: ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
"$PYTHON" -c 'import edge_runtime.exporters' 2>/dev/null \
    || die "$PYTHON cannot import edge_runtime.exporters: activate the project's virtualenv (pip install -e .)"
mkdir -p "$CACHE"

# -- 2. cached arm64 root filesystem and aarch64 site-packages -------------------------------------
ROOTFS="$CACHE/rootfs-$SUITE-$(printf '%s' "$SUITE $ROOTFS_PACKAGES $MIRROR" | sha256sum | cut -c1-12)"
if [ ! -e "$ROOTFS/.complete" ]; then
    say "building the arm64 $SUITE root filesystem ($ROOTFS_PACKAGES) in $ROOTFS"
    rm -rf "$ROOTFS" "$ROOTFS.tmp"
    mmdebstrap --quiet --mode=auto --variant=extract --arch=arm64 --include="$ROOTFS_PACKAGES" \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "$SUITE" "$ROOTFS.tmp" "$MIRROR" </dev/null \
        >"$CACHE/mmdebstrap.log" 2>&1 || { tail -n 30 "$CACHE/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
    mv "$ROOTFS.tmp" "$ROOTFS"
    touch "$ROOTFS/.complete"
fi
# qemu-user reads ROOTFS/proc/cpuinfo under -L ROOTFS: a Pi 5's (4 x Cortex-A76, r4p1), so that ONNX
# Runtime's CPU-feature detection sees the Pi 5's features instead of the host's x86 text.
mkdir -p "$ROOTFS/proc"
for cpu in 0 1 2 3; do
    printf 'processor\t: %d\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x4\nCPU part\t: 0xd0b\nCPU revision\t: 1\n\n' "$cpu"
done >"$ROOTFS/proc/cpuinfo"
printf 'Revision\t: c04170\nSerial\t\t: 1a2b3c4d5e6f7a8b\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n' >>"$ROOTFS/proc/cpuinfo"
PY_ARM="$ROOTFS/usr/bin/python$PYVER"
[ -x "$PY_ARM" ] || die "$PY_ARM is missing: remove $ROOTFS and rerun"

REQS="$("$PYTHON" "$REPO/scripts/aarch64_host.py" requirements)"
SITE="$CACHE/site-py$PYVER-$(printf '%s\n%s\n' "${PLATFORMS[*]}" "$REQS" | sha256sum | cut -c1-12)"
if [ ! -e "$SITE/.complete" ]; then
    say "installing aarch64 wheels into $SITE: ${REQS//$'\n'/ }"
    rm -rf "$SITE" "$SITE.tmp"
    printf '%s\n' "$REQS" >"$CACHE/requirements.txt"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --target "$SITE.tmp" \
        "${PLATFORMS[@]/#/--platform=}" --python-version "$PYVER" --implementation cp --only-binary=:all: \
        -r "$CACHE/requirements.txt" >"$CACHE/pip.log" 2>&1 || { tail -n 30 "$CACHE/pip.log" >&2; die "pip failed"; }
    printf '%s\n' "$REQS" >"$SITE.tmp/requirements.txt"
    mv "$SITE.tmp" "$SITE"
    touch "$SITE/.complete"
fi

if [ "${1:-}" = --setup-only ]; then
    say "set-up ready: $ROOTFS, $SITE"
    exit 0
fi

# -- 3. this project's wheel and the host references (every run: they follow the working tree) -------
WORK="$CACHE/run"
rm -rf "$WORK"
mkdir -p "$WORK/src" "$WORK/wheel" "$WORK/project"
say "building the project wheel"
# A copy of the tree, so the in-tree setuptools build leaves no build/ or stale files in the repo.
tar -C "$REPO" --exclude=./.git --exclude=./.venv --exclude=./build --exclude='*.egg-info' \
    --exclude=__pycache__ --exclude=.pytest_cache --exclude=.ruff_cache --exclude=.hypothesis -cf - . \
    | tar -C "$WORK/src" -xf -
{ "$PYTHON" -m pip wheel --disable-pip-version-check --no-deps --wheel-dir "$WORK/wheel" "$WORK/src" &&
  "$PYTHON" -m pip install --disable-pip-version-check --no-deps --target "$WORK/project" "$WORK/wheel"/*.whl
} >"$WORK/wheel.log" 2>&1 || { tail -n 30 "$WORK/wheel.log" >&2; die "building the project wheel failed"; }
rm -rf "$WORK/src"
say "exporting the demo model and computing float64 references on the host ($(uname -m))"
"$PYTHON" "$REPO/scripts/aarch64_host.py" refs "$WORK/refs"

# -- 4. the checks, in the emulated aarch64 interpreter --------------------------------------------
say "running the checks under qemu-aarch64 (QEMU_CPU=$QEMU_CPU)"
cd "$REPO"
# -P: the repo root is not put on sys.path, so `edge_runtime` is the installed wheel, as on a Pi. `-o addopts`:
# one process (pyproject's `-n 2` needs pytest-xdist, which the emulated side does not install).
EDGE_RUNTIME_AARCH64_REFS="$WORK/refs" PYTHONPATH="$WORK/project:$SITE" \
    qemu-aarch64-static -L "$ROOTFS" "$PY_ARM" -P -m pytest -p no:cacheprovider --import-mode=importlib \
    -o "addopts=--strict-markers -m 'not slow'" \
    -v -rA tests/aarch64 tests/test_telemetry_rpi.py "$@"
say "done"
