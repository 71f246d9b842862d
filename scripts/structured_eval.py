"""Structured output on a real instruct model: 50 robot-command prompts, free vs constrained.

    .venv/bin/python scripts/structured_eval.py /tmp/real-int4 [--n 50] [--json out.json]

For each prompt the model is asked (system prompt: the schema) for one JSON robot command, greedy, twice: free,
and constrained by response_format json_schema. Reports how many outputs parse and validate (jsonschema), strictly
(the whole reply is the JSON) and leniently (the first {...} in the reply), and the speed side by side: decode
tokens/s of each, the mask's cost per sampled token (llguidance's mask + applying it, timed around the
processor), the share of tokens fed by fast-forward, and one plain decode step's time for scale.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import jsonschema

from edge_runtime import constrain
from edge_runtime.bench.environment import cpu_model
from edge_runtime.engine import load
from edge_runtime.generate import GenerationConfig, generate
from edge_runtime.tokenizer import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"enum": ["move_to", "pick", "place", "rotate", "stop"]},
        "target": {
            "type": "object",
            "properties": {
                "x": {"type": "number", "minimum": -5, "maximum": 5},
                "y": {"type": "number", "minimum": -5, "maximum": 5},
            },
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        "speed": {"type": "integer", "minimum": 1, "maximum": 10},
        "gripper": {
            "type": "object",
            "properties": {"open": {"type": "boolean"}},
            "required": ["open"],
            "additionalProperties": False,
        },
        "waypoints": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            },
            "maxItems": 3,
        },
    },
    "required": ["action", "target", "speed", "gripper", "waypoints"],
    "additionalProperties": False,
}

SYSTEM = (
    "You control a robot arm. Reply with one JSON object only, no prose, matching this JSON schema:\n"
    + json.dumps(SCHEMA)
)

OBJECTS = ["red cube", "blue ball", "cup", "screwdriver", "green box", "bottle", "sponge", "bolt", "tray", "pen"]
TASKS = [
    "Move to x={x}, y={y} at speed {s}.",
    "Pick up the {o} at ({x}, {y}), speed {s}, gripper open.",
    "Place the {o} at x {x} y {y}; go slowly (speed {s}).",
    "Rotate towards ({x}, {y}) at speed {s} with the gripper closed.",
    "Stop at {x}, {y}. Speed {s}. Pass through waypoint ({y}, {x}) first.",
]


def prompts(n: int) -> list[str]:
    out = []
    for i in range(n):
        x, y = round(((i * 37) % 90) / 10 - 4.5, 1), round(((i * 53) % 80) / 10 - 4.0, 1)
        out.append(TASKS[i % len(TASKS)].format(x=x, y=y, s=1 + i % 10, o=OBJECTS[i % len(OBJECTS)]))
    return out


def valid(text: str, lenient: bool) -> bool:
    if lenient:  # the first {...} anywhere in the reply (a code fence, a sentence around it)
        m = re.search(r"\{.*\}", text, re.S)
        text = m.group(0) if m else ""
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True



class Timed:
    """Wraps constrain.Constraint's two entry points to time them (the processor's cost per token)."""

    def __init__(self) -> None:
        self.mask_s = 0.0
        self.masks = 0
        self.ff_s = 0.0
        self.forced = 0
        call, ff = constrain.Constraint.__call__, constrain.Constraint.forced_tokens

        def timed_call(c, reply, logits):
            t = time.perf_counter()
            out = call(c, reply, logits)
            self.mask_s += time.perf_counter() - t
            self.masks += 1
            return out

        def timed_ff(c, reply):
            t = time.perf_counter()
            out = ff(c, reply)
            self.ff_s += time.perf_counter() - t
            self.forced += len(out)
            return out

        constrain.Constraint.__call__ = timed_call  # type: ignore[method-assign]
        constrain.Constraint.forced_tokens = timed_ff  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None, help="Also write the figures and every output here.")
    args = ap.parse_args()
    from edge_runtime.engine import LoadOptions

    engine = load(args.bundle, LoadOptions(threads=args.threads))
    tok = Tokenizer.for_engine(engine)
    config = GenerationConfig(max_tokens=args.max_tokens)
    rf = {"type": "json_schema", "json_schema": {"name": "robot_command", "schema": SCHEMA, "strict": True}}
    t0 = time.perf_counter()
    constrain.Constraint.for_engine(engine, constrain.from_response_format(rf) or constrain.json_object())
    setup_s = time.perf_counter() - t0  # first use: llguidance's tokenizer (cached after) + the grammar
    timer = Timed()
    rows = []
    free_tok = free_s = con_tok = con_s = 0.0
    for p in prompts(args.n):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}]
        free = generate(engine, tok, messages=messages, config=config)
        con = generate(engine, tok, messages=messages, config=config, response_format=rf)
        for r, kind in ((free, "free"), (con, "constrained")):
            n = r.stats.generated_tokens - 1
            if kind == "free":
                free_tok, free_s = free_tok + n, free_s + r.stats.decode_s
            else:
                con_tok, con_s = con_tok + n, con_s + r.stats.decode_s
        rows.append({"prompt": p, "free": free.text, "constrained": con.text, "con_finish": con.stats.finish_reason})
    # One plain decode step for scale: the median of 64 after a short prefill.
    engine.reset()
    engine.prefill(tok.encode("Hello", add_special_tokens=False))
    steps = []
    for i in range(64):
        t = time.perf_counter()
        engine.decode(100 + i)
        steps.append(time.perf_counter() - t)
    step_s = sorted(steps)[len(steps) // 2]
    n = len(rows)
    sampled = timer.masks
    report = {
        "bundle": str(args.bundle),
        "cpu": cpu_model(),
        "prompts": n,
        "free_valid": sum(valid(r["free"], False) for r in rows),
        "free_valid_lenient": sum(valid(r["free"], True) for r in rows),
        "constrained_valid": sum(valid(r["constrained"], False) for r in rows),
        "free_decode_tokens_per_s": round(free_tok / free_s, 2) if free_s else 0.0,
        "constrained_decode_tokens_per_s": round(con_tok / con_s, 2) if con_s else 0.0,
        "mask_us_per_sampled_token": round(timer.mask_s / max(sampled, 1) * 1e6, 1),
        "fast_forward_us_per_sampled_token": round(timer.ff_s / max(sampled, 1) * 1e6, 1),
        "sampled_tokens": sampled,
        "forced_tokens": timer.forced,
        "forced_share": round(timer.forced / max(sampled + timer.forced, 1), 3),
        "decode_step_us": round(step_s * 1e6, 1),
        "constraint_setup_s": round(setup_s, 3),
    }
    report["mask_share_of_decode_step"] = round(
        (report["mask_us_per_sampled_token"] + report["fast_forward_us_per_sampled_token"]) / report["decode_step_us"],
        4,
    )
    for k, v in report.items():
        print(f"{k:36s} {v}")
    bad = [r for r in rows if not valid(r["constrained"], False)]
    for r in bad[:5]:
        print("INVALID constrained:", r["prompt"], "->", repr(r["constrained"][:200]), r["con_finish"])
    print("example free       :", repr(rows[0]["free"][:200]))
    print("example constrained:", repr(rows[0]["constrained"][:200]))
    if args.json:
        args.json.write_text(json.dumps({"report": report, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
