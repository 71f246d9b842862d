"""Sessions on a real bundle: TTFT and RSS over a long scripted conversation, and the prompt cache's TTFT.

    python scripts/session_turns.py BUNDLE --turns 200 --report 1,10,50,100,200
    python scripts/session_turns.py BUNDLE --turns 0 --cache-rounds 5     # prompt cache only

Part 1 drives `edge-run --chat`'s path (chat template -> Session.match -> stream_generate on the session): each
turn renders the whole conversation and the session feeds only what its ring does not hold. Printed per reported
turn: TTFT, tokens fed, tokens reused, tokens held and evicted, the process's current RSS.
Part 2 compares a request whose ~300-token system prompt is restored from a snapshot with the same request
prefilled from scratch, alternating the two in each round; TTFT includes the restore.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from edge_runtime.bench.environment import cpu_model
from edge_runtime.chat import ChatTemplate
from edge_runtime.engine import LoadOptions, load
from edge_runtime.generate import GenerationConfig, stream_generate
from edge_runtime.session import Session
from edge_runtime.tokenizer import Tokenizer

QUESTIONS = [
    "What should I do if the floor is wet?",
    "Move to the kitchen and tell me what you see.",
    "How far is the charging dock?",
    "Summarise what we have done so far in one sentence.",
    "Is it safe to pick up a glass cup?",
    "What is the capital of France?",
    "Name three things a robot should never do.",
    "Count from one to five.",
]
SYSTEM = (
    "You are the voice of a home assistant robot. You can move between rooms, pick up light objects, open doors "
    "and report what your cameras see. Always answer briefly and politely. Never touch knives, stoves, pets or "
    "medicine. If a request is unsafe, refuse and explain why in one sentence. When asked to move, confirm the "
    "destination first. Rooms: kitchen, living room, hallway, bedroom, bathroom, garage. The charging dock is in "
    "the hallway. Battery below 15 percent means you must return to the dock. Objects you may carry weigh under "
    "one kilogram. Report obstacles, wet floors, open doors and people you see. Use metric units. Do not invent "
    "objects that you cannot see. If you are unsure, say so. Keep a list of the tasks you were given today and "
    "report it when asked. Speak English unless the user speaks another language, then answer in that language. "
    "You were built in 2026 and your name is Rolo. You cannot browse the web or make purchases. "
    "Tools: move_to(room), pick_up(object), put_down(place), open_door(name), report(). Call at most one tool per "
    "answer, and only after the user has confirmed. When two requests conflict, the safer one wins. Quiet hours "
    "are from ten at night to seven in the morning: speak softly then and do not vacuum. Never enter the bathroom "
    "while it is occupied. If a person falls or asks for help, stop every task and call the emergency contact. "
)


def rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096 / 2**20



def first_token_ms(session: Session, tok: Tokenizer, ids: list[int], config: GenerationConfig) -> tuple[float, str]:
    parts, ttft = [], 0.0
    for ev in stream_generate(session, tok, ids, config):
        parts.append(ev.text)
        if ev.stats is not None:
            ttft = ev.stats.ttft_s * 1e3
    return ttft, "".join(parts)


def turns(bundle: Path, n: int, report: set[int], max_tokens: int, threads: int) -> None:
    engine = load(bundle, LoadOptions(threads=threads))
    tok, template = Tokenizer.for_engine(engine), ChatTemplate.for_bundle(engine.bundle)
    session, history = Session(engine), []
    config = GenerationConfig(max_tokens=max_tokens)
    g = engine.geometry
    print(f"bundle {bundle}, cache {g.sinks}+{g.window} (slack {g.slack}), {max_tokens} tokens max per reply")
    print("| turn | TTFT ms | fed | reused | held | evicted | RSS MB |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    resets = 0
    t0 = time.perf_counter()
    for turn in range(1, n + 1):
        history.append({"role": "user", "content": QUESTIONS[(turn - 1) % len(QUESTIONS)]})
        ids = tok.encode(template.render(history, add_generation_prompt=True), add_special_tokens=False)
        rest = session.match(ids)
        resets += turn > 1 and len(rest) == len(ids)
        ttft, reply = first_token_ms(session, tok, rest, config)
        history.append({"role": "assistant", "content": reply})
        if turn in report:
            print(f"| {turn} | {ttft:.1f} | {len(rest)} | {len(ids) - len(rest)} | {session.held} | {session.evicted} "
                  f"| {rss_mb():.1f} |")  # fmt: skip
    took = time.perf_counter() - t0
    print(f"{n} turns in {took:.0f} s; {session.position} tokens in all; full re-prefills: {resets}")


def prompt_cache(bundle: Path, rounds: int, threads: int) -> None:
    engine = load(bundle, LoadOptions(threads=threads))
    tok, template = Tokenizer.for_engine(engine), ChatTemplate.for_bundle(engine.bundle)
    system = [{"role": "system", "content": SYSTEM}]
    prefix = tok.encode(template.render(system, add_generation_prompt=False), add_special_tokens=False)
    session = Session(engine)
    session.prefill(prefix)
    snap = session.snapshot()
    config = GenerationConfig(max_tokens=1)
    cold, warm = [], []
    for r in range(rounds):
        messages = [*system, {"role": "user", "content": QUESTIONS[r % len(QUESTIONS)]}]
        ids = tok.encode(template.render(messages, add_generation_prompt=True), add_special_tokens=False)
        assert ids[: len(prefix)] == prefix, "the template does not render the system turn as a prefix"
        for order in ((0, 1) if r % 2 == 0 else (1, 0)):
            session.reset()
            if order == 0:
                cold.append(first_token_ms(session, tok, ids, config)[0])
            else:
                t = time.perf_counter()
                session.restore(snap)
                rest = session.match(ids)
                restore_ms = (time.perf_counter() - t) * 1e3
                warm.append(restore_ms + first_token_ms(session, tok, rest, config)[0])
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"prompt cache: {len(prefix)}-token system prompt + {len(ids) - len(prefix)}-token question, {rounds} rounds")
    print(f"  TTFT from scratch median {c:.1f} ms, restored median {w:.1f} ms: {c / w:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--report", default="1,10,50,100,200")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--cache-rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    print(f"CPU: {cpu_model()}, {a.threads} threads")
    if a.turns:
        turns(a.bundle, a.turns, {int(x) for x in a.report.split(",")}, a.max_tokens, a.threads)
    if a.cache_rounds:
        prompt_cache(a.bundle, a.cache_rounds, a.threads)


if __name__ == "__main__":
    main()
