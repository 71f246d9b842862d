"""Bad inputs and faults at export (issue 22): each is refused with one line, nothing is lost or left half-written.

--overwrite replaces only a bundle; exports publish with one rename that cannot clobber; signals and
dead exporters leave no partial directories; OS errors are one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import ExportError
from edge_runtime.exporters.export import ExportOptions, export

from .bad_inputs_util import copy_bundle, one_line_error, snapshot
from .tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("src") / "ck"
    d.mkdir()
    save_tiny_checkpoint("llama-tied", d)
    return d


@pytest.fixture(scope="module")
def bundle(ckpt, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("b") / "b"
    export(ExportOptions(checkpoint=ckpt, out=out, window=64))
    return out


def _export(*args: str) -> object:
    return CliRunner().invoke(export_cli, [*args, "--window", "64"])


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


# -- item 1: --overwrite replaces only what is recognisably a bundle ----------------------------------


def test_overwrite_onto_the_checkpoint_itself_is_refused(ckpt):
    before = snapshot(ckpt)
    one_line_error(_export(str(ckpt), "-o", str(ckpt), "--overwrite"), "is the checkpoint")
    assert snapshot(ckpt) == before


def test_overwrite_onto_a_parent_of_the_checkpoint_is_refused(ckpt):
    before = snapshot(ckpt.parent)
    one_line_error(_export(str(ckpt), "-o", str(ckpt.parent), "--overwrite"), "holds the checkpoint")
    assert snapshot(ckpt.parent) == before


def test_api_overwrite_onto_the_checkpoint_is_refused(ckpt):
    """The Python API has no CLI pre-check: the writer's own rule (only a bundle) refuses it."""
    before = snapshot(ckpt)
    with pytest.raises(ExportError, match="not a bundle"):
        export(ExportOptions(checkpoint=ckpt, out=ckpt, window=64, overwrite=True))
    assert snapshot(ckpt) == before and _leftovers(ckpt.parent) == []


def test_overwrite_of_the_current_directory_is_refused(ckpt, bundle, tmp_path, monkeypatch):
    """`-o . --overwrite` from inside a bundle: replacing the cwd would pull it from under the shell (EBUSY)."""
    here = copy_bundle(bundle, tmp_path / "here")
    before = snapshot(tmp_path)
    monkeypatch.chdir(here)
    one_line_error(_export(str(ckpt), "-o", ".", "--overwrite"), "current directory")
    one_line_error(_export(str(ckpt), "-o", "..", "--overwrite"), "current directory")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "setup,needle",
    [
        ({"notes.txt": "mine"}, "no manifest.json"),
        ({"manifest.json": '{"name": "someone else\'s"}'}, "not an edge-runtime manifest"),
        ({"manifest.json": "not json"}, "not an edge-runtime manifest"),
    ],
)
def test_overwrite_of_a_folder_that_is_not_a_bundle_is_refused(ckpt, tmp_path, setup, needle):
    out = tmp_path / "out"
    out.mkdir()
    for name, text in setup.items():
        (out / name).write_text(text)
    before = snapshot(tmp_path)
    one_line_error(_export(str(ckpt), "-o", str(out), "--overwrite"), needle)
    assert snapshot(tmp_path) == before


def test_overwrite_of_a_bundle_holding_a_users_file_is_refused(ckpt, bundle, tmp_path):
    out = copy_bundle(bundle, tmp_path / "out")
    (out / "my-notes.txt").write_text("do not lose me")
    (out / "sub").mkdir()
    before = snapshot(tmp_path)
    one_line_error(_export(str(ckpt), "-o", str(out), "--overwrite"), "which its manifest does not list")
    assert snapshot(tmp_path) == before


def test_overwrite_of_a_symlink_is_refused(ckpt, bundle, tmp_path):
    out = copy_bundle(bundle, tmp_path / "real")
    (tmp_path / "link").symlink_to(out)
    before = snapshot(tmp_path)
    one_line_error(_export(str(ckpt), "-o", str(tmp_path / "link"), "--overwrite"), "symbolic link")
    assert snapshot(tmp_path) == before


def test_overwrite_replaces_a_bundle_and_an_empty_folder(ckpt, bundle, tmp_path):
    out = copy_bundle(bundle, tmp_path / "out")
    data = json.loads((out / "manifest.json").read_text())
    stamp = data["provenance"]["exported_at"]
    r = _export(str(ckpt), "-o", str(out), "--overwrite", "--flavor", "trt")
    assert r.exit_code == 0, r.output
    assert json.loads((out / "manifest.json").read_text())["graph"]["flavor"] == "trt" != data["graph"]["flavor"]
    assert stamp  # the old one was a real bundle
    (tmp_path / "empty").mkdir()
    assert _export(str(ckpt), "-o", str(tmp_path / "empty"), "--overwrite").exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "out"]


def test_existing_output_without_overwrite_is_one_line(ckpt, bundle, tmp_path):
    out = copy_bundle(bundle, tmp_path / "out")
    before = snapshot(tmp_path)
    one_line_error(_export(str(ckpt), "-o", str(out)), "--overwrite")
    assert snapshot(tmp_path) == before
