"""Verified-file memos: an unchanged bundle is not re-hashed; any change to a file is still caught."""

from __future__ import annotations

import os
import shutil

import pytest

from edge_runtime import bundle as bundle_mod
from edge_runtime import verified
from edge_runtime.bundle import open_bundle
from edge_runtime.errors import BundleError


@pytest.fixture
def copy(tied_bundle, tmp_path, monkeypatch):
    """A private copy of the tiny bundle, its own memo directory, no racy-file grace period."""
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(verified, "RACY_NS", 0)
    out = tmp_path / "b"
    shutil.copytree(tied_bundle, out)
    return out


@pytest.fixture
def hashed(monkeypatch):
    """Names of the files open_bundle actually hashes."""
    names: list[str] = []
    real = bundle_mod.sha256_file

    def counting(path):
        names.append(path.name)
        return real(path)

    monkeypatch.setattr(bundle_mod, "sha256_file", counting)
    return names


def test_second_open_of_an_unchanged_bundle_hashes_nothing(copy, hashed):
    manifest = open_bundle(copy).manifest
    assert sorted(hashed) == sorted(manifest.files)
    hashed.clear()
    assert open_bundle(copy).manifest == manifest
    assert hashed == []


def test_byte_flipped_after_the_memo_with_size_and_mtime_restored_is_refused(copy, hashed):
    open_bundle(copy)
    victim = copy / "model.onnx.data"
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: only ctime moved
    assert victim.stat().st_size == st.st_size and victim.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(BundleError, match=r"model\.onnx\.data"):
        open_bundle(copy)


def test_recently_changed_files_are_hashed_every_time(copy, hashed, monkeypatch):
    monkeypatch.setattr(verified, "RACY_NS", 10**18)  # every file counts as just written
    open_bundle(copy)
    hashed.clear()
    open_bundle(copy)
    assert len(hashed) == len(open_bundle(copy, verify=False).manifest.files)


def test_memo_off_and_unwritable_cache_still_verify(copy, hashed, monkeypatch, tmp_path):
    open_bundle(copy)
    hashed.clear()
    open_bundle(copy, memo=False)  # `edge-export inspect` hashes every byte
    assert hashed
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(blocker))  # the memo directory cannot be created
    hashed.clear()
    open_bundle(copy)
    open_bundle(copy)
    assert len(hashed) == 2 * len(open_bundle(copy, verify=False).manifest.files)
    assert not list(tmp_path.glob("**/.tmp-*"))
