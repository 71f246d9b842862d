"""A GGUF export reads its file once, dequantizes a block of rows at a time, and checks --max-memory against the
conversion's estimate before converting anything."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime.cli.export import main as export_cli
from edge_runtime.exporters import from_source, gguf_convert, gguf_quant
from edge_runtime.exporters.gguf_reader import GGUFFile
from edge_runtime.exporters.memory_plan import estimate_conversion_memory

from .test_gguf import write_gguf
from .tiny_models import save_tiny_checkpoint

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hf")
    save_tiny_checkpoint("llama-untied", d)
    return d


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.F16])
def test_rows_dequantized_a_block_at_a_time_equal_the_whole_tensor(hf, tmp_path, qtype):
    path = tmp_path / "m.gguf"
    write_gguf(hf, path, linear_type=qtype)
    gg = GGUFFile(path)
    for name in gg.tensor_names:
        whole = gg.tensor(name)
        blocks = list(gg.tensor_rows(name, max_bytes=4 * whole.shape[-1] * 3))  # 3 rows a block
        parts = np.concatenate(blocks) if whole.ndim > 1 else blocks[0]
        assert parts.shape == whole.shape and parts.tobytes() == whole.tobytes(), name
        if whole.ndim > 1 and whole.shape[0] > 3:
            assert len(blocks) == -(-whole.shape[0] // 3)


def test_a_gguf_export_opens_its_file_once(hf, tmp_path, monkeypatch):
    """Kept codes, conversion and tokenizer all come from one parse of the metadata."""
    path = tmp_path / "m.gguf"
    write_gguf(hf, path, linear_type=Q.Q4_0)
    opened = []
    real_init = GGUFFile.__init__

    def counting(self, p):
        opened.append(Path(p).name)
        real_init(self, p)

    monkeypatch.setattr(GGUFFile, "__init__", counting)
    read = []
    monkeypatch.setattr(from_source, "read_codes", lambda *a, **k: read.append(a[2]) or gguf_quant.read_codes(*a, **k))
    res = CliRunner().invoke(export_cli, [str(path), "-o", str(tmp_path / "b"), "--quant", "int4", "--quiet"])
    assert res.exit_code == 0, res.output
    assert opened == ["m.gguf"] and len(read) == 1 and isinstance(read[0], GGUFFile)


def test_max_memory_is_checked_against_the_conversion_before_it_starts(hf, tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    write_gguf(hf, path)

    def no_conversion(*_a, **_k):
        raise AssertionError("converted although --max-memory refuses the conversion")

    monkeypatch.setattr(gguf_convert, "convert_gguf", no_conversion)
    need = estimate_conversion_memory(path.stat().st_size, GGUFFile(path).entries("tokenizer.ggml.tokens")).total
    res = CliRunner().invoke(export_cli, [str(path), "-o", str(tmp_path / "b"), "--max-memory", str(need - 1)])
    assert res.exit_code != 0 and "converting this GGUF to float32 needs about" in res.output, res.output
    assert "over --max-memory" in res.output and "--quant" not in res.output.splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]  # no conversion directory, no bundle


def test_the_conversion_estimate_grows_with_the_file_and_the_vocabulary():
    small, big = estimate_conversion_memory(100 << 20, 50_000), estimate_conversion_memory(250 << 20, 262_144)
    assert big.total > small.total and set(big.parts) == {"baseline", "gguf", "tokenizer", "dequantize"}
