"""Crafted and corrupted checkpoints: each is refused with one line naming
the problem, before anything is written, and no file's bytes are echoed."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime.cli.export import main as export_cli

from .bad_inputs_util import one_line_error, snapshot
from .tiny_models import save_tiny_checkpoint

WEIGHTS = "model.safetensors"
VICTIM = "model.layers.0.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("src") / "ck"
    d.mkdir()
    save_tiny_checkpoint("llama-tied", d)
    return d


@pytest.fixture
def bad(ckpt, tmp_path) -> Path:
    """A private copy of the checkpoint to damage."""
    return Path(shutil.copytree(ckpt, tmp_path / "ck"))


def _read(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write(path: Path, header: dict, data: bytes) -> None:
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def _export_refused(bad: Path, tmp_path: Path, *needles: str, options: tuple[str, ...] = ()) -> str:
    before = snapshot(bad)
    r = CliRunner().invoke(export_cli, [str(bad), "-o", str(tmp_path / "out"), "--window", "64", *options])
    line = one_line_error(r, *needles)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))
    assert snapshot(bad) == before  # the checkpoint is untouched
    return line


def test_a_shape_whose_element_count_wraps_int64_is_refused(bad, tmp_path):
    header, data = _read(bad / WEIGHTS)
    # 2^32 x 2^32 elements: np.prod in int64 wraps to 0, which matched empty offsets and failed later.
    header["evil"] = {"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 0]}
    _write(bad / WEIGHTS, header, data)
    _export_refused(bad, tmp_path, "tensor 'evil' offsets [0, 0] do not match F32[4294967296, 4294967296]")


def test_overlapping_tensor_offsets_are_refused(bad, tmp_path):
    header, data = _read(bad / WEIGHTS)
    twin = next(n for n, e in header.items() if n != VICTIM and e.get("shape") == header[VICTIM]["shape"])
    header[twin]["data_offsets"] = header[VICTIM]["data_offsets"]  # two tensors over the same bytes
    _write(bad / WEIGHTS, header, data)
    _export_refused(bad, tmp_path, "overlap")


def _index(bad: Path, weight_map: dict) -> None:
    (bad / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_an_index_weight_map_value_that_is_not_a_string_is_refused(bad, tmp_path):
    header, _ = _read(bad / WEIGHTS)
    _index(bad, {n: WEIGHTS for n in header if n != "__metadata__"} | {VICTIM: 7})
    _export_refused(bad, tmp_path, f"weight_map['{VICTIM}'] is 7, not a shard file name")


@pytest.mark.parametrize("shard", ["../secret.bin", "/etc/hostname", "sub/../../secret.bin"])
def test_shard_paths_outside_the_checkpoint_are_refused_without_echoing_bytes(bad, tmp_path, shard):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"HUNTER2!" + b"x" * 100)  # its first 8 bytes, read as a header length, were echoed
    header, _ = _read(bad / WEIGHTS)
    _index(bad, {n: WEIGHTS for n in header if n != "__metadata__"} | {VICTIM: shard})
    line = _export_refused(bad, tmp_path, "is not a plain file name in the checkpoint directory")
    assert str(struct.unpack("<Q", b"HUNTER2!")[0]) not in line and "HUNTER" not in line


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_weights_are_refused_naming_the_tensor(bad, tmp_path, value):
    header, data = _read(bad / WEIGHTS)
    begin, end = header[VICTIM]["data_offsets"]
    w = np.frombuffer(data[begin:end], dtype="<f4").copy()
    w[[3, 77]] = value
    _write(bad / WEIGHTS, header, data[:begin] + w.tobytes() + data[end:])
    _export_refused(bad, tmp_path, f"tensor '{VICTIM}' holds 2 NaN or Inf values", "corrupted")


def test_a_nan_in_a_table_read_a_part_at_a_time_is_refused_naming_its_rows(bad, tmp_path, monkeypatch):
    """A quantized export reads the embedding table from the file a block of rows at a time (StoredTable):
    the finite check runs per block and says where."""
    from edge_runtime.exporters import tables

    table = "model.embed_tokens.weight"
    header, data = _read(bad / WEIGHTS)
    rows, cols = header[table]["shape"]
    begin, end = header[table]["data_offsets"]
    w = np.frombuffer(data[begin:end], dtype="<f4").copy().reshape(rows, cols)
    w[rows - 2, 5] = np.nan
    _write(bad / WEIGHTS, header, data[:begin] + w.tobytes() + data[end:])
    monkeypatch.setattr(tables, "PART_ELEMENTS", 16 * cols)  # blocks of 16 rows
    first = (rows - 2) // 16 * 16
    _export_refused(
        bad, tmp_path, f"tensor '{table}' holds 1 NaN or Inf value", f"in rows {first}..", options=("--quant", "int4")
    )


@pytest.mark.parametrize("config_file", ["config.json", "generation_config.json"])
def test_an_eos_id_outside_the_vocabulary_is_refused(bad, tmp_path, config_file):
    vocab = json.loads((bad / "config.json").read_text())["vocab_size"]
    path = bad / config_file
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps(cfg | {"eos_token_id": [1, vocab + 5]}))
    _export_refused(bad, tmp_path, f"{config_file}: 'eos_token_id' = {vocab + 5} is outside the vocabulary")


# llama-tied: hidden 64, 4 query heads and 2 KV heads of head_dim 16, MLP 96, vocabulary 320. Each edit
# below still divides the weights' rows evenly: unchecked, the export would read (say) 2 heads of 32, build
# its reference from the same misreading, validate and write a bundle that prints garbage.
@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        (
            {"head_dim": 32},
            ("config.json: head_dim = 32", "'model.layers.0.self_attn.q_proj.weight' is [64, 64]", "head_dim 16"),
        ),
        ({"head_dim": 8}, ("config.json: head_dim = 8", "which means head_dim 16 with num_attention_heads 4")),
        ({"num_attention_heads": 2}, ("config.json: num_attention_heads = 2", "4 query heads of head_dim 16")),
        ({"num_key_value_heads": 1}, ("config.json: num_key_value_heads = 1", "2 KV heads of head_dim 16")),
        ({"intermediate_size": 48}, ("config.json: intermediate_size = 48", "mlp.gate_proj.weight' is [96, 64]")),
        ({"vocab_size": 400}, ("config.json: vocab_size = 400", "which means vocab_size 320")),
        ({"hidden_size": 32}, ("config.json: hidden_size = 32", "which means hidden_size 64")),
    ],
    ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else "",
)
def test_a_config_the_weight_shapes_disagree_with_is_refused_naming_the_key(bad, tmp_path, edit, needles):
    path = bad / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | edit))
    _export_refused(bad, tmp_path, *needles)


def test_the_config_check_reads_no_tensor(bad):
    """Shapes come from the safetensors header: the refusal happens before any tensor's bytes are read."""
    from edge_runtime.errors import WeightMappingError
    from edge_runtime.exporters import load_checkpoint, safetensors_io

    path = bad / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"head_dim": 32}))

    def no_reading(self, name):
        raise AssertionError(f"tensor '{name}' read before the config was checked")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(safetensors_io.SafetensorsFile, "read", no_reading)
        m.setattr(safetensors_io.SafetensorsFile, "get", no_reading)
        with pytest.raises(WeightMappingError, match="head_dim = 32"):
            load_checkpoint(bad)


def test_a_symlinked_weights_file_is_refused_without_echoing_its_first_bytes(bad, tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"HUNTER2!" + b"x" * 100)  # read as a header length, these 8 bytes were printed
    (bad / WEIGHTS).unlink()
    (bad / WEIGHTS).symlink_to(secret)
    line = _export_refused(bad, tmp_path, "header length (first 8 bytes) does not fit")
    assert str(struct.unpack("<Q", b"HUNTER2!")[0]) not in line and "HUNTER" not in line


@pytest.mark.parametrize("name", [WEIGHTS, "config.json", "model.safetensors.index.json"])
def test_a_fifo_in_the_checkpoint_is_refused_not_waited_on(bad, tmp_path, name):
    import os

    header, _ = _read(bad / WEIGHTS)
    if name == "model.safetensors.index.json":
        (bad / name).write_text(json.dumps({"weight_map": {n: WEIGHTS for n in header if n != "__metadata__"}}))
        name = WEIGHTS  # the index names a shard that is a FIFO
    (bad / name).unlink()
    os.mkfifo(bad / name)  # nobody writes it: opening it for reading would block the export for ever
    r = CliRunner().invoke(export_cli, [str(bad), "-o", str(tmp_path / "out"), "--window", "64"])
    one_line_error(r, "is not a regular file")
    assert not (tmp_path / "out").exists()


def test_a_deeply_nested_config_is_one_line(bad, tmp_path):
    (bad / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    _export_refused(bad, tmp_path, "config.json", "nested too deeply")
