"""Every path the repository's files cite lies inside the repository: a clone must hold what its code and
docs point at (the design notes and research facts live in docs/, not in a shared folder beside it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A parent-relative path into a folder beside the clone, or the pre-repository design notes by name.
OUTSIDE = re.compile(r"\.\./shared\b|(?<![\w/])shared/research\b|DESIGN\.md")


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an installed copy): nothing to scan")
    files = [ROOT / name for name in out.split("\0") if name]
    return [f for f in files if f.is_file() and f.stat().st_size < 2 << 20]


def test_no_tracked_file_references_a_path_outside_the_repo() -> None:
    hits = []
    for path in _tracked_text_files():
        if path == Path(__file__).resolve():
            continue  # this file names the patterns it looks for
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # weights, binary fixtures
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not hits, "references outside the repository (point them at docs/):\n" + "\n".join(hits)


def test_docs_links_resolve() -> None:
    """Relative links in docs/ name files that exist (the design doc is read by following them)."""
    broken = []
    for doc in sorted((ROOT / "docs").rglob("*.md")):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)
