"""Write a bundle atomically: everything goes into a temporary sibling directory, which is renamed
into place only once complete. A failure at any point leaves no bundle (and any old one intact).

What `--overwrite` may replace is deliberately narrow: a directory that is recognisably a bundle (a
manifest.json of ours, and nothing in the directory that its `files` do not list) or an empty one.
Never anything else: not the source checkpoint, not the current directory or one holding it, not a
folder where a user keeps other files. The publish step itself is one rename that cannot clobber
(RENAME_NOREPLACE) or leave a moment without a bundle (RENAME_EXCHANGE): fs_atomic.py.

SIGTERM and SIGHUP (systemd stopping a unit, a closed terminal) would kill the exporter before it
could remove its partial directory; while one exists, those signals (where they still have their
default, fatal action) raise SystemExit(128 + signal) instead, so the cleanup below runs and the
process still ends with the conventional status. Partials of exporters that died anyway (SIGKILL,
power loss) are removed by the next export to the same output (partials.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from edge_runtime.errors import ExportError
from edge_runtime.manifest import MANIFEST_FILE

from .fs_atomic import rename_exchange, rename_noreplace
from .partials import lock_directory, partial_name, remove_stale_partials

_MANIFEST_CAP = 16 << 20  # a real manifest is tens of KB; anything this big is not one of ours
_TERMINATING = (signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))


class BundleWriteError(ExportError, OSError):
    """The file system refused the bundle (disk full, read-only, I/O error). An OSError too, so callers that
    handle OS errors keep working; the CLI prints it as one line like any ExportError."""

    def __init__(self, message: str, errno: int | None = None):
        ExportError.__init__(self, message)
        self.errno = errno

    def __str__(self) -> str:
        return str(self.args[0])


class ExportTerminated(SystemExit):
    """SIGTERM/SIGHUP arrived while a partial bundle existed; it has been removed."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


@contextlib.contextmanager
def atomic_directory(out: Path, *, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary directory; on success it becomes `out`, on any exception it is removed."""
    out = Path(os.path.abspath(out))  # `-o .` has no name to build a sibling from; symlinks are kept as given
    check_target(out, overwrite=overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"cannot create '{out.parent}': {e.strerror or e}") from e
    remove_stale_partials(out)
    tmp = partial_name(out)
    try:
        tmp.mkdir()
    except OSError as e:
        raise ExportError(f"cannot write into '{out.parent}': {e.strerror or e}") from e
    lock = lock_directory(tmp)  # tells the next export that this partial is alive
    try:
        with cleanup_on_termination():
            try:
                yield tmp
                for f in tmp.iterdir():  # data on disk before the rename makes it visible
                    f.chmod(0o644)  # some writers create 0600 files; bundles are copied to devices and shared
                    with f.open("rb") as fh:
                        os.fsync(fh.fileno())
                _publish(tmp, out, overwrite=overwrite)
            except BaseException as e:
                shutil.rmtree(tmp, ignore_errors=True)
                if isinstance(e, OSError):  # disk full, read-only, I/O error: one line, nothing left behind
                    raise BundleWriteError(_os_message(e, out), e.errno) from e
                raise
    finally:
        if lock is not None:
            os.close(lock)


def _publish(tmp: Path, out: Path, *, overwrite: bool) -> None:
    try:
        rename_noreplace(tmp, out)
    except FileExistsError:
        if not overwrite:
            raise ExportError(
                f"output '{out}' appeared while exporting (another export to the same -o?); it was left as it is "
                "and this export discarded; pass --overwrite to replace it"
            ) from None
        check_target(out, overwrite=True)  # again: it may have changed since the export began
        rename_exchange(tmp, out)  # `tmp` now holds the old bundle
        shutil.rmtree(tmp, ignore_errors=True)
    _fsync_dir(out.parent)


def _fsync_dir(path: Path) -> None:
    """Make the rename itself durable (a power cut right after could otherwise undo it). Best effort."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_target(out: Path, *, overwrite: bool) -> None:
    """Refuse an `out` that exists unless --overwrite was given and it is safe to replace."""
    if not os.path.lexists(out):
        return
    if not overwrite:
        raise ExportError(f"output '{out}' already exists; pass --overwrite to replace it or choose another -o")
    if out.is_symlink():
        raise ExportError(f"output '{out}' is a symbolic link; give the directory it points to, or another -o")
    if not out.is_dir():
        raise ExportError(f"output '{out}' exists and is not a directory")
    real, cwd = out.resolve(), Path.cwd().resolve()
    if cwd == real or cwd.is_relative_to(real):
        raise ExportError(
            f"refusing to replace '{out}': it is the current directory or holds it; run from elsewhere or choose "
            "another -o"
        )
    problem = not_replaceable(out)
    if problem:
        raise ExportError(
            f"refusing to replace '{out}': {problem}; --overwrite only replaces an edge-runtime bundle (or an empty "
            "directory). Move it away or choose another -o"
        )


def not_replaceable(path: Path) -> str | None:
    """Why `path` (an existing directory) is not a bundle --overwrite may delete; None if it may."""
    try:
        entries = sorted(os.listdir(path))
    except OSError as e:
        return f"it cannot be listed ({e.strerror or e})"
    if not entries:
        return None
    if MANIFEST_FILE not in entries:
        return f"it has no {MANIFEST_FILE}, so it is not a bundle"
    files = _bundle_files(path / MANIFEST_FILE)
    if files is None:
        return f"its {MANIFEST_FILE} is not an edge-runtime manifest"
    for name in entries:
        if name != MANIFEST_FILE and name not in files:
            return f"it holds '{name}', which its manifest does not list"
        if not stat.S_ISREG((path / name).lstat().st_mode):
            return f"'{name}' in it is not a plain file"
    return None


def _bundle_files(manifest: Path) -> set[str] | None:
    """The `files` a manifest.json of ours lists; None if the file is not one (any format version)."""
    try:
        st = manifest.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MANIFEST_CAP:
            return None
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("format_version"), int):
        return None
    files = data.get("files")
    if not isinstance(files, dict) or not all(isinstance(k, str) for k in files):
        return None
    if not all(isinstance(data.get(k), dict) for k in ("model", "graph", "tokenizer")):
        return None
    return set(files)


def _os_message(e: OSError, out: Path) -> str:
    where = f" ({e.filename})" if e.filename else ""
    return f"cannot write bundle '{out}': {e.strerror or e}{where}; no bundle written, any existing one left intact"


@contextlib.contextmanager
def cleanup_on_termination() -> Iterator[None]:
    """While the body runs, SIGTERM/SIGHUP with their default (fatal) action raise ExportTerminated, so the
    body's own cleanup (a `finally` that removes its temporary directory) runs. Nested uses keep the outer one's
    handler (it is no longer the default), which raises the same."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise ExportTerminated(signum)

    saved = {}
    for sig in _TERMINATING:
        if signal.getsignal(sig) is signal.SIG_DFL:  # a caller's own handler (or SIG_IGN) stays in charge
            saved[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)
