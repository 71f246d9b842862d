"""`edge-run --chat`: a conversation through the bundle's chat template, one user turn at a time.

At a terminal it prompts with `> ` (Ctrl-D leaves, Ctrl-C cuts a reply short, `/reset` starts over); from a pipe it
reads one user message per line and, with `--json`, prints one JSON object per turn. Each turn renders the whole
conversation and generates the reply; the reply joins the conversation as the assistant's message.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import click

from edge_runtime.chat import ChatTemplate
from edge_runtime.generate import GenerationConfig, stream_generate
from edge_runtime.tokenizer import Tokenizer

from .prompt_input import check_utf8

PROMPT = "> "
COMMANDS = {"/reset": "start a new conversation", "/help": "list the commands"}


@dataclass(frozen=True)
class ChatOptions:
    system: str | None = None
    as_json: bool = False


def _lines(interactive: bool) -> Iterator[str]:
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        while True:
            try:
                yield input(PROMPT)
            except EOFError:
                click.echo()
                return
    stream = getattr(sys.stdin, "buffer", sys.stdin)
    for number, raw in enumerate(stream, start=1):
        line = raw.decode("utf-8", errors="surrogateescape") if isinstance(raw, bytes) else raw
        yield check_utf8(line.rstrip("\r\n"), f"stdin line {number}")


def run(engine: Any, tok: Tokenizer, config: GenerationConfig, opts: ChatOptions) -> None:
    template = ChatTemplate.for_bundle(engine.bundle)
    interactive = sys.stdin.isatty() and not opts.as_json
    head = [] if opts.system is None else [{"role": "system", "content": opts.system}]
    history: list[dict[str, str]] = []
    if interactive:
        click.echo("chat: Ctrl-D leaves, Ctrl-C cuts a reply short, /help lists the commands", err=True)
    for line in _lines(interactive):
        if not line.strip():
            continue
        command = line.strip()
        if command == "/reset":
            history.clear()
            _notice("conversation reset", opts)
            continue
        if command == "/help":
            _notice("; ".join(f"{k}: {v}" for k, v in COMMANDS.items()), opts)
            continue
        if command.startswith("/") and command.split()[0] not in COMMANDS and " " not in command:
            _notice(f"unknown command {command!r}; /help lists them (a message starting with / needs a space)", opts)
            continue
        history.append({"role": "user", "content": line})
        ids = tok.encode(template.render([*head, *history], add_generation_prompt=True), add_special_tokens=False)
        reply, stats = _turn(engine, tok, ids, config, echo=not opts.as_json)
        history.append({"role": "assistant", "content": reply})
        if opts.as_json:
            turn_stats = {**(stats.to_dict() if stats else {}), "prompt_tokens": len(ids), "cached_tokens": 0}
            click.echo(json.dumps({"text": reply, "turn": len(history) // 2, "stats": turn_stats}))


def _turn(engine: Any, tok: Tokenizer, ids: list[int], config: GenerationConfig, *, echo: bool) -> tuple[str, Any]:
    parts: list[str] = []
    stats = None
    stream = stream_generate(engine, tok, ids, config)
    try:
        for ev in stream:
            parts.append(ev.text)
            stats = ev.stats or stats
            if echo:
                click.echo(ev.text, nl=False)
                sys.stdout.flush()
    except KeyboardInterrupt:  # the reply is cut short; what was said stays in the conversation
        stream.close()
        if not echo:
            raise
    if echo:
        click.echo()
    return "".join(parts), stats


def _notice(text: str, opts: ChatOptions) -> None:
    if opts.as_json:
        click.echo(json.dumps({"notice": text}))
    else:
        click.echo(f"({text})", err=True)
