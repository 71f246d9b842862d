"""Models by name and the first-use cache: `edge-export demo`, `edge-run --model demo`, a content key that
survives reinstalls, and `edge-cache ls | rm | prune`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_runtime import __version__, bundle_cache, first_use
from edge_runtime.cli import run as run_mod
from edge_runtime.cli.cache import main as cache_cli
from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.models import DEMO_CHECKPOINT, resolve_checkpoint

from .tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt") / "tiny-llama"
    save_tiny_checkpoint("llama-tied", d)
    return d


def test_the_demo_model_has_a_name_wherever_the_package_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()  # a folder called demo (say, a bundle exported with -o demo) does not shadow it
    assert resolve_checkpoint("demo") == DEMO_CHECKPOINT
    assert resolve_checkpoint("shakespeare-llama-5m") == DEMO_CHECKPOINT
    assert resolve_checkpoint("./demo") == Path("./demo")
    assert (DEMO_CHECKPOINT / "config.json").is_file()


def test_edge_run_model_demo_exports_the_bundled_checkpoint(monkeypatch):
    seen = []

    def fake_ensure(checkpoint, profile, progress):
        seen.append(checkpoint)
        raise EdgeRuntimeError("stop here")

    monkeypatch.setattr(first_use, "ensure_bundle", fake_ensure)
    r = CliRunner().invoke(run_mod.main, ["--model", "demo", "--target", "x86", "--max-tokens", "1"])
    assert r.exit_code == 1 and "stop here" in r.output
    assert seen == [DEMO_CHECKPOINT]


def test_edge_export_demo_by_name(monkeypatch, tmp_path):
    from edge_runtime.exporters import from_source

    seen = []

    def fake_export(opts, progress):
        seen.append(opts)
        raise EdgeRuntimeError("stop here")

    monkeypatch.setattr(from_source, "export", fake_export)
    r = CliRunner().invoke(export_cli, ["demo", "-o", str(tmp_path / "out")])
    assert r.exit_code == 1 and "stop here" in r.output
    assert seen[0].checkpoint == DEMO_CHECKPOINT


def _copy_with_new_mtimes(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, copy_function=shutil.copyfile)  # what a reinstall does: same bytes, new times
    for f in dst.iterdir():
        os.utime(f, (1_000_000_000, 1_000_000_000))
    return dst


def test_the_cache_key_follows_content_not_place_or_time(tiny, tmp_path):
    key = bundle_cache.checkpoint_key(tiny)
    copy = _copy_with_new_mtimes(tiny, tmp_path / "elsewhere" / tiny.name)
    assert bundle_cache.checkpoint_key(copy) == key
    # a byte of the safetensors header (first MiB), then of the config: another key each time
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[20] ^= 1
    weights.write_bytes(bytes(data))
    changed = bundle_cache.checkpoint_key(copy)
    assert changed != key
    config = json.loads((copy / "config.json").read_text())
    config["rms_norm_eps"] = 1e-3
    (copy / "config.json").write_text(json.dumps(config))
    assert bundle_cache.checkpoint_key(copy) not in (key, changed)


def test_the_demo_key_is_the_same_from_a_reinstalled_copy(tmp_path):
    copy = _copy_with_new_mtimes(DEMO_CHECKPOINT, tmp_path / DEMO_CHECKPOINT.name)
    assert bundle_cache.checkpoint_key(copy) == bundle_cache.checkpoint_key(DEMO_CHECKPOINT)


def _fake_bundle(root: Path, name: str, source: Path | str, *, manifest: bool = True) -> Path:
    d = root / "bundles" / name
    d.mkdir(parents=True)
    (d / "model.onnx.data").write_bytes(b"\0" * 10_000)
    if manifest:
        (d / "manifest.json").write_text(json.dumps({"provenance": {"source": str(source)}}))
    return d


def test_edge_cache_ls_rm_prune(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(tmp_path))
    runner = CliRunner()
    assert "no cached bundles" in runner.invoke(cache_cli, ["ls"]).output
    key = bundle_cache.checkpoint_key(tiny)
    current = _fake_bundle(tmp_path, bundle_cache.first_use_name(tiny, "ort", "int8", 32, "edge", 8), tiny)
    assert current.name == f"tiny-llama-ort-int8-edge-{key}-v{__version__}"
    mixed = bundle_cache.first_use_name(tiny, "ort", "int4-gptq", 32, "edge", 8, "sensitivity")
    assert mixed == f"tiny-llama-ort-int4-gptq-b32-mixed-sensitivity-edge-{key}-v{__version__}"  # its own bundle
    old = _fake_bundle(tmp_path, f"tiny-llama-ort-int8-{key}-v0.0.1", tiny)
    gone = _fake_bundle(tmp_path, f"gone-ort-int4-b32-{key}-v{__version__}", tmp_path / "nowhere")
    other = _fake_bundle(tmp_path, f"tiny-llama-ort-int4-b32-{key}-v{__version__}", tiny)

    ls = runner.invoke(cache_cli, ["ls"])
    assert ls.exit_code == 0, ls.output
    lines = ls.output.splitlines()
    assert any(line.startswith(current.name) and str(tiny) in line and "stale" not in line for line in lines)
    assert any(line.startswith(old.name) and "stale: written by edge-runtime 0.0.1" in line for line in lines)
    assert any(line.startswith(gone.name) and "is gone" in line for line in lines)
    assert lines[-1].startswith("4 bundle(s)") and "MB" in lines[-1]

    assert runner.invoke(cache_cli, ["prune", "--dry-run"]).exit_code == 0 and old.exists()
    pruned = runner.invoke(cache_cli, ["prune"])
    assert pruned.exit_code == 0, pruned.output
    assert not old.exists() and not gone.exists() and current.exists() and other.exists()

    ambiguous = runner.invoke(cache_cli, ["rm", "tiny-llama-ort-int"])
    assert ambiguous.exit_code == 1 and "give the full name" in ambiguous.output
    assert runner.invoke(cache_cli, ["rm", "tiny-llama-ort-int4"]).exit_code == 0 and not other.exists()
    missing = runner.invoke(cache_cli, ["rm", "nothing"])
    assert missing.exit_code == 1 and "no cached bundle named 'nothing'" in missing.output
    assert "Traceback" not in missing.output


def test_prune_removes_a_changed_checkpoints_bundle_and_dead_partials(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(tmp_path))
    ckpt = _copy_with_new_mtimes(tiny, tmp_path / "ck" / "tiny-llama")
    b = _fake_bundle(tmp_path, bundle_cache.first_use_name(ckpt, "ort", "int8", 32, "mlas", 8), ckpt)
    dead = tmp_path / "bundles" / f".{b.name}.partial-999999999-0123abcd"
    dead.mkdir()
    assert bundle_cache.list_bundles()[0].stale_reason() is None  # hidden partials are not bundles
    config = json.loads((ckpt / "config.json").read_text())
    config["rms_norm_eps"] = 1e-3
    (ckpt / "config.json").write_text(json.dumps(config))
    r = CliRunner().invoke(cache_cli, ["prune"])
    assert r.exit_code == 0, r.output
    assert "has changed since" in r.output and not b.exists() and not dead.exists()
