"""How many greedy tokens a bundle shares with `transformers` (float32, the same checkpoint) on fixed prompts.

    python scripts/greedy_prefix.py CHECKPOINT BUNDLE [BUNDLE ...] --tokens 64

Two raw prompts and one through the chat template (the checkpoint's); prints the matched prefix per prompt.
A dev script: it imports torch and transformers (the dev extra), never the runtime's own path.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edge_runtime.engine import LoadOptions, load
from edge_runtime.generate import GenerationConfig, generate
from edge_runtime.tokenizer import Tokenizer

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("bundles", type=Path, nargs="+")
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(a.checkpoint), dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(a.checkpoint))
    prompts = [list(hf_tok(p)["input_ids"]) for p in PROMPTS]
    prompts.append(list(hf_tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)))
    refs = []
    for ids in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=a.tokens, min_new_tokens=a.tokens,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
        refs.append(out[0, len(ids) :].tolist())
    for bundle in a.bundles:
        engine = load(bundle, LoadOptions(threads=2))
        tok = Tokenizer.for_engine(engine)
        matched = []
        for ids, ref in zip(prompts, refs, strict=True):
            got = generate(engine, tok, ids, GenerationConfig(max_tokens=a.tokens, stop_on_eos=False)).token_ids
            matched.append(next((i for i, (x, y) in enumerate(zip(got, ref, strict=True)) if x != y), len(ref)))
        print(f"{bundle}: matched greedy prefix {matched} of {a.tokens} (raw, raw, chat template)")


if __name__ == "__main__":
    main()
