"""A GGUF's Linears kept in their blocks as stored (gguf_quant.read_codes with blocks, the MatMulGGUF op): the
default of an export that names no --quant where the edge kernels run. Tiny GGUFs of every executed type, written
here with GGUFWriter (K-quants by tests/gguf_kquants.py), export, validate and decode; the bundle holds the file's
bytes of every kept Linear unchanged (Q/K rows back in Hugging Face order); an explicit --quant requantizes and
says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

from edge_runtime import kernels
from edge_runtime.cli.export import main as export_cli
from edge_runtime.exporters.gguf_blocks import BLOCK_TYPES
from edge_runtime.exporters.gguf_convert import reverse_permute
from edge_runtime.exporters.gguf_quant import BLOCKS_FORMAT

from .test_gguf import _greedy, write_gguf
from .test_mixed_precision import _nodes
from .tiny_models import save_tiny_checkpoint

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"{kernels.unavailable_reason()}")

LAYERS = 2
# Widths that hold K-quant super-blocks (256): hidden 256, MLP 512, 4 heads of 64 (2 KV heads)
WIDE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
ROLES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@pytest.fixture(scope="module")
def wide_hf(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("wide") / "hf"
    save_tiny_checkpoint("llama-untied", d, num_hidden_layers=LAYERS, **WIDE)
    return d


def _export(src: Path, out: Path, *args: str) -> tuple[dict, str]:
    res = CliRunner().invoke(export_cli, [str(src), "-o", str(out), *args])
    assert res.exit_code == 0, res.output
    return json.loads((out / "manifest.json").read_text()), res.output


def _gguf_nodes(bundle: Path) -> list[onnx.NodeProto]:
    model = onnx.load(str(bundle / "model.onnx"), load_external_data=False)
    return [n for n in _nodes(model.graph) if n.op_type == kernels.MATMUL_GGUF]


def _bundle_blocks(bundle: Path) -> int:
    """Bytes of the bundle's GGUF-block initializers."""
    model = onnx.load(str(bundle / "model.onnx"))
    return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer if t.name.endswith("/weight_gguf"))


def _file_rows(path: Path, name: str, heads: int | None) -> np.ndarray:
    t = {t.name: t for t in gguf.GGUFReader(path).tensors}[name]
    raw = np.asarray(t.data).view(np.uint8).reshape(int(t.shape[1]), -1)
    return reverse_permute(raw, heads) if heads else raw


@pytest.mark.parametrize("name", sorted(BLOCK_TYPES))
def test_every_executed_type_is_kept_as_stored_and_runs(tmp_path, wide_hf, name):
    path = tmp_path / f"m.{name}.gguf"
    write_gguf(wide_hf, path, linear_type=Q[name])
    bundle = tmp_path / "b"
    # Q4_0 into an INT4 export goes to MatMulQ4 (test_q4_0_into_int4_runs_on_matmul_q4): x86's INT8 keeps its blocks
    target = "x86" if name == "Q4_0" else "nuc"
    m, output = _export(path, bundle, "--target", target)
    q = m["quantization"]
    assert f"keeping the file's {name} Linears as stored (edge MatMulGGUF)" in output
    if target == "nuc":
        assert "not nuc's int4-gptq" in output  # the profile's method gives way, and says so
    rec = q["gguf_codes"]
    kept = {k: v for k, v in rec["imported"].items() if ".layers." in k}  # (a Q4_0/Q8_0 head: as INT8 table codes)
    assert len(kept) == 7 * LAYERS and set(kept.values()) == {name}
    assert BLOCKS_FORMAT in rec["scheme"]
    linears = {k: v for k, v in q["per_tensor"].items() if ".layers." in k}
    assert all(v["gguf_type"] == name and v["rel_err"] == 0.0 for v in linears.values())
    assert q["exact_parity"]["max_rel_err"] <= q["exact_parity"]["tolerance"]  # fp32_compute twin: 1e-4 class
    nodes = [n for n in _gguf_nodes(bundle) if not n.name.startswith("/lm_head/")]
    assert nodes and {a.i for n in nodes for a in n.attribute if a.name == "type"} == {BLOCK_TYPES[name].ggml_id}
    # The file's bytes, unchanged: q (permuted by llama.cpp) and down of layer 1 against the bundle's initializers
    model = onnx.load(str(bundle / "model.onnx"))
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith("/weight_gguf")}
    qkv = next(v for k, v in stored.items() if "layers.1/" in k and "qkv" in k)
    q_rows = _file_rows(path, "blk.1.attn_q.weight", WIDE["num_attention_heads"])
    assert np.array_equal(qkv[: q_rows.shape[0]], q_rows)
    down = next(v for k, v in stored.items() if "layers.1/" in k and "down" in k)
    assert np.array_equal(down, _file_rows(path, "blk.1.ffn_down.weight", None))
    file_bytes = sum(_file_rows(path, f"blk.{i}.{r}.weight", None).nbytes for i in range(LAYERS) for r in ROLES)
    assert _bundle_blocks(bundle) == file_bytes
    tokens = _greedy(bundle, [0, 17, 33, 99, 250], 8)
    assert len(tokens) == 8 and all(0 <= t < 320 for t in tokens)


def test_q4_0_into_int4_runs_on_matmul_q4(tmp_path, wide_hf):
    """An INT4 export holds Q4_0 exactly in MatMulQ4's own format (the same 18 bytes a block, nibbles reordered),
    whose kernel decodes faster: the Linears are MatMulQ4 over the file's codes and fp16 scales."""
    path = tmp_path / "q.gguf"
    write_gguf(wide_hf, path, linear_type=Q.Q4_0)
    m, _ = _export(path, tmp_path / "b", "--target", "nuc")
    per = m["quantization"]["per_tensor"]
    linears = {k: v for k, v in per.items() if ".layers." in k}
    assert all(v["codes"] == "gguf" and v["rel_err"] == 0.0 and "gguf_type" not in v for v in linears.values())
    model = onnx.load(str(tmp_path / "b" / "model.onnx"), load_external_data=False)
    assert kernels.MATMUL_Q4 in {n.op_type for n in _nodes(model.graph)}
    assert [n.name for n in _gguf_nodes(tmp_path / "b")] == ["/lm_head/MatMulGGUF"]  # the Q8_0 head


def test_a_q4_k_m_like_mix_runs_its_types_side_by_side(tmp_path, wide_hf):
    """Q4_K with a Q6_K attn_v in layer 0 (llama-quantize's Q4_K_M mixes so): the fused qkv of layer 0 is two
    MatMulGGUF (Q4_K rows for q|k, Q6_K for v) concatenated (in each branch of the graph's If); the export
    validates."""
    path = tmp_path / "mix.gguf"
    write_gguf(wide_hf, path, linear_type=Q.Q4_K, override_type=("blk.0.attn_v.weight", Q.Q6_K))
    m, _ = _export(path, tmp_path / "b", "--target", "nuc")
    kinds = m["quantization"]["gguf_codes"]["imported"]
    assert kinds["model.layers.0.self_attn.v_proj.weight"] == "Q6_K"
    assert kinds["model.layers.0.self_attn.q_proj.weight"] == "Q4_K"
    types = sorted({a.i for n in _gguf_nodes(tmp_path / "b") if "layers.0/" in n.name and "qkv" in n.name
                    for a in n.attribute if a.name == "type"})  # fmt: skip
    assert types == [BLOCK_TYPES["Q4_K"].ggml_id, BLOCK_TYPES["Q6_K"].ggml_id]
    assert len(_greedy(tmp_path / "b", [0, 5, 9], 6)) == 6


def test_an_int8_block_32_head_runs_as_q8_0_and_leaves_the_argmax(tmp_path, wide_hf):
    """A Q8_0 head, kept as INT8 blocks of 32, runs on MatMulGGUF over the same values in Q8_0's layout (MatMulNBits
    took it before) and outputs next_token, which greedy decoding reads."""
    path = tmp_path / "h.gguf"
    write_gguf(wide_hf, path, linear_type=Q.Q4_K, override_type=("output.weight", Q.Q8_0))
    m, _ = _export(path, tmp_path / "b", "--target", "nuc")
    assert m["quantization"]["gguf_codes"]["imported"]["lm_head.weight"] == "Q8_0"
    (head,) = [n for n in _gguf_nodes(tmp_path / "b") if n.name.startswith("/lm_head/")]
    assert {a.name: a.i for a in head.attribute}["type"] == BLOCK_TYPES["Q8_0"].ggml_id and len(head.output) == 2
    model = onnx.load(str(tmp_path / "b" / "model.onnx"))
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}["/lm_head/weight_q8_0"]
    assert np.array_equal(stored, _file_rows(path, "output.weight", None))  # the file's Q8_0 bytes, rebuilt exactly
    assert len(_greedy(tmp_path / "b", [0, 5, 9], 6)) == 6


def test_an_explicit_quant_requantizes_and_says_so(tmp_path, wide_hf):
    path = tmp_path / "k.gguf"
    write_gguf(wide_hf, path, linear_type=Q.Q4_K)
    m, output = _export(path, tmp_path / "b", "--target", "nuc", "--quant", "int4")
    rec = m["quantization"]["gguf_codes"]
    assert rec["imported"] == {} and set(rec["requantized"].values()) >= {"Q4_K"}
    assert "requantizing" in output and not _gguf_nodes(tmp_path / "b")


def test_a_gguf_export_caches_in_fp16_unless_asked(tmp_path, wide_hf):
    """llama.cpp's default cache, fp16, where edge-runtime's attention ops run: the file's blocks kept or
    requantized alike (plan.default_kv_dtype); --kv-dtype still decides."""
    path = tmp_path / "k.gguf"
    write_gguf(wide_hf, path, linear_type=Q.Q4_K)
    kept, _ = _export(path, tmp_path / "kept", "--target", "nuc")
    asked, _ = _export(path, tmp_path / "asked", "--target", "nuc", "--kv-dtype", "fp32")
    requantized, _ = _export(path, tmp_path / "requantized", "--target", "nuc", "--quant", "int4")
    assert kept["graph"]["kv"]["dtype"] == "float16" and kept["provenance"]["options"]["kv_dtype"] == "fp16"
    assert asked["graph"]["kv"]["dtype"] == "float32" and requantized["graph"]["kv"]["dtype"] == "float16"
    assert kept["validation"]["max_rel_err"] <= kept["validation"]["tolerance"]
    assert len(_greedy(tmp_path / "kept", [0, 5, 9], 6)) == 6


def test_a_tied_q8_0_table_is_stored_once_for_the_embedding_and_the_head(tmp_path):
    """A tied Q8_0 token_embd: the bundle holds its bytes once, as the file stores them; GatherGGUF reads the
    embedding's rows from them and MatMulGGUF the head's product (no MatMulNBits table beside a Q8_0 copy)."""
    hf = tmp_path / "hf"
    save_tiny_checkpoint("llama-tied", hf, num_hidden_layers=LAYERS, **WIDE)
    path = tmp_path / "t.gguf"
    write_gguf(hf, path, linear_type=Q.Q4_K, override_type=("token_embd.weight", Q.Q8_0))
    m, _ = _export(path, tmp_path / "b", "--target", "nuc")
    assert m["quantization"]["gguf_codes"]["imported"]["model.embed_tokens.weight"] == "Q8_0"
    model = onnx.load(str(tmp_path / "b" / "model.onnx"))
    tables = [t for t in model.graph.initializer if "embed_tokens" in t.name]
    assert [t.name for t in tables] == ["/model/embed_tokens/weight_q8_0"]
    assert np.array_equal(numpy_helper.to_array(tables[0]), _file_rows(path, "token_embd.weight", None))
    readers = {n.op_type for n in _nodes(model.graph) if tables[0].name in n.input}
    assert readers == {kernels.GATHER_GGUF, kernels.MATMUL_GGUF}
    assert m["validation"]["max_rel_err"] <= m["validation"]["tolerance"]
    assert len(_greedy(tmp_path / "b", [0, 5, 9], 6)) == 6
