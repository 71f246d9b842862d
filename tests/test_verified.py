"""Verified-file memos: an unchanged bundle is not re-hashed in full, but re-checked by sampled chunk
CRCs and hashed in full weekly or on demand; any change to a file is caught (verified.py)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from edge_runtime import bundle as bundle_mod
from edge_runtime import verified
from edge_runtime.bundle import open_bundle
from edge_runtime.errors import BundleError

DATA = "model.onnx.data"


@pytest.fixture
def copy(tied_bundle, tmp_path, monkeypatch):
    """A private copy of the tiny bundle, its own memo directory, no racy-file grace period, and every
    file treated as big (memoised and sampled; real bundles' small files are hashed every load)."""
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(verified, "RACY_NS", 0)
    monkeypatch.setattr(verified, "FULL_HASH_BYTES", 0)
    monkeypatch.setattr(verified, "CHUNK_BYTES", 4096)
    out = tmp_path / "b"
    shutil.copytree(tied_bundle, out)
    return out


@pytest.fixture
def hashed(monkeypatch):
    """Names of the files open_bundle hashes in full."""
    names: list[str] = []
    real = bundle_mod.hash_file

    def counting(path):
        names.append(path.name)
        return real(path)

    monkeypatch.setattr(bundle_mod, "hash_file", counting)
    return names


def _rot(file, offset: int, n: int = 1) -> None:
    """Bit rot: bytes change under the file system, stat data does not. A user cannot set ctime back, so
    the memo is told the new stat data instead (what the memo then sees equals what it recorded)."""
    memo = verified._memo_path(file)
    record = json.loads(memo.read_text())
    with open(file, "r+b") as f:
        f.seek(offset)
        data = bytearray(f.read(n))
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))
    record["stat"] = verified._identity(file.stat())
    memo.write_text(json.dumps(record))


def test_second_open_of_an_unchanged_bundle_hashes_nothing_in_full(copy, hashed):
    manifest = open_bundle(copy).manifest
    assert sorted(hashed) == sorted(manifest.files)
    hashed.clear()
    assert open_bundle(copy).manifest == manifest
    assert hashed == []


def test_small_files_are_hashed_on_every_load_and_not_memoised(copy, hashed, monkeypatch):
    monkeypatch.setattr(verified, "FULL_HASH_BYTES", 32 << 20)
    open_bundle(copy)
    open_bundle(copy)
    assert len(hashed) == 2 * len(open_bundle(copy, verify=False).manifest.files)
    assert not (copy.parent / "cache" / "verified").exists()


def test_byte_flipped_after_the_memo_with_size_and_mtime_restored_is_refused(copy, hashed):
    open_bundle(copy)
    victim = copy / DATA
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: only ctime moved
    assert victim.stat().st_size == st.st_size and victim.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(BundleError, match=r"model\.onnx\.data"):
        open_bundle(copy)


def test_bit_rot_under_unchanged_stat_data_is_caught_by_the_sampled_chunks(copy, hashed, monkeypatch):
    open_bundle(copy)
    monkeypatch.setattr(verified, "SAMPLE_CHUNKS", 10**9)  # a sample that covers every chunk: deterministic
    _rot(copy / DATA, (copy / DATA).stat().st_size // 2, 16)
    with pytest.raises(BundleError, match=r"model\.onnx\.data.*does not match the checksum"):
        open_bundle(copy)


def test_bit_rot_the_sample_misses_is_caught_by_the_weekly_full_hash(copy, hashed, monkeypatch):
    open_bundle(copy)
    monkeypatch.setattr(verified, "SAMPLE_CHUNKS", 0)  # the worst case: no chunk of the rot is sampled
    _rot(copy / DATA, 100)
    open_bundle(copy)  # within the week: not caught (the run-time output checks are the backstop)
    memo = verified._memo_path(copy / DATA)
    record = json.loads(memo.read_text())
    record["full_at"] -= verified.FULL_EVERY_S
    memo.write_text(json.dumps(record))
    with pytest.raises(BundleError, match=r"model\.onnx\.data"):
        open_bundle(copy)


def test_bit_rot_is_caught_at_once_with_verify_full(copy, hashed, monkeypatch):
    open_bundle(copy)
    monkeypatch.setattr(verified, "SAMPLE_CHUNKS", 0)
    _rot(copy / DATA, 100)
    with pytest.raises(BundleError, match=r"model\.onnx\.data"):
        open_bundle(copy, verify="full")


def test_a_corrupted_memo_over_a_good_file_is_rewritten_not_fatal(copy, hashed, monkeypatch):
    open_bundle(copy)
    monkeypatch.setattr(verified, "SAMPLE_CHUNKS", 10**9)
    memo = verified._memo_path(copy / DATA)
    record = json.loads(memo.read_text())
    record["crcs"] = "A" * len(record["crcs"])  # every CRC zero: every chunk "differs"
    memo.write_text(json.dumps(record))
    hashed.clear()
    open_bundle(copy)  # the full hash matches the manifest: the file is fine
    assert hashed == [DATA]
    assert json.loads(memo.read_text())["crcs"] != record["crcs"]
    hashed.clear()
    open_bundle(copy)
    assert hashed == []


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


def test_verify_mode_names_are_checked(copy):
    with pytest.raises(BundleError, match="verify must be one of off, sampled, full"):
        open_bundle(copy, verify="sometimes")  # type: ignore[arg-type]
