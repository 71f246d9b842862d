"""Checkpoint loading: dtypes, shards, and every way a checkpoint can be broken names the culprit."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from edge_runtime.errors import CheckpointError, ConfigError, CorruptCheckpointError, WeightMappingError
from edge_runtime.exporters import CheckpointTensors, SafetensorsFile, load_checkpoint

from .tiny_models import save_tiny_checkpoint

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
st_numpy = pytest.importorskip("safetensors.numpy")


@pytest.fixture
def ckpt_dir(tmp_path):
    save_tiny_checkpoint("llama-untied", tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _rewrite(directory, edit):
    """Load model.safetensors as numpy, let `edit` change the dict, write it back."""
    path = directory / "model.safetensors"
    tensors = st_numpy.load_file(str(path))
    edit(tensors)
    st_numpy.save_file(tensors, str(path))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_float_dtypes_widen_exactly(tmp_path, dtype):
    # Values spanning many binades, subnormals and signed zero included.
    x = torch.cat([torch.randn(1000) * 10.0 ** torch.randint(-8, 8, (1000,)), torch.tensor([0.0, -0.0, 1e-40])])
    x = x.to(getattr(torch, dtype))
    st_torch.save_file({"x": x.reshape(-1, 1)}, str(tmp_path / "t.safetensors"))
    ours = SafetensorsFile(tmp_path / "t.safetensors").get("x")
    expected = x.float().numpy().reshape(-1, 1)
    assert ours.dtype == np.float32
    assert np.array_equal(ours.view(np.uint32), expected.view(np.uint32))  # bit-exact, -0.0 included


def test_bf16_checkpoint_equals_its_fp32_widening(tmp_path):
    hf = save_tiny_checkpoint("llama-tied", tmp_path, dtype="bfloat16")  # returned model: bf16 widened to fp32
    ckpt = load_checkpoint(tmp_path)
    assert np.array_equal(ckpt.weights.layers[1].down, hf.model.layers[1].mlp.down_proj.weight.detach().numpy())


def test_sharded_index_loads_same_weights(tmp_path):
    save_tiny_checkpoint("llama-untied", tmp_path / "one")
    save_tiny_checkpoint("llama-untied", tmp_path / "many", max_shard_size="30KB")
    assert (tmp_path / "many" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "many").glob("*.safetensors"))) > 2
    one, many = load_checkpoint(tmp_path / "one"), load_checkpoint(tmp_path / "many")
    assert len(many.tensors.files) > 2
    for a, b in zip(one.weights.layers, many.weights.layers, strict=True):
        assert np.array_equal(a.q, b.q) and np.array_equal(a.down, b.down)
    assert np.array_equal(one.weights.lm_head, many.weights.lm_head)


def test_missing_shard_is_named(tmp_path):
    save_tiny_checkpoint("llama-untied", tmp_path, max_shard_size="30KB")
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=victim.name):
        load_checkpoint(tmp_path)


def test_truncated_file_is_named(ckpt_dir):
    path = ckpt_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors.*truncated"):
        load_checkpoint(ckpt_dir)


@pytest.mark.parametrize("content", [b"", b"\x05\x00", b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!"])
def test_garbage_file_is_named(tmp_path, content):
    (tmp_path / "bad.safetensors").write_bytes(content)
    with pytest.raises(CorruptCheckpointError, match=r"bad\.safetensors"):
        CheckpointTensors(tmp_path)


def test_unused_tensor_is_named(ckpt_dir):
    _rewrite(ckpt_dir, lambda t: t.__setitem__("model.layers.0.mlp.extra_proj.weight", np.zeros((2, 2), np.float32)))
    with pytest.raises(WeightMappingError, match=r"model\.layers\.0\.mlp\.extra_proj\.weight"):
        load_checkpoint(ckpt_dir)


def test_missing_tensor_is_named(ckpt_dir):
    _rewrite(ckpt_dir, lambda t: t.pop("model.layers.2.self_attn.v_proj.weight"))
    with pytest.raises(WeightMappingError, match=r"model\.layers\.2\.self_attn\.v_proj\.weight"):
        load_checkpoint(ckpt_dir)


def test_misshaped_tensor_is_named(ckpt_dir):
    _rewrite(ckpt_dir, lambda t: t.__setitem__("model.norm.weight", np.ones(65, np.float32)))
    with pytest.raises(WeightMappingError, match=r"model\.norm\.weight.*\(65,\)"):
        load_checkpoint(ckpt_dir)


def test_legacy_rotary_buffers_are_ignored(ckpt_dir):
    _rewrite(ckpt_dir, lambda t: t.__setitem__("model.layers.0.self_attn.rotary_emb.inv_freq", np.ones(8, np.float32)))
    assert load_checkpoint(ckpt_dir).args.num_layers == 3


def test_tied_copy_of_lm_head_is_accepted(tmp_path):
    save_tiny_checkpoint("llama-tied", tmp_path)
    _rewrite(tmp_path, lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"].copy()))
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.weights.lm_head is ckpt.weights.embed


def test_layer_count_mismatch_reports_leftover_layer(ckpt_dir):
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg["num_hidden_layers"] = 2
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightMappingError, match=r"model\.layers\.2\."):
        load_checkpoint(ckpt_dir)


def test_directory_errors(tmp_path, ckpt_dir):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_checkpoint(empty)
    shutil.copy(ckpt_dir / "config.json", empty / "config.json")
    with pytest.raises(CheckpointError, match=r"no model\.safetensors"):
        load_checkpoint(empty)
    (empty / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_checkpoint(empty)
