"""Crafted GGUF files: metadata whose counts and lengths run past the end of the file or past the bounds
(checked before gguf's reader walks them), tokenizer metadata of the wrong GGUF type, and metadata that
disagrees with the tensors' shapes. Each is refused in one line, before any work, and nothing is written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import CheckpointError, CorruptCheckpointError
from edge_runtime.exporters import gguf_reader
from edge_runtime.exporters.gguf_reader import GGUFFile, check_layout

from .bad_inputs_util import cli, one_line_error
from .tiny_models import save_tiny_checkpoint

gguf = pytest.importorskip("gguf")
V = gguf.GGUFValueType

# ---------------------------------------------------------------------------------------------
# GGUF bytes by hand (v3, little-endian): magic, version, tensor count, kv count, then the kvs
# ---------------------------------------------------------------------------------------------


def _str(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _header(tensors: int, kvs: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, kvs)


def _kv_str(key: str, value: str) -> bytes:
    return _str(key) + struct.pack("<I", V.STRING) + _str(value)


def _kv_array(key: str, element: int, count: int, payload: bytes = b"") -> bytes:
    return _str(key) + struct.pack("<IIQ", V.ARRAY, element, count) + payload


def _file(tmp_path: Path, data: bytes, name: str = "bad.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _opened_quickly(path: Path) -> Exception:
    """Open `path`, expecting a refusal; fail if it took seconds or more than a few MB (gguf's reader, handed
    these files, runs for minutes into gigabytes)."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(CheckpointError) as info:
            GGUFFile(path)
    finally:
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert elapsed < 5, elapsed
    assert peak < 16 << 20, peak
    assert "\n" not in str(info.value)
    return info.value


TERA = 2**40
BOMB = _header(0, 2) + _kv_str("general.architecture", "llama") + _kv_array("general.tags", V.UINT8, TERA) + bytes(100)


def test_an_array_claiming_2_to_the_40_entries_is_refused_at_once(tmp_path):
    err = _opened_quickly(_file(tmp_path, BOMB))
    assert isinstance(err, CorruptCheckpointError)
    assert f"metadata 'general.tags' claims {TERA} UINT8 entries" in str(err)


def test_an_array_of_strings_claiming_more_than_the_file_holds_is_refused(tmp_path):
    data = _header(0, 1) + _kv_array("tokenizer.ggml.tokens", V.STRING, TERA) + _str("a") * 10
    err = _opened_quickly(_file(tmp_path, data))
    assert f"metadata 'tokenizer.ggml.tokens' claims {TERA} STRING entries" in str(err)


def test_a_string_length_past_the_end_of_the_file_is_refused(tmp_path):
    data = _header(0, 2) + _kv_str("general.architecture", "llama")
    data += _str("general.name") + struct.pack("<IQ", V.STRING, 2**62) + b"tiny"
    err = _opened_quickly(_file(tmp_path, data))
    assert f"metadata 'general.name' (a string) needs {2**62} bytes but only 4 remain" in str(err)


def test_a_string_inside_an_array_running_past_the_end_is_refused(tmp_path):
    entries = _str("ab") + _str("cd") + struct.pack("<Q", 2**50) + b"ef"
    data = _header(0, 1) + _kv_array("tokenizer.ggml.merges", V.STRING, 3, entries)
    err = _opened_quickly(_file(tmp_path, data))
    assert "entry 2 of metadata 'tokenizer.ggml.merges'" in str(err) and "past the end" in str(err)


def test_an_absurd_tensor_count_is_refused(tmp_path):
    data = _header(2**62, 1) + _kv_str("general.architecture", "llama") + bytes(64)
    err = _opened_quickly(_file(tmp_path, data))
    assert f"its header claims {2**62} tensors" in str(err)


def test_a_tensor_count_past_the_bound_is_refused_even_where_the_bytes_are_there(tmp_path):
    n = gguf_reader.MAX_TENSORS + 1
    err = _opened_quickly(_file(tmp_path, _header(n, 0) + bytes(24 * n)))
    assert type(err) is CheckpointError and f"its header claims {n} tensors" in str(err)


def test_a_key_longer_than_the_spec_allows_is_refused(tmp_path):
    data = _header(0, 1) + struct.pack("<Q", 2**63) + b"general.architecture"
    err = _opened_quickly(_file(tmp_path, data))
    assert f"a metadata key claims a length of {2**63} bytes" in str(err)


def test_a_real_array_past_the_bound_is_refused_naming_key_and_count(tmp_path):
    """Entries that are really there but more than any real file has: refused before gguf's reader makes a
    view of each (about 400 bytes an entry: 8 GB for 20M)."""
    n = gguf_reader.MAX_ARRAY + 1
    data = _header(0, 2) + _kv_str("general.architecture", "llama") + _kv_array("general.tags", V.UINT8, n, bytes(n))
    err = _opened_quickly(_file(tmp_path, data))
    assert type(err) is CheckpointError
    assert f"metadata 'general.tags' is an array of {n} entries" in str(err)


def test_tokenizer_arrays_have_their_own_bound(tmp_path):
    n = gguf_reader.MAX_TOKENIZER_ARRAY + 1
    data = _header(0, 1) + _kv_array("tokenizer.ggml.token_type", V.UINT8, n, bytes(n))
    err = _opened_quickly(_file(tmp_path, data))
    assert f"metadata 'tokenizer.ggml.token_type' is an array of {n} entries" in str(err)


def test_a_gemma3_sized_vocabulary_passes_the_bounds(tmp_path):
    """Gemma 3's tokenizer arrays (262,144 tokens, scores, token types) and Llama 3's merges (280,147) are well
    inside the bounds; the walk over them is quick."""
    n, merges = 262_144, 280_147
    data = _header(0, 5) + _kv_str("general.architecture", "gemma3")
    data += _kv_array("tokenizer.ggml.tokens", V.STRING, n, b"".join(_str(f"t{i}") for i in range(n)))
    data += _kv_array("tokenizer.ggml.scores", V.FLOAT32, n, bytes(4 * n))
    data += _kv_array("tokenizer.ggml.token_type", V.INT32, n, bytes(4 * n))
    data += _kv_array("tokenizer.ggml.merges", V.STRING, merges, _str("a b") * merges)
    t0 = time.perf_counter()
    check_layout(_file(tmp_path, data))
    assert time.perf_counter() - t0 < 5


def test_the_bomb_through_the_edge_export_process_is_one_line(tmp_path):
    """The installed command's own process: exit 1, one `Error:` line naming the key and the count, nothing
    written. gguf's reader, handed this file, runs for minutes into gigabytes; the timeout fails the test
    long before that."""
    bomb = _file(tmp_path, BOMB, "bomb.gguf")
    out = tmp_path / "out"
    p = cli("export", str(bomb), "-o", str(out))
    _, err = p.communicate(timeout=120)
    lines = err.decode().strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, err.decode()
    assert lines[0].startswith("Error: ") and f"'general.tags' claims {TERA} UINT8 entries" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.gguf"]  # no bundle, no partial


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(_header(2**62, 1) + bytes(40), id="tensor-count"),
        pytest.param(BOMB, id="array-count"),
        pytest.param(_header(0, 1) + _str("general.architecture") + struct.pack("<IQ", V.STRING, 2**40), id="string"),
    ],
)
def test_edge_export_refuses_bombs_in_one_line(tmp_path, data):
    r = CliRunner().invoke(export_cli, [str(_file(tmp_path, data)), "-o", str(tmp_path / "out")])
    one_line_error(r, "is not a valid GGUF file")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


# ---------------------------------------------------------------------------------------------
# Whole tiny models as GGUF, with one piece of metadata changed
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hf") / "ck"
    save_tiny_checkpoint("llama-tied", d)
    return d


def _gguf_with(hf: Path, path: Path, monkeypatch, **metadata: tuple[object, object]) -> Path:
    """test_gguf.write_gguf's file of `hf`, with each `key=(value, GGUF type)` set before the header is
    written (so a key added here is counted). Keys use '__' for '.'."""
    from .test_gguf import write_gguf

    header = gguf.GGUFWriter.write_header_to_file

    def patched(self, *args, **kwargs):
        for key, (value, vtype) in metadata.items():
            self.add_key_value(key.replace("__", "."), value, vtype)
        return header(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(gguf.GGUFWriter, "write_header_to_file", patched)
        write_gguf(hf, path)
    return path


def _export_refused(path: Path, tmp_path: Path, *needles: str) -> str:
    out = tmp_path / "out"
    r = CliRunner().invoke(export_cli, [str(path), "-o", str(out)])
    line = one_line_error(r, *needles)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    return line


@pytest.mark.parametrize(
    ("metadata", "needles"),
    [
        (
            {"tokenizer__ggml__tokens": (list(range(320)), V.ARRAY)},
            ("'tokenizer.ggml.tokens' is an array of INT32, expected an array of STRING",),
        ),
        (
            {"tokenizer__ggml__token_type": (["normal"] * 320, V.ARRAY)},
            ("'tokenizer.ggml.token_type' is an array of STRING, expected an array of integers",),
        ),
        ({"tokenizer__ggml__model": (7, V.UINT32)}, ("'tokenizer.ggml.model' is UINT32, expected STRING",)),
        ({"tokenizer__chat_template": (7, V.UINT32)}, ("'tokenizer.chat_template' is UINT32, expected STRING",)),
        ({"tokenizer__ggml__pre": (1.5, V.FLOAT32)}, ("'tokenizer.ggml.pre' is FLOAT32, expected STRING",)),
        ({"tokenizer__ggml__merges": ([1, 2], V.ARRAY)}, ("'tokenizer.ggml.merges' is an array of INT32",)),
        ({"tokenizer__ggml__merges": (["ab"], V.ARRAY)}, ("merge 0 of 'tokenizer.ggml.merges' is 'ab'",)),
        ({"tokenizer__ggml__merges": (["x zz"], V.ARRAY)}, ("do not make a BPE vocabulary",)),
        ({"tokenizer__ggml__bos_token_id": ("0", V.STRING)}, ("'tokenizer.ggml.bos_token_id' is STRING",)),
        ({"tokenizer__ggml__add_bos_token": (1, V.UINT32)}, ("'tokenizer.ggml.add_bos_token' is UINT32",)),
        ({"llama__block_count": ("2", V.STRING)}, ("'llama.block_count' is STRING, expected an integer",)),
        ({"llama__rope__freq_base": ("1e4", V.STRING)}, ("'llama.rope.freq_base' is STRING, expected a number",)),
        (
            {"tokenizer__ggml__model": ("llama", V.STRING), "tokenizer__ggml__scores": (["x"] * 320, V.ARRAY)},
            ("'tokenizer.ggml.scores' is an array of STRING, expected an array of numbers",),
        ),
        (
            {"tokenizer__ggml__model": ("llama", V.STRING), "tokenizer__ggml__scores": ([0.0] * 7, V.ARRAY)},
            ("320 tokens but 7 token scores",),
        ),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)
def test_metadata_of_the_wrong_type_is_refused_in_one_line(hf, tmp_path, monkeypatch, metadata, needles):
    path = _gguf_with(hf, tmp_path / "m.gguf", monkeypatch, **metadata)
    _export_refused(path, tmp_path, *needles)


def test_a_head_dim_the_tensors_disagree_with_is_refused_before_dequantizing(hf, tmp_path, monkeypatch):
    """key_length 32 over tensors of head_dim 16 (the query rows still divide by 32): refused from the tensor
    infos, before a tensor is dequantized or the converted checkpoint written."""
    d = Path(shutil.copytree(hf, tmp_path / "ck"))
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "head_dim": 32}))
    path = _gguf_with(d, tmp_path / "m.gguf", monkeypatch)
    shutil.rmtree(d)

    def no_dequantizing(self, name):
        raise AssertionError(f"tensor '{name}' dequantized before the shapes were checked")

    monkeypatch.setattr(GGUFFile, "tensor", no_dequantizing)
    _export_refused(path, tmp_path, "m.gguf", "config.json: head_dim = 32", "which means head_dim 16")


# ---------------------------------------------------------------------------------------------
# Signals: the GGUF's float32 conversion is a temporary directory too
# ---------------------------------------------------------------------------------------------

# SIGHUP at its default action, as an exporter in a terminal or under systemd has it (a runner started with
# nohup hands it on ignored, and the exporter rightly leaves an ignored signal alone).
# SIGINT gets Python's own handler, as a terminal's Ctrl-C finds it (bad_inputs_util.cli says why).
_EXPORT = (
    "import signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from edge_runtime.cli.export import main; sys.exit(main())"
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_terminating_signal_in_the_weights_phase_removes_the_conversion(hf, tmp_path, monkeypatch, sig):
    """The conversion directory (`.out.partial-PID-RAND`, the model in float32) exists from before the bundle's
    own partial: a signal while the weights are quantized must remove it as well."""
    path = _gguf_with(hf, tmp_path / "m.gguf", monkeypatch)
    p = subprocess.Popen(
        [sys.executable, "-c", _EXPORT, str(path), "-o", str(tmp_path / "out"), "--quant", "int4"],
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        err = b""
        while b"estimated peak memory" not in err:  # printed just before the weights are quantized
            line = p.stderr.readline()
            assert line, err.decode()
            err += line
        assert [d for d in tmp_path.iterdir() if d.name.startswith(".out.partial-")]  # the conversion, alive
        p.send_signal(sig)
        _, rest = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + sig, (err + rest).decode()
    assert b"Traceback" not in rest
    assert sorted(d.name for d in tmp_path.iterdir()) == ["m.gguf"]
