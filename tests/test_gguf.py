"""GGUF import: the converter against transformers' own GGUF loading on the real model, the
`edge-export x.gguf` CLI path on tiny GGUFs written here, and bad inputs refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime.cli.export import main as export_cli
from edge_runtime.engine import load
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.gguf_convert import convert_gguf
from edge_runtime.exporters.safetensors_io import CheckpointTensors

from .gguf_kquants import quantize_k
from .tiny_models import save_tiny_checkpoint

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

# ---------------------------------------------------------------------------------------------
# Writing tiny GGUFs the way llama.cpp's convert_hf_to_gguf.py does
# ---------------------------------------------------------------------------------------------

_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


_GEMMA3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def _gguf_name(hf: str, arch: str = "llama") -> str:
    if hf in _NAMES:
        return _NAMES[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{(_GEMMA3_LAYER_NAMES if arch == 'gemma3' else _LAYER_NAMES)[rest]}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in numpy."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


TINY_TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def _theta(config: dict) -> float:
    params = config.get("rope_parameters") or {}
    params = params.get("full_attention", params)  # Gemma 3 nests it by layer type
    return config.get("rope_theta") or params["rope_theta"]  # transformers 5 nests it


def write_gguf(
    ckpt: Path,
    path: Path,
    *,
    linear_type=Q.Q8_0,
    arch: str | None = None,
    override_type: tuple[str, object] | None = None,
    chat_template: str | None = TINY_TEMPLATE,
) -> None:
    """A GGUF of a tiny HF checkpoint: `linear_type` for 2-D weights (F32 norms, F16 embeddings
    unless everything is F32), tokenizer metadata from its tokenizer.json; `chat_template` None writes none
    (as Gemma 3 270M's GGUF has none)."""
    config = json.loads((ckpt / "config.json").read_text())
    model_type = config["model_type"]
    arch = arch or {"gemma3_text": "gemma3"}.get(model_type, model_type)
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(_theta(config))
    if arch == "gemma3":
        w.add_sliding_window(config["sliding_window"])
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv_: kv_[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    tokens += [f"<unused{i}>" for i in range(config["vocab_size"] - len(tokens))]
    special = {a["content"] for a in tok["added_tokens"] if a["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 5 if t.startswith("<unused") else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(config["bos_token_id"])
    w.add_eos_token_id(config["eos_token_id"])
    w.add_add_bos_token(True)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if rope.get("rope_type") == "llama3":  # convert_hf_to_gguf.py writes the scaling as divisors
        orig, low, high = rope["original_max_position_embeddings"], rope["low_freq_factor"], rope["high_freq_factor"]
        wavelen = 2 * np.pi * _theta(config) ** (np.arange(0, head_dim, 2) / head_dim)
        smooth = np.clip((orig / wavelen - low) / (high - low), 0, 1)
        w.add_tensor("rope_freqs.weight", (1 / ((1 - smooth) / rope["factor"] + smooth)).astype(np.float32))
    tensors = CheckpointTensors(ckpt)
    for name in tensors:
        data = np.ascontiguousarray(tensors[name], np.float32)
        if model_type in ("llama", "smollm3") and name.endswith(("q_proj.weight", "k_proj.weight")):
            data = llama_cpp_permute(data, heads if "q_proj" in name else kv)
        if arch == "gemma3" and name.endswith("norm.weight"):  # convert_hf_to_gguf.py stores Gemma's 1 + w
            data = data + np.float32(1.0)
        gname = _gguf_name(name, arch)
        qtype = Q.F32 if data.ndim == 1 else Q.F16 if "embd" in gname and linear_type != Q.F32 else linear_type
        if override_type and override_type[0] == gname:
            qtype = override_type[1]
        if qtype == Q.F32:
            w.add_tensor(gname, data)
        elif qtype == Q.F16:
            w.add_tensor(gname, data.astype(np.float16))
        elif qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
            w.add_tensor(gname, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        elif qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):  # gguf-py does not quantize these: round to nearest (gguf_kquants)
            w.add_tensor(gname, quantize_k(data, qtype.name), raw_dtype=qtype)
        else:  # a type we only need to be refused: right size, zero bytes
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.zeros((data.shape[0], data.shape[1] // block * size), np.uint8)
            w.add_tensor(gname, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny-hf")
    save_tiny_checkpoint("llama-untied", d)
    path = tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf"
    write_gguf(d, path)
    return path


def _greedy(bundle: Path, prompt: list[int], n: int) -> list[int]:
    engine = load(bundle)
    logits, out = engine.prefill(prompt), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = engine.decode(out[-1])
    return out


# ---------------------------------------------------------------------------------------------
# Tiny GGUFs: round trip, the CLI path, bad inputs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["llama-tied", "llama-untied", "llama-llama3-rope", "qwen2", "qwen3-tied", "qwen3-bias"]
)
def test_f32_gguf_round_trips_exactly(tmp_path, name):
    """HF -> GGUF (llama.cpp's permutation) -> our converter gives back every tensor bit for bit,
    and the config the architecture parser reads."""
    src = tmp_path / "hf"
    save_tiny_checkpoint(name, src)
    write_gguf(src, tmp_path / "m.gguf", linear_type=Q.F32)
    config = convert_gguf(tmp_path / "m.gguf", tmp_path / "back", dtype="f32")
    a, b = CheckpointTensors(src), CheckpointTensors(tmp_path / "back")
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    orig = json.loads((src / "config.json").read_text())
    for key in ("model_type", "num_attention_heads", "num_key_value_heads", "tie_word_embeddings"):
        assert config[key] == orig[key], key
    assert config["rope_theta"] == _theta(orig)
    from edge_runtime.models import get_arch

    rope_in, rope_out = (get_arch(c).parse(c).rope for c in (orig, config))
    np.testing.assert_allclose(rope_out.inv_freq(16), rope_in.inv_freq(16), rtol=1e-6)  # llama3 from rope_freqs
    assert config["rms_norm_eps"] == orig["rms_norm_eps"]


def test_smollm3_gguf_round_trips_with_its_nope_layers(tmp_path):
    """llama.cpp's SmolLM3 GGUF: llama's tensors (Q/K permuted) and no key for the NoPE layers, which it
    fixes at every fourth; the converted checkpoint gives back the tensors and the same NoPE layers."""
    from edge_runtime.models import get_arch

    src = tmp_path / "hf"
    save_tiny_checkpoint("smollm3", src, no_rope_layer_interval=4, num_hidden_layers=8)
    write_gguf(src, tmp_path / "m.gguf", linear_type=Q.F32)
    config = convert_gguf(tmp_path / "m.gguf", tmp_path / "back", dtype="f32")
    a, b = CheckpointTensors(src), CheckpointTensors(tmp_path / "back")
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    orig = json.loads((src / "config.json").read_text())
    assert get_arch(config).parse(config).nope_layers == get_arch(orig).parse(orig).nope_layers == (3, 7)


def test_qwen3_gguf_names_equal_transformers_gguf_loading(tmp_path):
    """An independent reading of llama.cpp's Qwen3 names (attn_q_norm, attn_k_norm): transformers' GGUF loader
    gives every tensor our converter gives, and the converted model's logits equal its. (Its loader maps no
    attention_bias and no key_length, so the model here has no biases and Qwen3Config's head_dim 128.)"""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from edge_runtime.exporters import ReferenceModel, load_checkpoint

    save_tiny_checkpoint("qwen3-tied", tmp_path / "hf", head_dim=128, num_attention_heads=2, num_key_value_heads=1)
    write_gguf(tmp_path / "hf", tmp_path / "m.gguf", linear_type=Q.F32)
    convert_gguf(tmp_path / "m.gguf", tmp_path / "back", dtype="f32")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32)
    ref = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    ours = CheckpointTensors(tmp_path / "back")
    assert set(ours) == set(ref) - {"lm_head.weight"}  # tied: transformers lists the shared head too
    for k in ours:
        np.testing.assert_array_equal(ours[k], ref[k], err_msg=k)
    ids = np.arange(3, 40)
    ckpt = load_checkpoint(tmp_path / "back")
    with torch.no_grad():
        want = theirs.eval()(torch.from_numpy(ids)[None]).logits[0].double().numpy()
    got = ReferenceModel(ckpt.args, ckpt.weights).forward(ids)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(got).max()


def test_gemma3_gguf_equals_transformers_gguf_loading(tmp_path):
    """Gemma 3 as llama.cpp stores it (norms as 1 + w, ffn_norm before the MLP, post_ffw_norm after, the window
    in the metadata, every sixth layer global, local RoPE base 10,000): transformers' GGUF loader and our
    converter give the same tensors, and our export of the GGUF the same logits. The config follows what both
    infer from a GGUF: head_dim 256 = query_pre_attn_scalar, Gemma3TextConfig's layer pattern."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from edge_runtime.exporters import ReferenceModel, load_checkpoint

    shape = {"head_dim": 256, "num_attention_heads": 1, "num_key_value_heads": 1, "query_pre_attn_scalar": 256}
    save_tiny_checkpoint("gemma3", tmp_path / "hf", num_hidden_layers=7, layer_types=None, **shape)
    write_gguf(tmp_path / "hf", tmp_path / "m.gguf", linear_type=Q.F32)
    config = convert_gguf(tmp_path / "m.gguf", tmp_path / "back", dtype="f32")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32)
    ref = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    ours, orig = CheckpointTensors(tmp_path / "back"), CheckpointTensors(tmp_path / "hf")
    assert set(ours) == set(ref) - {"lm_head.weight"} == set(orig)
    for k in ours:  # norms went through 1 + w and back in float32: equal to the float32 rounding of that
        np.testing.assert_allclose(ours[k], ref[k], rtol=0, atol=1e-6, err_msg=k)
        np.testing.assert_allclose(ours[k], orig[k], rtol=0, atol=1e-6, err_msg=k)
    assert config["layer_types"] == theirs.config.layer_types and config["sliding_window"] == 12
    ids = np.arange(3, 40)  # longer than the window: the local layers' mask matters
    with torch.no_grad():
        want = theirs.eval()(torch.from_numpy(ids)[None]).logits[0].double().numpy()
    ckpt = load_checkpoint(tmp_path / "back")
    got = ReferenceModel(ckpt.args, ckpt.weights).forward(ids)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(got).max()


def test_gguf_cli_export_equals_hf_export(tmp_path, tiny_gguf):
    """`edge-export x.gguf` == exporting the converted directory: same weights bytes, same greedy
    tokens; the temporary directory is gone afterwards and the chat template reached the checkpoint."""
    res = CliRunner().invoke(export_cli, [str(tiny_gguf), "-o", str(tmp_path / "from_gguf")])
    assert res.exit_code == 0, res.output
    assert "converted tiny.gguf" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["from_gguf"]  # no scratch dir left

    hf = tmp_path / "hf"
    convert_gguf(tiny_gguf, hf, dtype="f32")
    assert "chat_template" in json.loads((hf / "tokenizer_config.json").read_text())
    export(ExportOptions(checkpoint=hf, out=tmp_path / "from_hf"))
    m1 = json.loads((tmp_path / "from_gguf" / "manifest.json").read_text())
    m2 = json.loads((tmp_path / "from_hf" / "manifest.json").read_text())
    assert m1["files"]["model.onnx.data"] == m2["files"]["model.onnx.data"]
    assert m1["files"]["tokenizer.json"] == m2["files"]["tokenizer.json"]
    prompt = [0, 17, 33, 99, 250, 7, 64, 5]
    assert _greedy(tmp_path / "from_gguf", prompt, 24) == _greedy(tmp_path / "from_hf", prompt, 24)


def _refused(tmp_path: Path, gguf_path: Path, *needles: str) -> None:
    out = tmp_path / "bundle"
    res = CliRunner().invoke(export_cli, [str(gguf_path), "-o", str(out)])
    assert res.exit_code != 0
    assert isinstance(res.exception, SystemExit), res.exception  # a ClickException, not a crash
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr
    for needle in needles:
        assert needle in lines[0]
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no scratch or partial dir


def test_unsupported_architecture_refused(tmp_path):
    save_tiny_checkpoint("llama-tied", tmp_path / "hf")
    write_gguf(tmp_path / "hf", tmp_path / "m.gguf", arch="mamba")
    _refused(tmp_path, tmp_path / "m.gguf", "'mamba'", "llama")


def test_unsupported_quant_type_refused(tmp_path):
    save_tiny_checkpoint("llama-tied", tmp_path / "hf")
    write_gguf(tmp_path / "hf", tmp_path / "m.gguf", override_type=("blk.1.ffn_up.weight", Q.IQ4_NL))
    _refused(tmp_path, tmp_path / "m.gguf", "IQ4_NL", "blk.1.ffn_up.weight")


@pytest.mark.parametrize("keep", [100, 0.6])
def test_truncated_gguf_refused(tmp_path, tiny_gguf, keep):
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    _refused(tmp_path, cut, "not a valid GGUF file")


def test_truncated_gguf_console_script_one_line(tmp_path, tiny_gguf):
    """The installed `edge-export` itself: exit 1, one stderr line, no traceback."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-1000])
    exe = Path(sys.executable).with_name("edge-export")
    proc = subprocess.run([str(exe), str(cut), "-o", str(tmp_path / "b")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "b").exists()


# ---------------------------------------------------------------------------------------------
# The real model: our converter == transformers' GGUF loading
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_gguf_model(real_model_gguf):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' GGUF loading needs it
    model = transformers.AutoModelForCausalLM.from_pretrained(
        real_model_gguf.parent, gguf_file=real_model_gguf.name, dtype=torch.float32
    )
    return model.eval()


def test_real_model_weights_and_logits_equal_transformers_gguf(
    tmp_path, real_model_gguf, real_model_dir, hf_gguf_model
):
    """float32 conversion: every tensor equals transformers' dequantized, un-permuted one and the
    logits agree to 1e-5 (this is what proves the Q/K un-permutation); the cached bf16 fixture holds
    exactly those tensors rounded to bf16."""
    import torch
    from transformers import AutoModelForCausalLM

    ref = {k: v.detach() for k, v in hf_gguf_model.state_dict().items()}
    convert_gguf(real_model_gguf, tmp_path / "f32", dtype="f32")
    ours = CheckpointTensors(tmp_path / "f32")
    assert set(ours) == set(ref) - {"lm_head.weight"}  # tied: transformers lists the shared head too
    for k in ours:
        np.testing.assert_array_equal(ours[k], ref[k].numpy(), err_msg=k)
    fixture = CheckpointTensors(real_model_dir)
    for k in fixture:
        assert fixture[k].tobytes() == ref[k].to(torch.bfloat16).float().numpy().tobytes(), k

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "f32", dtype=torch.float32).eval()
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 2, 198]])
    with torch.no_grad():
        a, b = model(ids).logits, hf_gguf_model(ids).logits
    assert float((a - b).abs().max() / b.abs().max()) <= 1e-5


_TEXTS = [
    "Hello world",
    "The year 2024 had 365 days; pi = 3.14159 and 1,000,000 > 999",
    "héllo wörld — naïve café, 日本語のテキスト, emoji 🤖🚀",
    "def f(x):\n    return x ** 2  # square\n\n\tprint(f(3))\n",
    "  leading  spaces and trailing   ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><repo_name>a/b<file_sep>x.py",
]


def test_real_model_tokenizer_equals_transformers_gguf(real_model_gguf, real_model_dir):
    """tokenizer.json encodes like transformers' GGUF tokenizer, raw with its special-token
    handling (which adds no BOS for SmolLM2), and through the chat template; transformers reading our
    directory agrees too."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    ref = transformers.AutoTokenizer.from_pretrained(real_model_gguf.parent, gguf_file=real_model_gguf.name)
    ours = Tokenizer.from_file(str(real_model_dir / "tokenizer.json"))
    via_dir = transformers.AutoTokenizer.from_pretrained(real_model_dir)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    chat = ref.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    for text in [*_TEXTS, chat]:
        expect = ref(text)["input_ids"]
        assert ours.encode(text).ids == expect, text
        assert via_dir(text)["input_ids"] == expect, text
        assert ours.decode(expect, skip_special_tokens=False) == ref.decode(expect), text
    assert ref("Hello")["input_ids"][0] != ref.bos_token_id  # SmolLM2: no BOS prepended
    cfg = json.loads((real_model_dir / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == ref.chat_template
    assert (cfg["bos_token"], cfg["eos_token"], cfg["add_bos_token"]) == ("<|im_start|>", "<|im_end|>", False)
    assert via_dir.apply_chat_template(question, tokenize=False, add_generation_prompt=True) == chat


@pytest.mark.slow
def test_real_model_gguf_cli_export_equals_hf_export(tmp_path, real_model_gguf):
    """The real 135M model through `edge-export x.gguf` vs its float32 HF directory (minutes: -m slow)."""
    res = CliRunner().invoke(export_cli, [str(real_model_gguf), "-o", str(tmp_path / "from_gguf")])
    assert res.exit_code == 0, res.output
    convert_gguf(real_model_gguf, tmp_path / "hf", dtype="f32")
    export(ExportOptions(checkpoint=tmp_path / "hf", out=tmp_path / "from_hf"))
    prompt = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
    assert _greedy(tmp_path / "from_gguf", prompt, 64) == _greedy(tmp_path / "from_hf", prompt, 64)


def test_sentencepiece_gguf_tokenizer(tmp_path):
    """A `tokenizer.ggml.model = llama` vocabulary (scores, <0xNN> byte tokens, no merges): ids equal
    transformers' GGUF tokenizer on ordinary text and byte fallback; a leading space or text after a
    special token gets the extra '▁' that llama.cpp (and Llama 2's own tokenizer.json) gives it,
    where transformers 5's GGUF tokenizer drops it."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from edge_runtime.exporters.gguf_reader import GGUFFile
    from edge_runtime.exporters.gguf_tokenizer import build_tokenizer

    from .tiny_models import _TEXT

    spm = Tokenizer(models.BPE(unk_token="<unk>"))
    spm.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    spm.train_from_iterator([_TEXT], trainer)
    pieces = [t for t, _ in sorted(spm.get_vocab().items(), key=lambda x: x[1]) if t not in ("<unk>", "<s>", "</s>")]
    path = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces])
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(pieces))])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_tensor("token_embd.weight", np.zeros((259 + len(pieces), 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    ours, config = build_tokenizer(GGUFFile(path))
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert config["add_bos_token"] is True  # SentencePiece default, as llama.cpp and transformers assume
    for text in ["To be, or not to be", "Hello", "日本 naïve\n\nx"]:
        assert ours.encode(text).ids == ref(text)["input_ids"], text
        assert ours.decode(ours.encode(text).ids) == text
    space = ours.token_to_id("▁")
    assert ours.encode(" the").ids[:3] == [1, space, *ours.encode("the").ids[1:2]]
    assert ours.encode("<s>hi").ids[:3] == [1, 1, space]
