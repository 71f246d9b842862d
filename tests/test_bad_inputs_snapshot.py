"""Session snapshots and the chat's /load: bounded reads, the header under the checksum, checked messages."""

from __future__ import annotations

import hashlib
import json
import os
import struct

import pytest
from click.testing import CliRunner

from edge_runtime.cli.run import main as run_cli
from edge_runtime.engine import load
from edge_runtime.errors import CorruptSnapshotError
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.session import Session
from edge_runtime.snapshot import MAGIC, Snapshot

from .tiny_models import demo_with_template

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def saved(tied_bundle, tmp_path_factory):
    """A session of 20 tokens and its snapshot file's bytes."""
    session = Session(load(tied_bundle))
    session.prefill(list(range(3, 23)))
    path = tmp_path_factory.mktemp("snap") / "s"
    session.save(path)
    return session, path.read_bytes()


def _split(data: bytes) -> tuple[dict, bytes]:
    start = len(MAGIC) + 8
    (n,) = struct.unpack("<Q", data[len(MAGIC) : start])
    return json.loads(data[start : start + n]), data[start + n : -32]


def _write(path, header: dict, payload: bytes, *, digest: bool = True) -> None:
    """A snapshot file with `header` and a valid trailer: what a crafted file (not a corrupted one) looks like."""
    blob = json.dumps(header).encode()
    head = MAGIC + struct.pack("<Q", len(blob)) + blob
    path.write_bytes(head + payload + (hashlib.sha256(head + payload).digest() if digest else b""))


def test_an_edited_header_field_fails_the_checksum(saved, tmp_path):
    session, data = saved
    path = tmp_path / "s"
    edited = data.replace(b'"tokens": 20', b'"tokens": 19')
    assert edited != data
    path.write_bytes(edited)
    with pytest.raises(CorruptSnapshotError, match="checksum"):
        session.load(path)
    assert session.length == 20


def test_a_version_1_snapshot_still_loads_and_its_fields_are_checked(saved, tmp_path):
    session, data = saved
    header, payload = _split(data)
    v1 = {**header, "version": 1, "payload_sha256": hashlib.sha256(payload).hexdigest()}
    path = tmp_path / "v1"
    _write(path, v1, payload, digest=False)
    other = Session(load(session.engine.bundle.path))
    other.load(path)
    assert other.length == 20
    for field, value in [("tokens", "20"), ("pending", -1), ("geometry", [4]), ("arrays", {}), ("evicted", [])]:
        _write(path, {**v1, field: value}, payload, digest=False)
        with pytest.raises(CorruptSnapshotError, match="malformed header"):
            other.load(path)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda h: {**h, "arrays": [[n, "|O", s] for n, _, s in h["arrays"]]}, "dtype"),
        (lambda h: {**h, "arrays": [[n, d, [*s, 1 << 62]] for n, d, s in h["arrays"]]}, "past the payload"),
        (lambda h: {**h, "arrays": h["arrays"][:-1]}, "malformed header"),
        (lambda h: {**h, "tokens": h["written"] + 1}, "does not fit this session"),
        (lambda h: {**h, "pending": 1 << 40}, "outside the vocabulary"),
    ],
)
def test_a_crafted_snapshot_with_a_valid_checksum_is_refused_and_changes_nothing(saved, tmp_path, edit, match):
    session, data = saved
    header, payload = _split(data)
    path = tmp_path / "crafted"
    _write(path, edit(header), payload)
    with pytest.raises(CorruptSnapshotError, match=match):
        session.load(path)
    assert session.length == 20


def test_a_snapshot_larger_than_the_session_cache_is_refused_before_reading(saved, tmp_path):
    session, data = saved
    header, _ = _split(data)
    path = tmp_path / "huge"
    _write(path, {**header, "payload_bytes": 1 << 40}, b"")
    with open(path, "r+b") as f:  # sparse: the size the header claims, without the bytes
        f.truncate(path.stat().st_size + (1 << 40))
    with pytest.raises(CorruptSnapshotError, match="more than this session's"):
        session.load(path)


@pytest.mark.parametrize("kind", ["dev_zero", "fifo", "directory"])
def test_a_snapshot_that_is_not_a_regular_file_is_refused(saved, tmp_path, kind):
    session, _ = saved
    path = {"dev_zero": "/dev/zero", "fifo": tmp_path / "fifo", "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(CorruptSnapshotError, match="not a regular file"):
        Snapshot.load(path)
    assert session.length == 20


@pytest.fixture(scope="module")
def chat_bundle(tmp_path_factory):
    ck = demo_with_template(tmp_path_factory.mktemp("ck") / "demo", TEMPLATE)
    out = tmp_path_factory.mktemp("b") / "b"
    export(ExportOptions(checkpoint=ck, out=out, window=100))
    return out


def _chat(bundle, text: str):
    r = CliRunner().invoke(
        run_cli, ["--bundle", str(bundle), "--target", "x86", "--chat", "--json", "--max-tokens", "2"], input=text
    )
    assert r.exit_code == 0, r.output
    return [json.loads(x) for x in r.stdout.strip().splitlines()]


def test_chat_load_refuses_bad_messages_in_one_line_and_keeps_the_chat(chat_bundle, tmp_path):
    snap = tmp_path / "c.snap"
    _chat(chat_bundle, f"Hi\n/save {snap}\n")
    side = tmp_path / "c.snap.messages.json"
    good = json.loads(side.read_text())
    bad = [
        ({**good, "messages": [{"role": "user", "content": 5}]}, "is not"),
        ({**good, "messages": [{"role": "user"}]}, "is not"),
        ({**good, "messages": ["hi"]}, "is not"),
        ({**good, "messages": [{"role": "root", "content": "x"}]}, "has role 'root'"),
        ({**good, "messages": [{"role": "user", "content": "\ud800"}]}, "not valid UTF-8"),
        ([[[[1]]]] * 3, "is not"),
    ]
    for saved, match in bad:
        side.write_text(json.dumps(saved))
        out = _chat(chat_bundle, f"/load {snap}\nAgain\n")
        assert out[0]["notice"].startswith("/load failed: ") and match in out[0]["notice"], out[0]
        assert "\n" not in out[0]["notice"] and out[1]["turn"] == 1  # nothing loaded, the chat went on
    side.unlink()
    side.symlink_to("/dev/zero")
    out = _chat(chat_bundle, f"/load {snap}\n")
    assert "not a regular file" in out[0]["notice"]
