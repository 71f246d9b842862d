"""OS errors are one line and lose nothing: a full disk, a read-only file system,
an unwritable report path. Real faults on a tiny tmpfs where the tests run as root; one simulated
ENOSPC everywhere else."""

from __future__ import annotations

import errno
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_runtime.cli.bench import main as bench_cli
from edge_runtime.cli.export import main as export_cli
from edge_runtime.exporters import export as export_mod
from edge_runtime.exporters.export import ExportOptions, export

from .bad_inputs_util import one_line_error, remount_read_only, snapshot, tmpfs
from .tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ck")
    save_tiny_checkpoint("llama-tied", d)
    return d


@pytest.fixture(scope="module")
def bundle(ckpt, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("b") / "b"
    export(ExportOptions(checkpoint=ckpt, out=out, window=64))
    return out


def _export(*args: str):
    return CliRunner().invoke(export_cli, [*args, "--window", "64"])


def test_simulated_disk_full_is_one_line_and_keeps_the_old_bundle(ckpt, bundle, tmp_path, monkeypatch):
    out = shutil.copytree(bundle, tmp_path / "out")
    before = snapshot(tmp_path)

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "model.onnx.data"))

    monkeypatch.setattr(export_mod, "save_with_external_data", full)
    one_line_error(_export(str(ckpt), "-o", str(out), "--overwrite"), "No space left on device", "left intact")
    assert snapshot(tmp_path) == before


def test_real_disk_full_leaves_nothing(ckpt, tmp_path):
    with tmpfs(tmp_path / "mnt", "64k") as mnt:
        one_line_error(_export(str(ckpt), "-o", str(mnt / "out")), "No space left on device")
        assert list(mnt.iterdir()) == []


def test_real_disk_full_during_overwrite_keeps_the_old_bundle(ckpt, bundle, tmp_path):
    size = sum(p.stat().st_size for p in bundle.iterdir())
    with tmpfs(tmp_path / "mnt", f"{(size * 3 // 2) // 1024}k") as mnt:  # room for one bundle, not two
        out = shutil.copytree(bundle, mnt / "out")
        before = snapshot(mnt)
        one_line_error(_export(str(ckpt), "-o", str(out), "--overwrite"), "No space left on device")
        assert snapshot(mnt) == before


def test_read_only_file_system_is_one_line(ckpt, bundle, tmp_path):
    with tmpfs(tmp_path / "mnt", "4m") as mnt:
        out = shutil.copytree(bundle, mnt / "out")
        remount_read_only(mnt)
        before = snapshot(mnt)
        one_line_error(_export(str(ckpt), "-o", str(mnt / "new")), "Read-only file system")
        one_line_error(_export(str(ckpt), "-o", str(out), "--overwrite"), "Read-only file system")
        assert snapshot(mnt) == before


@pytest.mark.parametrize("flag", ["--json-out", "--plot", "--log"])
def test_bench_output_on_a_read_only_file_system_is_refused_before_the_run(bundle, tmp_path, flag):
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        remount_read_only(mnt)
        t0 = time.perf_counter()
        r = CliRunner().invoke(bench_cli, [str(bundle), "--target", "x86", "--trials", "1", flag, str(mnt / "r")])
        one_line_error(r, "Read-only file system", "nothing was run")
        assert time.perf_counter() - t0 < 5  # refused up front: no load, no trials
        assert list(mnt.iterdir()) == []


@pytest.mark.parametrize(
    "where,needle",
    [(lambda t: t / "missing" / "r.json", "does not exist"), (lambda t: t, "is a directory")],
)
def test_bench_json_out_that_cannot_be_a_file_is_refused_before_the_run(bundle, tmp_path, where, needle):
    r = CliRunner().invoke(bench_cli, [str(bundle), "--target", "x86", "--json-out", str(where(tmp_path))])
    one_line_error(r, needle)
