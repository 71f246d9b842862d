"""Held-out text, its token windows and perplexity through a bundle or `transformers`: shared by
scripts/quality_table.py and scripts/streaming_ppl.py; run alone, a bundle's held-out perplexity.

    python scripts/heldout_eval.py BUNDLE [--text models/eval/python_docstrings.txt] [--context 512]
                                   [--tokens 4088] [--threads 2]

Tokenization is the checkpoint's own `tokenizer.json` as `transformers` applies it: the text is
encoded without special tokens, and each window starts with BOS only where the tokenizer's
post-processor adds one (the demo model: yes; SmolLM2: no), so a window scores as `transformers`
would score it given that window as its text.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TEXT = ROOT / "models" / "eval" / "python_docstrings.txt"


def read_text(path: Path) -> str:
    """The text of a held-out file, without the leading '#' header lines (and the blank line after)
    that models/eval/*.txt carry; files without a header are returned whole."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        i += 1
    if i and i < len(lines) and not lines[i].strip():
        i += 1
    return "".join(lines[i:])


def text_ids(checkpoint: Path, text: str) -> tuple[np.ndarray, list[int]]:
    """(token ids of the text without special tokens, the prefix the tokenizer adds to a text)."""
    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    ids = np.asarray(tok.encode(text, add_special_tokens=False).ids, np.int64)
    # What the post-processor puts before a text (BOS or nothing): the difference of the two encodings.
    with_special, plain = tok.encode("a", add_special_tokens=True).ids, tok.encode("a", add_special_tokens=False).ids
    prefix = with_special[: with_special.index(plain[0])] if plain and plain[0] in with_special else []
    return ids, prefix


def windows(ids: np.ndarray, prefix: list[int], context: int, tokens: int) -> list[np.ndarray]:
    """Consecutive, non-overlapping windows of `context` ids (prefix + text) predicting at least
    `tokens` tokens in all (context - 1 per window)."""
    span = context - len(prefix)
    count = math.ceil(tokens / (context - 1))
    if count * span > len(ids):
        raise SystemExit(f"the text has {len(ids)} tokens; {count} windows of {span} need {count * span}")
    head = np.asarray(prefix, np.int64)
    return [np.concatenate([head, ids[k * span : (k + 1) * span]]) for k in range(count)]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def graph_perplexity(engine, wins: list[np.ndarray]) -> float:
    """Perplexity of a loaded bundle over the windows, each a fresh stream prefilled at once."""
    nll, count = 0.0, 0
    for ids in wins:
        engine.reset()
        logits = engine.prefill(ids[:-1], all_logits=True)
        nll -= float(log_softmax(logits)[np.arange(len(ids) - 1), ids[1:]].sum())
        count += len(ids) - 1
    return math.exp(nll / count)


def transformers_perplexity(checkpoint: Path, wins: list[np.ndarray], threads: int) -> float:
    """The same windows through `transformers` (float32 weights): the reference the fp32 bundle should equal."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    nll, count = 0.0, 0
    with torch.no_grad():
        for ids in wins:
            logits = model(torch.from_numpy(ids[None, :-1])).logits[0].double().numpy()
            nll -= float(log_softmax(logits)[np.arange(len(ids) - 1), ids[1:]].sum())
            count += len(ids) - 1
    return math.exp(nll / count)


def decode_rate(engine, prompt: np.ndarray, tokens: np.ndarray) -> float:
    """Teacher-forced decode steps per second after a prefill of `prompt`."""
    engine.reset()
    engine.prefill(prompt)
    t0 = time.perf_counter()
    for t in tokens:
        engine.decode(int(t))
    return len(tokens) / (time.perf_counter() - t0)


def machine() -> str:
    """CPU model and core count, for the tables' captions."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores visible, {platform.machine()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path, help="a bundle directory (its tokenizer.json tokenizes the text)")
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="held-out text (default: %(default)s)")
    ap.add_argument("--context", type=int, default=512, help="tokens per window, prefix included")
    ap.add_argument("--tokens", type=int, default=4088, help="predicted tokens in all (context - 1 per window)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    from edge_runtime.engine import LoadOptions, load

    ids, prefix = text_ids(a.bundle, read_text(a.text))
    wins = windows(ids, prefix, a.context, a.tokens)
    ppl = graph_perplexity(load(a.bundle, LoadOptions(threads=a.threads)), wins)
    print(f"{a.bundle}: perplexity {ppl:.3f} over {len(wins)} windows of {a.context} ({machine()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
