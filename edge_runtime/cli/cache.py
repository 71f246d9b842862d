"""`edge-cache`: the bundles `edge-run` exported on first use (in cache_dir()/bundles, see bundle_cache.py).

edge-cache ls              # name, size, edge-runtime version and source checkpoint of each, and the total
edge-cache rm NAME         # one bundle (a unique prefix of its name will do)
edge-cache prune           # bundles of other edge-runtime versions, of checkpoints gone or changed, partials
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from .common import debug_option, friendly_errors

# `.NAME.partial-PID-RAND` / `.NAME.old-PID-RAND`: exporters/partials.py's scratch names beside a bundle
_LEFTOVER = re.compile(r"^\.(.+)\.(?:partial|old)-(?:\d+-)?[0-9a-f]{8}$")


@click.group()
def main() -> None:
    """The bundles edge-run exported on first use (for --model and the demo model)."""


@main.command("ls")
@debug_option
@friendly_errors
def ls() -> None:
    """List cached bundles: name, size, version, source checkpoint; '(stale)' where prune would remove one."""
    from edge_runtime import bundle_cache

    bundles = bundle_cache.list_bundles()
    root = bundle_cache.bundles_dir()
    if not bundles:
        click.echo(f"no cached bundles in {root}")
        return
    for b in bundles:
        stale = b.stale_reason()
        click.echo(
            f"{b.name}  {b.size_bytes / 1e6:.1f} MB  {b.source or '(source unknown)'}"
            + (f"  (stale: {stale})" if stale else "")
        )
    total = sum(b.size_bytes for b in bundles)
    click.echo(f"{len(bundles)} bundle(s), {total / 1e6:.1f} MB in {root}")


@main.command("rm")
@click.argument("name")
@debug_option
@friendly_errors
def rm(name: str) -> None:
    """Remove the cached bundle NAME (as `edge-cache ls` prints it; a unique prefix will do)."""
    from edge_runtime import bundle_cache

    b = bundle_cache.find(name)
    bundle_cache.remove(b)
    click.echo(f"removed {b.name} ({b.size_bytes / 1e6:.1f} MB)")


@main.command("prune")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@debug_option
@friendly_errors
def prune(dry_run: bool) -> None:
    """Remove bundles of other edge-runtime versions, of checkpoints that are gone or changed, and leftovers."""
    from edge_runtime import bundle_cache

    freed = 0
    for b in bundle_cache.list_bundles():
        reason = b.stale_reason()
        if reason is None:
            continue
        if not dry_run:
            bundle_cache.remove(b)
        freed += b.size_bytes
        click.echo(f"{'would remove' if dry_run else 'removed'} {b.name}: {reason}")
    if not dry_run:
        freed += _remove_dead_partials(bundle_cache.bundles_dir())
    click.echo(f"{'would free' if dry_run else 'freed'} {freed / 1e6:.1f} MB")


def _remove_dead_partials(root: Path) -> int:
    """Directories of first-use exports that were killed outright (live exporters' are kept); bytes freed."""
    from edge_runtime.bundle_cache import tree_bytes
    from edge_runtime.exporters.partials import remove_stale_partials

    if not root.is_dir():
        return 0
    leftovers = [p for p in root.iterdir() if _LEFTOVER.match(p.name)]
    outs = {m[1] for p in leftovers if (m := _LEFTOVER.match(p.name))}
    sizes = {p: tree_bytes(p) for p in leftovers}
    freed = 0
    for out in sorted(outs):
        for removed in remove_stale_partials(root / out):
            click.echo(f"removed {removed.name}: a killed export's partial directory")
            freed += sizes.get(removed, 0)
    return freed


if __name__ == "__main__":
    main()
