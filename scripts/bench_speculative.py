"""Speculative decoding against plain decoding, side by side in one run.

    python scripts/bench_speculative.py BUNDLE [--draft DRAFT_BUNDLE] [--rounds 15] [--max-tokens 160]
                                        [--threads 2] [--json out.json]

Two tasks through the bundle's chat template, greedy: a grounded one (rewrite a given JSON document with
two small edits: the reply re-emits its context) and a free-form story. Each round runs every mode on
every task once, modes interleaved (plain, lookup[, draft]) so a noisy, shared machine's drift hits all
alike; decode tokens/s is counted after the first token (as GenerationStats.decode_tps). Prints per task
and mode the median decode tokens/s, its ratio to plain, the acceptance rate, tokens per target call,
and whether the tokens equal plain decoding's (they must under greedy, up to the int4 kernels' chunk
numerics: docs/guides/speculative-decoding.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from edge_runtime import kernels
from edge_runtime.bench.environment import cpu_features, cpu_model

GROUNDED = (
    'Rewrite this JSON exactly as given, with two changes: set "status" of the task "charge battery" to '
    '"done", and change the "speed" of the robot to 0.5. Output only the JSON.\n\n'
    '{"robot": {"name": "rover-7", "speed": 1.2, "battery": 0.64, "position": {"x": 3.5, "y": -1.25}},\n'
    ' "tasks": [\n'
    '  {"id": 1, "name": "scan shelf A", "status": "done", "priority": 2},\n'
    '  {"id": 2, "name": "charge battery", "status": "pending", "priority": 1},\n'
    '  {"id": 3, "name": "deliver parcel to bay 4", "status": "pending", "priority": 3},\n'
    '  {"id": 4, "name": "return to dock", "status": "pending", "priority": 5}\n'
    " ]}"
)
FREE = "Write a short story about a lighthouse keeper who finds a message in a bottle."



def run_once(engine: Any, tok: Any, messages: list[dict[str, str]], max_tokens: int, spec: Any) -> dict[str, Any]:
    from edge_runtime.generate import GenerationConfig, generate

    config = GenerationConfig(max_tokens=max_tokens)
    before = dataclass_copy(spec.stats) if spec is not None else None
    t0 = time.perf_counter()
    result = generate(engine, tok, messages=messages, config=config, speculative=spec)
    wall = time.perf_counter() - t0
    out = {"ids": result.token_ids, "decode_tps": result.stats.decode_tps, "wall_s": wall}
    if spec is not None:
        s, b = spec.stats, before
        proposed, accepted = s.proposed - b.proposed, s.accepted - b.accepted
        steps, emitted = s.steps - b.steps, s.emitted - b.emitted
        out |= {
            "acceptance": accepted / proposed if proposed else 0.0,
            "tokens_per_step": emitted / steps if steps else 0.0,
            "verify_steps": s.verify_steps - b.verify_steps,
            "switched_off": s.switched_off - b.switched_off,
        }
    return out


def dataclass_copy(x: Any) -> Any:
    import dataclasses

    return dataclasses.replace(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--draft", type=Path, default=None, help="a draft bundle (same tokenizer) for a third mode")
    ap.add_argument("--draft-tokens", type=int, default=4)
    # Single rounds' ratios vary by +-15% on a shared machine; a median of 15 holds to a few percent.
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--window", type=int, default=1020, help="ring window (S + W <= the model's context)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--llama-cpp-bin", type=Path, help="a llama.cpp build's bin/ (llama-lookup, llama-completion)")
    ap.add_argument("--gguf", type=Path, help="the same checkpoint as a GGUF, for the llama.cpp rows")
    ap.add_argument("--llama-k", type=int, action="append", help="llama-lookup's --spec-draft-n-max [3 and 8]")
    args = ap.parse_args()
    if (args.llama_cpp_bin is None) != (args.gguf is None):
        ap.error("--llama-cpp-bin and --gguf go together")

    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.proposers import DraftModel, PromptLookup
    from edge_runtime.speculative import SpeculativeDecoder
    from edge_runtime.tokenizer import Tokenizer

    opts = LoadOptions(window=args.window, threads=args.threads)
    engine = load(args.bundle, opts)
    tok = Tokenizer(engine.bundle.tokenizer_file, engine.manifest.tokenizer)
    tasks = {"grounded": [{"role": "user", "content": GROUNDED}], "free-form": [{"role": "user", "content": FREE}]}
    # The draft's threads sleep between its calls: spinning, they would hold the cores the target runs on.
    draft_opts = LoadOptions(window=args.window, threads=args.threads, spin=False)
    draft = None if args.draft is None else load(args.draft, draft_opts)
    modes = ["plain", "lookup"] + ([] if draft is None else ["draft"])
    # One decoder per task and mode (its arms adapt over the rounds, as a long-lived decoder would).
    decoders: dict[tuple[str, str], Any] = {}
    for task in tasks:
        decoders[(task, "plain")] = None
        decoders[(task, "lookup")] = SpeculativeDecoder(PromptLookup())
        if draft is not None:
            decoders[(task, "draft")] = SpeculativeDecoder(DraftModel(draft), k=args.draft_tokens)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {(t, m): [] for t in tasks for m in modes}
    llama: dict[tuple[str, str], list[dict[str, Any]]] = {}
    if args.gguf is not None:
        from llamacpp_lookup import lookup, plain  # a sibling script

        from edge_runtime.chat import ChatTemplate

        template = ChatTemplate.for_bundle(engine.bundle)
        texts = {t: template.render(m) for t, m in tasks.items()}
        llama_modes = ["plain"] + [f"lookup k={k}" for k in args.llama_k or [3, 8]]
        llama = {(t, m): [] for t in tasks for m in llama_modes}
    run_once(engine, tok, tasks["free-form"], 16, None)  # warm-up: first-call allocations, page faults
    for r in range(args.rounds):
        for task, messages in tasks.items():
            order = modes if r % 2 == 0 else modes[::-1]  # interleaved, alternating order
            for mode in order:
                runs[(task, mode)].append(run_once(engine, tok, messages, args.max_tokens, decoders[(task, mode)]))
            for mode in [m for (t, m) in llama if t == task]:
                n = args.max_tokens
                if mode == "plain":
                    res = plain(args.llama_cpp_bin, args.gguf, texts[task], n, args.threads)
                else:
                    k = int(mode.split("=")[1])
                    res = lookup(args.llama_cpp_bin, args.gguf, texts[task], n, args.threads, k)
                llama[(task, mode)].append(res)
    report: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_features": ", ".join(cpu_features()) or "unknown",
        "edge_kernels": kernels.isa() or "not available",
        "bundle": str(args.bundle),
        "draft": str(args.draft) if args.draft else None,
        "threads": args.threads,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "results": [],
    }
    print(f"cpu: {report['cpu']} ({report['cpu_features']}; edge kernels {report['edge_kernels']}) | "
          f"threads {args.threads} | {args.rounds} rounds | {args.max_tokens} tokens")  # fmt: skip
    print(f"{'task':10s} {'mode':7s} {'tok/s':>7s} {'x plain':>8s} {'accept':>7s} {'tok/call':>8s} {'same':>5s}")
    for task in tasks:
        base = statistics.median(x["decode_tps"] for x in runs[(task, "plain")])
        want = runs[(task, "plain")][0]["ids"]
        for mode in modes:
            xs = runs[(task, mode)]
            tps = statistics.median(x["decode_tps"] for x in xs)
            row = {
                "task": task,
                "mode": mode,
                "decode_tps": round(tps, 2),
                "ratio": round(tps / base, 3) if base else 0.0,
                "tokens": len(want),
                "same_tokens": all(x["ids"] == want for x in xs),
                "per_round_tps": [round(x["decode_tps"], 2) for x in xs],
            }
            if mode != "plain":
                row |= {k: round(statistics.median(x[k] for x in xs), 3) for k in ("acceptance", "tokens_per_step")}
                row["verify_steps"] = [x["verify_steps"] for x in xs]
            report["results"].append(row)
            acc = f"{row.get('acceptance', 0):7.2f}" if mode != "plain" else f"{'-':>7s}"
            tpc = f"{row.get('tokens_per_step', 1):8.2f}" if mode != "plain" else f"{'1':>8s}"
            print(f"{task:10s} {mode:7s} {tps:7.2f} {row['ratio']:8.3f} {acc} {tpc} {row['same_tokens']!s:>5s}")
    if llama:
        print(f"llama.cpp on {args.gguf.name} (fresh processes, greedy, the same prompt text):")
        report["llama_cpp"] = {"gguf": str(args.gguf), "rows": []}
        for task in tasks:
            base = statistics.median(x["decode_tps"] for x in llama[(task, "plain")])
            ours = statistics.median(x["decode_tps"] for x in runs[(task, "plain")])
            for mode in [m for (t, m) in llama if t == task]:
                xs = llama[(task, mode)]
                tps = statistics.median(x["decode_tps"] for x in xs)
                acc = [x["acceptance"] for x in xs if x.get("acceptance") is not None]
                row = {"task": task, "mode": mode, "decode_tps": round(tps, 2), "ratio": round(tps / base, 3),
                       "acceptance": round(statistics.median(acc), 3) if acc else None,
                       "per_round_tps": [round(x["decode_tps"], 2) for x in xs]}  # fmt: skip
                report["llama_cpp"]["rows"].append(row)
                a = f"{row['acceptance']:7.2f}" if acc else f"{'-':>7s}"
                print(f"{task:10s} {mode:11s} {tps:7.2f} {row['ratio']:8.3f} {a}")
            print(f"{task:10s} ours plain / llama.cpp plain decode: {ours / base:.3f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
