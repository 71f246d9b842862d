"""A bundle's manifest is checked and confined: a flipped bit in it is caught, it
must list checksums, and nothing it names may lie outside the bundle directory or be unbounded."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_runtime import bundle as bundle_mod
from edge_runtime import manifest as manifest_mod
from edge_runtime.bundle import open_bundle
from edge_runtime.cli.export import main as export_cli
from edge_runtime.cli.run import main as run_cli
from edge_runtime.errors import BundleError
from edge_runtime.manifest import DIGEST_KEY, MANIFEST_FILE, with_digest

from .bad_inputs_util import copy_bundle, one_line_error


@pytest.fixture
def b(tied_bundle, tmp_path) -> Path:
    return copy_bundle(tied_bundle, tmp_path / "b")


def _rewrite(bundle: Path, edit: Callable[[dict], object], *, digest: bool = True) -> None:
    """Edit the manifest as an attacker or a careless hand would: the digest recomputed (or not)."""
    data = json.loads((bundle / MANIFEST_FILE).read_text())
    edit(data)
    (bundle / MANIFEST_FILE).write_text(json.dumps(with_digest(data) if digest else data))


def test_a_flipped_bit_in_rope_inv_freq_is_caught(b):
    raw = bytearray((b / MANIFEST_FILE).read_bytes())
    at = raw.index(b'"rope_inv_freq"')
    digit = at + next(i for i, c in enumerate(raw[at:]) if chr(c) in "123456789")
    raw[digit] ^= 0x01  # '3' -> '2': still valid JSON, a different frequency
    (b / MANIFEST_FILE).write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="does not match its own"):
        open_bundle(b, verify=False)  # even unverified: the manifest check is cheap
    one_line_error(CliRunner().invoke(export_cli, ["inspect", str(b)]), "corrupted or edited")
    one_line_error(CliRunner().invoke(run_cli, ["--bundle", str(b), "--target", "x86", "--json"]), "does not match")


def test_a_version_2_manifest_without_its_digest_is_refused(b):
    _rewrite(b, lambda d: d.pop(DIGEST_KEY, None), digest=False)
    with pytest.raises(BundleError, match=f"'{DIGEST_KEY}' is missing"):
        open_bundle(b)


def test_a_version_1_bundle_without_a_digest_still_loads(b):
    def as_v1(d: dict) -> None:
        d["format_version"] = 1
        d.pop(DIGEST_KEY)

    _rewrite(b, as_v1, digest=False)
    assert open_bundle(b).manifest.format_version == 1


@pytest.mark.parametrize("files", [{}, None])
def test_a_manifest_without_files_is_refused(b, files):
    _rewrite(b, lambda d: d.pop("files") if files is None else d.update(files=files))
    with pytest.raises(BundleError, match="lists no checksums"):
        open_bundle(b)


def test_a_file_the_runtime_reads_must_have_a_checksum(b):
    _rewrite(b, lambda d: d["files"].pop("tokenizer.json"))
    with pytest.raises(BundleError, match=r"'tokenizer\.json' has no checksum"):
        open_bundle(b)


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["graph"].update(file="../elsewhere/model.onnx"),
        lambda d: d["graph"].update(data_file="/etc/passwd"),
        lambda d: d["tokenizer"].update(file="/dev/zero"),
        lambda d: d["files"].update({"../../secret.txt": "0" * 64}),
        lambda d: d["files"].update({"sub/dir.bin": "0" * 64}),
        lambda d: d["files"].update({"": "0" * 64}),
    ],
    ids=["graph-parent", "data-absolute", "tokenizer-dev-zero", "files-dotdot", "files-subdir", "files-empty"],
)
def test_paths_outside_the_bundle_are_refused_unverified_too(b, edit):
    _rewrite(b, edit)
    for verify in (True, False):
        with pytest.raises(BundleError, match="not a plain name inside the bundle"):
            open_bundle(b, verify=verify)


def test_no_oracle_a_secret_that_exists_and_one_that_does_not_get_the_same_answer(b, tmp_path):
    (tmp_path / "secret.txt").write_text("hunter2")
    messages = []
    for name in ("../secret.txt", "../no-such-file.txt"):
        _rewrite(b, lambda d, n=name: d["files"].update({n: "0" * 64}))
        with pytest.raises(BundleError) as info:
            open_bundle(b)
        messages.append(str(info.value).replace(name, "NAME"))
        _rewrite(b, lambda d, n=name: d["files"].pop(n))
    assert messages[0] == messages[1]


def test_a_symlink_out_of_the_bundle_is_refused_one_inside_is_fine(b, tmp_path):
    tok = b / "tokenizer.json"
    real = b / "tokenizer.real.json"
    tok.rename(real)
    tok.symlink_to(real.name)  # inside: fine (the checksum covers what it points to)
    assert open_bundle(b)
    tok.unlink()
    tok.symlink_to("/dev/zero")
    t0 = time.perf_counter()
    with pytest.raises(BundleError, match="symbolic link out of the bundle"):
        open_bundle(b, verify=False)
    assert time.perf_counter() - t0 < 1  # refused, not read until out of memory
    one_line_error(CliRunner().invoke(export_cli, ["inspect", str(b), "--no-verify"]), "symbolic link out")


def test_a_fifo_in_place_of_a_file_is_refused(b):
    (b / "model.onnx.data").unlink()
    os.mkfifo(b / "model.onnx.data")  # opening it would block forever
    with pytest.raises(BundleError, match="not a regular file"):
        open_bundle(b, verify=False)


def test_sizes_read_are_bounded(b, monkeypatch):
    monkeypatch.setattr(bundle_mod, "TOKENIZER_MAX_BYTES", 1000)
    with pytest.raises(BundleError, match="over the 0 MiB a tokenizer may be"):
        open_bundle(b, verify=False)
    monkeypatch.setattr(manifest_mod, "MANIFEST_MAX_BYTES", 1000)
    with pytest.raises(BundleError, match="is over 0 MiB; it is not a bundle manifest"):
        open_bundle(b, verify=False)


def test_a_manifest_that_is_not_a_regular_file_is_refused(b):
    (b / MANIFEST_FILE).unlink()
    (b / MANIFEST_FILE).symlink_to("/dev/zero")
    one_line_error(CliRunner().invoke(export_cli, ["inspect", str(b)]), "not a regular file")


def test_a_kv_update_mode_this_runtime_does_not_know_is_one_line(b):
    _rewrite(b, lambda d: d["graph"]["kv"].update(update="teleport"))
    one_line_error(
        CliRunner().invoke(run_cli, ["--bundle", str(b), "--target", "x86", "--json", "--prompt", "To be"]),
        "graph.kv.update 'teleport' is not one this runtime knows (in_place_scatter, host_copy)",
    )


def _set(*path: object) -> Callable[[dict], None]:
    """An edit setting the value at path[:-1] to path[-1]."""
    *keys, value = path

    def edit(d: dict) -> None:
        for key in keys[:-1]:
            d = d[key]
        d[keys[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (_set("model", "num_layers", 7), "model.num_heads must list 7"),
        (_set("model", "num_kv_heads", []), "model.num_kv_heads must list"),
        (_set("model", "vocab_size", -1), "model.vocab_size = -1 is outside"),
        (_set("model", "vocab_size", 10**12), "model.vocab_size"),
        (_set("model", "head_dim", 7), "model.rotary_dim"),
        (_set("model", "num_kv_heads", 0, 7), "graph.inputs['past_key.0'] has shape"),
        (_set("model", "rotary_dim", 7), "model.rotary_dim 7 must be even"),
        (_set("model", "rope_inv_freq", []), "rope_inv_freq hold half"),
        (_set("graph", "activation_dtype", "x"), "graph.activation_dtype 'x'"),
        (_set("graph", "kv", "dtype", []), "graph.kv.dtype []"),
        (_set("graph", "inputs", "past_key.0", "x"), "graph.inputs['past_key.0'] must be an object"),
        (_set("graph", "inputs", "past_key.0", {}), "graph.inputs['past_key.0'] must be an object"),
        (_set("graph", "inputs", "past_key.0", "shape", 7), "graph.inputs['past_key.0'] must be an object"),
        (_set("graph", "inputs", "past_key.0", "shape", []), "graph.inputs['past_key.0'] has shape []"),
        (_set("graph", "inputs", "past_key.9", {"shape": [1, 2, "capacity", 8]}), "names no layer"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_an_edited_manifest_with_wrong_types_or_dims_is_one_line(b, edit, needle):
    """Fields the runtime allocates and binds by, of the wrong type or disagreeing with each other, with the
    digest recomputed: one line naming the field, not a numpy, ONNX Runtime or KeyError traceback."""
    _rewrite(b, edit)
    with pytest.raises(BundleError, match="re-export the bundle"):
        open_bundle(b, verify=False)
    one_line_error(
        CliRunner().invoke(run_cli, ["--bundle", str(b), "--target", "x86", "--json", "--prompt", "To be"]), needle
    )
