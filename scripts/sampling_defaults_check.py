"""How often candidate default sampling settings loop or get a fact wrong, on the README's chat examples.

    python scripts/sampling_defaults_check.py BUNDLE [--samples 10] [--max-tokens 256]

For each setting and prompt: `--samples` replies (seeds 0..n-1) through the chat template. A reply *loops*
when it reaches --max-tokens without ending its turn while some 6-token run repeats 3 times or more; the
fact check counts replies to "What is the capital of France?" that say Paris. The measurement behind
docs/decisions/sampling-defaults.md.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
from collections import Counter

from edge_runtime.engine import load
from edge_runtime.generate import GenerationConfig, generate
from edge_runtime.sampling import SamplingParams
from edge_runtime.tokenizer import Tokenizer

PROMPTS = [
    "What is the capital of France?",
    "Say hello in French.",
    "Write a short story about a lone figure lost in thought.",
    "Describe what a robot vacuum does, step by step.",
]
SETTINGS = {
    "greedy": SamplingParams(),
    "greedy + repetition penalty 1.1": SamplingParams(repetition_penalty=1.1),
    "T 0.2, top-p 0.9": SamplingParams(temperature=0.2, top_p=0.9),
    "T 0.5, top-k 40, top-p 0.95, min-p 0.05": SamplingParams(temperature=0.5, top_k=40, top_p=0.95, min_p=0.05),
    "T 0.8, top-k 40, top-p 0.95, min-p 0.05 (llama.cpp)": SamplingParams(
        temperature=0.8, top_k=40, top_p=0.95, min_p=0.05
    ),
    "T 0.8, top-k 40, top-p 0.9, repetition penalty 1.1 (Ollama)": SamplingParams(
        temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1
    ),
    "T 0.8, top-k 40, top-p 0.95, min-p 0.05, repetition penalty 1.1": SamplingParams(
        temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.1
    ),
    "T 0.5, top-k 40, top-p 0.95, min-p 0.05, repetition penalty 1.1": SamplingParams(
        temperature=0.5, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.1
    ),
}



def loops(ids: list[int], n: int = 6, times: int = 3) -> bool:
    grams = Counter(tuple(ids[i : i + n]) for i in range(len(ids) - n + 1))
    return any(c >= times for c in grams.values())


def cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--only", default="", help="Run only the settings whose name contains this.")
    args = ap.parse_args()
    engine = load(args.bundle)
    tok = Tokenizer.for_engine(engine)
    print(f"bundle {args.bundle}; CPU {cpu()}; {args.samples} samples per prompt, at most {args.max_tokens} tokens")
    print("| setting | looping replies | replies cut at max tokens | 'Paris' in the capital answers |")
    print("| --- | --- | --- | --- |")
    for name, params in SETTINGS.items():
        if args.only not in name:
            continue
        looped = cut = paris = total = 0
        n = 1 if params.greedy else args.samples
        for prompt in PROMPTS:
            for seed in range(n):
                sampling = params if params.greedy else SamplingParams(**{**vars(params), "seed": seed})
                config = GenerationConfig(max_tokens=args.max_tokens, sampling=sampling)
                r = generate(engine, tok, messages=[{"role": "user", "content": prompt}], config=config)
                total += 1
                hit_max = r.stats.finish_reason == "length"
                cut += hit_max
                looped += hit_max and loops(list(r.token_ids))
                if prompt.startswith("What is the capital"):
                    paris += "Paris" in r.text
        answers = n
        print(f"| {name} | {looped}/{total} | {cut}/{total} | {paris}/{answers} |")


if __name__ == "__main__":
    main()
