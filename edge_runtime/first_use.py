"""The bundle for a model the user names: exported on first use into the cache, found there afterwards.

`edge-run --model`, `edge-serve --model` and `edge-bench --model` take what the user has (a Hugging Face
checkpoint directory, a .gguf file, or a bundled model's name) and run the bundle this machine's target
profile asks for (targets/export_settings.py), so a bundle a device builds for itself equals the one
`edge-export --target` builds on a host. Two processes asking for the same bundle at once export it once: the
second waits on a lock beside the bundle and then uses what the first published.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import bundle_cache
from .errors import BundleError, CheckpointError, CorruptCheckpointError, EdgeRuntimeError

if TYPE_CHECKING:
    from .targets import TargetProfile

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RunTarget:
    """What a command runs: the bundle, the profile it runs under and why."""

    bundle: Path
    profile: TargetProfile
    reason: str  # how the profile was chosen: the detection paragraph, for --verbose
    warning: str | None  # one line the user always sees (the bundle's own target not used), or None


def resolve_run(bundle: Path | None, model: str | None, target: str, progress: Progress = lambda _m: None) -> RunTarget:
    """`--bundle B` or `--model M` (a checkpoint directory, a .gguf file or a bundled model's name) with
    `--target T`: the bundle to load and its profile. A bundle runs under the target it was exported for
    unless `--target` says otherwise (targets/choose.py); a model is exported on first use for this machine's."""
    from .backends.tensorrt import runtime_profile
    from .models import resolve_checkpoint
    from .targets.choose import choose_target

    if bundle is not None and model is not None:
        raise EdgeRuntimeError("give --bundle or --model, not both")
    if bundle is not None:
        check_bundle_path(bundle)
        choice = choose_target(target, _bundle_target(bundle))
        profile = runtime_profile(choice.profile, auto_detected=choice.auto)
        return RunTarget(bundle, profile, choice.detection.reason, choice.warning)
    if model is None:
        raise EdgeRuntimeError("give --bundle DIR (from edge-export) or --model (a checkpoint, a .gguf, or demo)")
    source = resolve_checkpoint(model)
    check_source(source)  # before detection and before any export: one line
    choice = choose_target(target, None)
    profile = runtime_profile(choice.profile, auto_detected=choice.auto)
    return RunTarget(ensure_bundle(source, profile, progress), profile, choice.detection.reason, None)


def check_bundle_path(path: Path) -> None:
    """One line for a --bundle that is not a bundle directory but something else the user has."""
    if not path.exists():
        raise BundleError(f"bundle directory '{path}' does not exist")
    if path.is_file():
        if path.suffix.lower() == ".gguf" or _starts_with(path, b"GGUF"):
            raise BundleError(
                f"'{path}' is a GGUF model file, not a bundle: run it with --model {path} (exported into the "
                "cache on first use) or export it with edge-export"
            )
        raise BundleError(f"'{path}' is a file; --bundle takes a bundle directory (from edge-export)")
    if path.is_dir() and (path / "config.json").is_file() and not (path / "manifest.json").exists():
        raise BundleError(f"'{path}' is a Hugging Face checkpoint, not a bundle: run it with --model {path}")


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


def _bundle_target(bundle: Path) -> str | None:
    """The target the bundle was exported for, from its manifest; None where it names none or cannot be read
    (loading the bundle then says what is wrong with it)."""
    from .manifest import MANIFEST_FILE, Manifest

    try:
        target = Manifest.read(bundle / MANIFEST_FILE).provenance.get("target")
    except (EdgeRuntimeError, AttributeError):
        return None
    return target if isinstance(target, str) else None


def check_source(path: Path) -> None:
    """One line saying why `path` is not something a first-use export reads, before any work (a .gguf without
    the format's magic is refused here, before the export is announced, with the words its reader uses)."""
    if bundle_cache.is_source(path):
        if path.is_file() and not _starts_with(path, b"GGUF"):
            size = path.stat().st_size
            raise CorruptCheckpointError(f"'{path}' is not a valid GGUF file (truncated or corrupt?): {size} bytes")
        return
    if not path.exists():
        raise CheckpointError(f"'{path}' does not exist")
    if path.is_dir():
        if (path / "manifest.json").is_file():
            raise CheckpointError(f"'{path}' is a bundle, not a checkpoint: give it as --bundle {path}")
        raise CheckpointError(f"'{path}' is not a Hugging Face checkpoint directory (no config.json)")
    raise CheckpointError(f"'{path}' is neither a Hugging Face checkpoint directory nor a .gguf file")


def ensure_bundle(source: Path, profile: TargetProfile, progress: Progress = lambda _m: None) -> Path:
    """The bundle for `source` in `profile`'s export settings, from the cache; exported (and validated) on
    first use, with the export's progress lines passed to `progress`."""
    from . import kernels
    from .targets.export_settings import settings_for

    check_source(source)
    # The device exports its own bundle, so the edge kernels are used exactly where they run here. The bundle is
    # named by what its plan is made of, the profile's settings (there are no flags), so a cached one is found
    # without importing the exporters; a profile always names its block (targets/schema.py).
    s = settings_for(profile, edge_kernels_here=kernels.available())
    root = bundle_cache.bundles_dir()
    out = root / bundle_cache.first_use_name(source, s.flavor, s.quant, s.block, s.kernel, s.table_bits, s.mixed)
    if (out / "manifest.json").is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with _export_lock(lock_path(out.name), progress):
        if (out / "manifest.json").is_file():  # another process exported it while this one waited
            progress(f"using {out}, exported meanwhile by another process")
            return out
        from .exporters.from_source import export_source, summary_line
        from .exporters.plan import ExportFlags, plan_export

        progress(f"exporting {source.name} for target {profile.name} on first use into {out}")
        # A half-written directory of a killed export (no manifest) is replaced, not refused: nobody else
        # writes here while the lock is held.
        plan = plan_export(source, out, ExportFlags(overwrite=out.exists()), profile)
        t0 = time.perf_counter()
        manifest = export_source(plan, progress=lambda m: progress(f"[{time.perf_counter() - t0:6.1f}s] {m}"))
        progress(summary_line(out, manifest))
    return out


def lock_path(bundle_name: str) -> Path:
    """The lock a first-use export of `bundle_name` holds: beside the bundles, not among them (edge-cache
    lists and removes bundles)."""
    locks = bundle_cache.bundles_dir().parent / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    return locks / f"{bundle_name}.lock"


class _export_lock:
    """An exclusive flock on `path` for the export; a second process says once that it waits, then blocks.
    The kernel drops the lock when its holder dies, so a killed export never wedges the next one."""

    def __init__(self, path: Path, progress: Progress) -> None:
        self.path, self.progress, self.fd = path, progress, -1

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.progress("another process is exporting this bundle; waiting for it to finish")
            fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # releases the lock; the file stays (removing it would race a waiter's open)
