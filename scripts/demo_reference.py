"""What works today on the bundled demo model: load it with our numpy loader, score held-out text and
generate greedily with the float64 reference forward (the oracle the exporter will validate against).

    python scripts/demo_reference.py [--prompt TEXT] [--max-tokens N] [--checkpoint DIR]

This is the reference path, not the runtime: it is slow on purpose (float64, no graph). `edge-run`
replaces it as the main job once the runtime lands.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tokenizers import Tokenizer

from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.exporters import ReferenceModel, load_checkpoint
from edge_runtime.exporters.reference import greedy_generate, perplexity
from edge_runtime.models import DEMO_CHECKPOINT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=DEMO_CHECKPOINT)
    ap.add_argument("--prompt", default="ROMEO.\nWhat light")
    ap.add_argument("--max-tokens", type=int, default=60)
    args = ap.parse_args()
    try:
        ckpt = load_checkpoint(args.checkpoint)
    except EdgeRuntimeError as e:
        print(f"error: {e}")
        return 1
    a = ckpt.args
    n_params = sum(ckpt.tensors[k].size for k in ckpt.tensors)
    print(
        f"{args.checkpoint.name}: {a.model_type}, {n_params / 1e6:.2f}M parameters, {a.num_layers} layers, "
        f"hidden {a.hidden_size}, {a.num_heads}/{a.num_kv_heads} heads, vocab {a.vocab_size}"
    )
    tok = Tokenizer.from_file(str(args.checkpoint / "tokenizer.json"))
    model = ReferenceModel(a, ckpt.weights)

    heldout = args.checkpoint / "heldout.txt"
    if heldout.is_file():
        ids = [
            a.bos_token_id,
            *tok.encode(heldout.read_text(encoding="utf-8")[:20000], add_special_tokens=False).ids[:511],
        ]
        print(f"held-out perplexity (first 512 tokens, float64 reference): {perplexity(model, ids):.3f}")

    prompt = tok.encode(args.prompt).ids  # the tokenizer prepends BOS
    t0 = time.perf_counter()
    out = greedy_generate(model, prompt, args.max_tokens, eos_ids=a.eos_token_ids)
    dt = time.perf_counter() - t0
    print(f"--- greedy, {len(out)} tokens in {dt:.2f} s (float64 reference, not the runtime) ---")
    print(tok.decode(prompt + out, skip_special_tokens=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
