"""Directory renames that cannot lose or clobber a bundle: `renameat2` on Linux, plain renames elsewhere.

- `rename_noreplace(src, dst)`: make `src` appear as `dst` only if nothing is there. POSIX `rename`
  silently replaces an empty directory and gives no way to refuse an existing one, so two exports
  to one `-o` could both "succeed"; RENAME_NOREPLACE makes the second fail with EEXIST.
- `rename_exchange(a, b)`: swap two paths in one step, so a reader of `b` sees the old bundle or the
  new one, never neither (the two-rename fallback has a moment with no `b`).

Where `renameat2` is missing (other systems, old libc/kernel) or the file system refuses the flag
(EINVAL: some FUSE/network file systems), the fallbacks keep the semantics but not the atomicity.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
import uuid
from functools import cache
from pathlib import Path
from typing import Any

_AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
# Raw syscall numbers, for a libc that predates its renameat2 wrapper (glibc < 2.28, older musl).
_SYSCALL = {"x86_64": 316, "aarch64": 276, "riscv64": 276, "armv7l": 382, "armv6l": 382}
# Errors that mean "this kernel / file system does not do that flag", not "the rename failed".
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


@cache
def _renameat2() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
        return fn
    number = _SYSCALL.get(platform.machine())
    if number is None:
        return None
    syscall = libc.syscall
    syscall.restype = ctypes.c_long

    def via_syscall(olddfd: int, old: bytes, newdfd: int, new: bytes, flags: int) -> int:
        return int(syscall(ctypes.c_long(number), olddfd, old, newdfd, new, ctypes.c_uint(flags)))

    return via_syscall


def _try_renameat2(src: Path, dst: Path, flags: int) -> bool:
    """True if done; False if renameat2 (or this flag on this file system) is unavailable."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`; FileExistsError if `dst` exists (atomically so on Linux)."""
    if _try_renameat2(src, dst, RENAME_NOREPLACE):
        return
    if os.path.lexists(dst):  # fallback: a check, then the rename (a racing writer can slip in between)
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


def rename_exchange(a: Path, b: Path) -> None:
    """Swap `a` and `b` (both must exist): afterwards `b` holds what `a` held and `a` what `b` held."""
    if _try_renameat2(a, b, RENAME_EXCHANGE):
        return
    parked = b.parent / f".{b.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.rename(b, parked)
    try:
        os.rename(a, b)
    except BaseException:
        os.rename(parked, b)  # put the old one back: never leave `b` missing on failure
        raise
    os.rename(parked, a)
