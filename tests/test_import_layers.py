"""The import layers hold over the whole namespace: no circle, no upward import, front ends through
stream_generate (scripts/import_scan.py; `lint-imports` checks the same contracts over the `edge_runtime`
folder, but cannot see the folders mapped into the namespace: exporters/, models/, targets/)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCAN = ROOT / "scripts" / "import_scan.py"

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="the scan reads pyproject.toml with tomllib")


def scan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCAN), *args], capture_output=True, text=True, timeout=120)


def test_this_tree_keeps_its_layers():
    r = scan()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "import circles (strongly connected groups of modules): 0" in r.stdout
    assert "upward imports (1 layers contract(s) in pyproject.toml): 0" in r.stdout
    assert "0 around it" in r.stdout


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_a_circle_through_a_function_an_upward_import_and_a_front_end_loop_are_found(tmp_path):
    _tree(
        tmp_path,
        {
            "pyproject.toml": """
                [tool.setuptools.package-dir]
                "edge_runtime" = "edge_runtime"
                "edge_runtime.models" = "models"

                [[tool.importlinter.contracts]]
                name = "layers"
                type = "layers"
                containers = ["edge_runtime"]
                layers = ["cli", "generate", "(models)", "errors"]
            """,
            "edge_runtime/__init__.py": "",
            "edge_runtime/errors.py": "from edge_runtime.models import arch\n",  # upward, across the mapping
            "edge_runtime/generate.py": "def generate_step():\n    from . import sampling\n",
            "edge_runtime/sampling.py": "from .generate import generate_step\n",  # a circle, one side lazy
            "edge_runtime/cli/__init__.py": "",
            "edge_runtime/cli/run.py": "from edge_runtime.generate import generate_step\n",
            "edge_runtime/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import cli\n",
            "models/__init__.py": "",
            "models/arch.py": "",
        },
    )
    r = scan("--root", str(tmp_path))
    assert r.returncode == 1
    assert "import circles (strongly connected groups of modules): 1" in r.stdout
    assert "edge_runtime.generate, edge_runtime.sampling" in r.stdout
    assert "edge_runtime.errors -> edge_runtime.models.arch (line 1, at module level)" in r.stdout
    assert "upward imports (1 layers contract(s) in pyproject.toml): 1" in r.stdout
    assert "edge_runtime.cli.run:1 generate_step" in r.stdout
    assert "1 under TYPE_CHECKING" in r.stdout  # listed, not counted: it never runs
