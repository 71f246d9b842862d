"""Lossless GGUF import (exporters/gguf_quant.py): a GGUF's Q4_0/Q8_0 codes go into the bundle as they
are, so every quantized initializer of the bundle dequantizes to gguf.quants.dequantize of the file's
tensor bit for bit; other types are requantized with the reason in the manifest, and an explicit
--gguf-codes keep that cannot be honoured fails in one line before any work."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

from edge_runtime import kernels
from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import ExportError
from edge_runtime.exporters.gguf_quant import read_codes
from edge_runtime.exporters.quant import QuantConfig, QuantMethod
from edge_runtime.models import ARCHITECTURES
from edge_runtime.models.base import WeightFolds

from .test_gguf import _greedy, llama_cpp_permute, write_gguf
from .tiny_models import TINY_CONFIGS, save_tiny_checkpoint

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

_QUANT_OPS = ("MatMulNBits", "MatMulQ4", "GatherBlockQuantized")


def _export(src: Path, out: Path, *args: str) -> dict:
    res = CliRunner().invoke(export_cli, [str(src), "-o", str(out), *args])
    assert res.exit_code == 0, res.output
    return json.loads((out / "manifest.json").read_text())


def _file_weights(path: Path) -> dict[str, np.ndarray]:
    """gguf.quants.dequantize of every 2-D tensor, in the file's own (llama.cpp) row order."""
    return {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        for t in gguf.GGUFReader(path).tensors
        if len(t.shape) == 2
    }


def _bundle_weights(bundle: Path) -> dict[str, tuple[np.ndarray, int]]:
    """Node prefix -> (the initializers' dequantized weight [N, K], bits), unpacked from MatMulNBits' layout
    (codes + 2^(bits-1), 4-bit pairs low nibble first) and whatever scales the node reads."""
    model = onnx.load(str(bundle / "model.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type not in _QUANT_OPS:
            continue
        b_name, s_name = (node.input[0], node.input[2]) if node.op_type == "GatherBlockQuantized" else node.input[1:3]
        bits = next((a.i for a in node.attribute if a.name == "bits"), 4)
        b, scales = inits[b_name], inits[s_name]
        n = b.shape[0]
        u = b.reshape(n, -1)
        if bits == 4:
            u = np.stack([u & 0x0F, u >> 4], axis=-1).reshape(n, -1)
        codes = u.astype(np.float32) - 2 ** (bits - 1)
        s = scales.reshape(n, -1).astype(np.float32)
        out[node.name.rsplit("/", 1)[0]] = ((codes.reshape(n, s.shape[1], -1) * s[:, :, None]).reshape(n, -1), bits)
    return out


def _expected(layers: int, cfg: dict, *, llama: bool, tied: bool) -> dict[str, list[tuple[str, int | None]]]:
    """Bundle node prefix -> the GGUF tensors stacked in it (with the head count llama.cpp permuted them by)."""
    q, kv = (cfg["num_attention_heads"], cfg["num_key_value_heads"]) if llama else (None, None)
    parts = {"/model/embed_tokens": [("token_embd.weight", None)]}
    parts["/lm_head"] = [("token_embd.weight" if tied else "output.weight", None)]
    for i in range(layers):
        layer, blk = f"/model/layers.{i}", f"blk.{i}"
        parts[f"{layer}/attn/qkv_proj"] = [(f"{blk}.attn_q.weight", q), (f"{blk}.attn_k.weight", kv)]
        parts[f"{layer}/attn/qkv_proj"].append((f"{blk}.attn_v.weight", None))
        parts[f"{layer}/attn/o_proj"] = [(f"{blk}.attn_output.weight", None)]
        parts[f"{layer}/mlp/gate_up_proj"] = [(f"{blk}.ffn_gate.weight", None), (f"{blk}.ffn_up.weight", None)]
        parts[f"{layer}/mlp/down_proj"] = [(f"{blk}.ffn_down.weight", None)]
    return parts


def _check_exact(bundle: Path, gguf_path: Path, kept: set[str], cfg: dict, *, llama: bool, tied: bool) -> int:
    """Every node whose parts are all in `kept` (GGUF names) holds exactly the file's dequantized values,
    its rows put back in llama.cpp's order; returns how many tensors were compared."""
    file_w, ours = _file_weights(gguf_path), _bundle_weights(bundle)
    compared = 0
    for prefix, parts in _expected(cfg["num_hidden_layers"], cfg, llama=llama, tied=tied).items():
        if prefix not in ours or not all(name in kept for name, _ in parts):
            continue
        w, _ = ours[prefix]
        rows = np.split(w, np.cumsum([file_w[name].shape[0] for name, _ in parts])[:-1])
        for (name, heads), got in zip(parts, rows, strict=True):
            if heads is not None:  # HF rows -> llama.cpp's interleaved rotary halves
                got = llama_cpp_permute(got, heads)
            assert got.shape == file_w[name].shape, name
            assert got.tobytes() == file_w[name].tobytes(), f"{prefix}: {name} differs from the file"
            compared += 1
    return compared


def _run_matmul(op: str, qm, x: np.ndarray, **attrs) -> np.ndarray:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from edge_runtime.exporters.quant_graph import pack_nbits

    b, s, _ = pack_nbits(qm, "w")
    n, k = qm.shape
    domain = "com.microsoft" if op == "MatMulNBits" else kernels.DOMAIN
    if op == "MatMulQ4":
        s = s.astype(np.float16)  # what --kernel edge exports write
    node = helper.make_node(op, ["x", "b", "s"], ["y"], domain=domain, K=k, N=n, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.shape[0], n])],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(s, "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)])
    so = ort.SessionOptions()
    kernels.register(so)
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("op", ["MatMulQ4", "MatMulNBits-0", "MatMulNBits-4"])
def test_negative_scales_compute_like_positive_ones(op):
    """The same weights as (codes, -scales) and (-codes, scales): MatMulQ4 gives exactly the same output;
    MatMulNBits to float rounding at accuracy_level 0 (fp32) and 4 (int8 activations)."""
    from edge_runtime.exporters.quant import QuantizedMatrix

    if op == "MatMulQ4" and not kernels.available():
        pytest.skip(kernels.unavailable_reason())
    rng = np.random.default_rng(0)
    codes = rng.integers(-7, 8, (64, 128)).astype(np.int8)  # -7..7: both signs representable
    scales = (np.abs(rng.standard_normal((64, 4))) * 0.01 + 1e-3).astype(np.float16).astype(np.float32)
    pos = QuantizedMatrix(codes, scales, 4, 32)
    neg = QuantizedMatrix(-codes, -scales, 4, 32)
    np.testing.assert_array_equal(pos.dequantize(), neg.dequantize())  # equal values (0 * -s is -0.0)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    name, _, level = op.partition("-")
    attrs = {"bits": 4, "block_size": 32, "accuracy_level": int(level)} if level else {}
    y_pos, y_neg = _run_matmul(name, pos, x, **attrs), _run_matmul(name, neg, x, **attrs)
    if name == "MatMulQ4":
        np.testing.assert_array_equal(y_neg, y_pos)
    else:
        np.testing.assert_allclose(y_neg, y_pos, rtol=0, atol=1e-5 * float(np.abs(y_pos).max()))
    exact = x.astype(np.float64) @ pos.dequantize().astype(np.float64).T
    tol = 1e-6 if level == "0" else 2e-2  # int8 activations: MatMulQ4 and accuracy_level 4
    assert float(np.abs(y_neg - exact).max() / np.abs(exact).max()) < tol


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory) -> Path:
    """llama (llama.cpp permutes its Q/K rows), untied head, every 2-D tensor Q4_0 (the table too)."""
    d = tmp_path_factory.mktemp("q4")
    save_tiny_checkpoint("llama-untied", d / "hf")
    write_gguf(d / "hf", d / "q4.gguf", linear_type=Q.Q4_0, override_type=("token_embd.weight", Q.Q4_0))
    return d / "q4.gguf"


@pytest.mark.parametrize("kernel", ["mlas", "edge"])
def test_q4_0_codes_kept_bit_exact(tmp_path, q4_gguf, kernel):
    """--quant int4 --table-bits 4: all 23 tensors imported, the bundle's weights equal the file's bit for
    bit (negative scales included, through MatMulNBits and the edge MatMulQ4), and it validates and generates."""
    if kernel == "edge" and not kernels.available():
        pytest.skip(kernels.unavailable_reason())
    raw = {t.name: t for t in gguf.GGUFReader(q4_gguf).tensors}["blk.0.attn_q.weight"]
    d = np.asarray(raw.data).reshape(-1, 18)[:, :2].copy().view(np.float16)
    assert (d < 0).any() and (d > 0).any()  # llama.cpp's rule gives both signs: the case that needs checking
    bundle = tmp_path / "b"
    m = _export(q4_gguf, bundle, "--quant", "int4", "--table-bits", "4", "--kernel", kernel)
    rec = m["quantization"]["gguf_codes"]
    assert len(rec["imported"]) == 23 and set(rec["imported"].values()) == {"Q4_0"} and rec["requantized"] == {}
    assert all(v["rel_err"] == 0.0 and v["codes"] == "gguf" for v in m["quantization"]["per_tensor"].values())
    assert m["quantization"]["exact_parity"]["max_rel_err"] <= m["quantization"]["exact_parity"]["tolerance"]
    if kernel == "edge":
        ops = {n.op_type for n in onnx.load(str(bundle / "model.onnx"), load_external_data=False).graph.node}
        assert "MatMulQ4" in ops
    cfg = TINY_CONFIGS["llama-untied"]
    kept = set(_file_weights(q4_gguf))
    assert _check_exact(bundle, q4_gguf, kept, cfg, llama=True, tied=False) == 23
    shown = CliRunner().invoke(export_cli, ["inspect", str(bundle)])
    assert "GGUF codes kept as stored: 23 Q4_0 tensors" in shown.output
    tokens = _greedy(bundle, [0, 17, 33, 99, 250], 12)
    assert len(tokens) == 12 and all(0 <= t < cfg["vocab_size"] for t in tokens)


def test_requantize_adds_error_keep_does_not(tmp_path, q4_gguf):
    """--gguf-codes requantize is today's path: the Q4_0 values re-rounded onto our positive-scale grid."""
    m = _export(q4_gguf, tmp_path / "b", "--quant", "int4", "--gguf-codes", "requantize")
    assert m["quantization"]["gguf_codes"]["imported"] == {}
    assert "requantize" in m["quantization"]["gguf_codes"]["note"]
    per = m["quantization"]["per_tensor"]
    assert min(v["rel_err"] for k, v in per.items() if ".layers." in k) > 0.01  # INT4: a second rounding
    assert min(v["rel_err"] for v in per.values()) > 0 and not any("codes" in v for v in per.values())


@pytest.mark.parametrize("linear_type", [Q.Q8_0, Q.Q4_0])
def test_codes_kept_as_int8_blocks(tmp_path, linear_type):
    """--quant int8: Q8_0 (and Q4_0, whose codes fit 8 bits) as INT8 blocks of 32 through MatMulNBits bits 8,
    exact; qwen2 (biases, rows not permuted); the F16 table is requantized as before and said so."""
    save_tiny_checkpoint("qwen2", tmp_path / "hf")
    path = tmp_path / "m.gguf"
    write_gguf(tmp_path / "hf", path, linear_type=linear_type)
    m = _export(path, tmp_path / "b", "--quant", "int8")
    q = m["quantization"]
    assert q["block"] == 32
    assert set(q["gguf_codes"]["requantized"]) == {"model.embed_tokens.weight"}  # F16 in the file
    assert set(q["gguf_codes"]["imported"].values()) == {linear_type.name}
    cfg = TINY_CONFIGS["qwen2"]
    kept = {f"blk.{i}.{t}.weight" for i in range(cfg["num_hidden_layers"]) for t in
            ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}  # fmt: skip
    tied = cfg.get("tie_word_embeddings", True)
    assert _check_exact(tmp_path / "b", path, kept, cfg, llama=False, tied=tied) == len(kept)
    assert {bits for _, bits in _bundle_weights(tmp_path / "b").values()} == {8}
    assert len(_greedy(tmp_path / "b", [0, 5, 9], 6)) == 6


def test_mixed_types_requantize_the_rest(tmp_path):
    """A Q4_1 k_proj among Q4_0 tensors: it is requantized (Q4_1 is not exact on our grid) while q and v of
    the same fused qkv matmul keep their codes; the export validates; the record says which is which."""
    save_tiny_checkpoint("llama-tied", tmp_path / "hf")
    path = tmp_path / "m.gguf"
    write_gguf(tmp_path / "hf", path, linear_type=Q.Q4_0, override_type=("blk.1.attn_k.weight", Q.Q4_1))
    m = _export(path, tmp_path / "b", "--quant", "int4")
    rec = m["quantization"]["gguf_codes"]
    assert rec["requantized"] == {"model.embed_tokens.weight": "F16", "model.layers.1.self_attn.k_proj.weight": "Q4_1"}
    assert "model.layers.1.self_attn.q_proj.weight" in rec["imported"]
    per = m["quantization"]["per_tensor"]
    assert per["model.layers.1.self_attn.k_proj.weight"]["rel_err"] > 0
    assert per["model.layers.1.self_attn.q_proj.weight"]["rel_err"] == 0.0
    cfg = TINY_CONFIGS["llama-tied"]
    kept = {f"blk.{i}.{t}.weight" for i in range(2) for t in ("attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    kept |= {f"blk.0.{t}.weight" for t in ("attn_q", "attn_k", "attn_v")}
    assert _check_exact(tmp_path / "b", path, kept, cfg, llama=True, tied=True) == len(kept)


def test_float_export_of_gguf_notes_why(tmp_path, q4_gguf):
    m = _export(q4_gguf, tmp_path / "b")
    assert m["quantization"]["gguf_codes"]["note"].startswith("GGUF codes not imported: --quant none")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--quant", "int4", "--flavor", "trt", "--block", "64"], "trt flavor"),
        (["--quant", "int4-gptq"], "int4-gptq"),
        (["--quant", "int4", "--block", "64"], "--block 64"),
        (["--quant", "int4", "--prune", "0.25"], "--prune"),
        (["--quant", "int4", "--mixed", "llama-down"], "--mixed llama-down"),
        ([], "--quant none"),
    ],
)
def test_impossible_keep_refused_in_one_line(tmp_path, q4_gguf, args, needle):
    out = tmp_path / "bundle"
    res = CliRunner().invoke(export_cli, [str(q4_gguf), "-o", str(out), "--gguf-codes", "keep", *args])
    assert res.exit_code != 0 and isinstance(res.exception, SystemExit), res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: --gguf-codes keep cannot be honoured"), res.stderr
    assert needle in lines[0]
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_profiles_mixed_plan_gives_way_to_kept_codes(tmp_path, q4_gguf):
    """A target whose profile asks for a --mixed plan: an export that can keep the GGUF's codes keeps them and
    drops the plan with a note (it was not typed); --gguf-codes requantize applies it."""
    profile = tmp_path / "mixed.yaml"
    profile.write_text("extends: nuc\nquantization: int4\nmixed_precision: llama-down\nmatmul_kernel: mlas\n")
    args = [str(q4_gguf), "-o", str(tmp_path / "keep"), "--target", str(profile)]
    res = CliRunner().invoke(export_cli, args)
    assert res.exit_code == 0, res.output
    assert "mixed_precision llama-down does not apply" in res.stderr
    m = json.loads((tmp_path / "keep" / "manifest.json").read_text())
    assert len(m["quantization"]["gguf_codes"]["imported"]) > 0 and "mixed" not in m["quantization"]
    # a file with no Linear codes to keep (Q4_1, as the real-model fixture): the plan applies, silently
    save_tiny_checkpoint("llama-tied", tmp_path / "hf")
    write_gguf(tmp_path / "hf", tmp_path / "q41.gguf", linear_type=Q.Q4_1)
    args = [str(tmp_path / "q41.gguf"), "-o", str(tmp_path / "q41"), "--target", str(profile)]
    res = CliRunner().invoke(export_cli, args)
    assert res.exit_code == 0 and "does not apply" not in res.stderr, res.output
    m = json.loads((tmp_path / "q41" / "manifest.json").read_text())
    assert m["quantization"]["mixed"]["plan"] == "llama-down"
    assert not any(".layers." in name for name in m["quantization"]["gguf_codes"]["imported"])
    args = [str(q4_gguf), "-o", str(tmp_path / "req"), "--target", str(profile)]
    res = CliRunner().invoke(export_cli, [*args, "--gguf-codes", "requantize"])
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "req" / "manifest.json").read_text())
    assert m["quantization"]["gguf_codes"]["imported"] == {} and m["quantization"]["mixed"]["plan"] == "llama-down"


def test_gguf_codes_on_hf_directory_refused(tmp_path):
    save_tiny_checkpoint("llama-tied", tmp_path / "hf")
    res = CliRunner().invoke(export_cli, [str(tmp_path / "hf"), "-o", str(tmp_path / "b"), "--gguf-codes", "keep"])
    assert res.exit_code != 0
    assert res.stderr.strip() == "Error: --gguf-codes applies to a .gguf checkpoint only; drop it for this source"


def test_codes_are_not_kept_where_the_architecture_folds_its_linear_weights(q4_gguf, monkeypatch):
    """A fold that rewrites Linear weights (Granite's multipliers) makes the file's codes not the exported
    weights: keeping them is refused, naming the way out."""
    quant = QuantConfig(method=QuantMethod.INT4, block=32)
    assert read_codes(q4_gguf, quant).tensors  # llama as it is: kept
    folding = dataclasses.replace(ARCHITECTURES["llama"], folds=lambda _config: WeightFolds(linear=True))
    monkeypatch.setitem(ARCHITECTURES, "llama", folding)
    with pytest.raises(ExportError, match="requantize"):
        read_codes(q4_gguf, quant)
