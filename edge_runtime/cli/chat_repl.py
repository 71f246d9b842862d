"""`edge-run --chat`: a conversation through the bundle's chat template, kept in one StreamingLLM ring.

At a terminal it prompts with `> ` (Ctrl-D leaves, Ctrl-C cuts a reply short); from a pipe it reads one user
message per line and, with `--json`, prints one JSON object per turn. Each turn renders the whole conversation,
encodes only the text from the last special token on (conversation.py), and the session (session.py) feeds only
what its ring does not already hold: TTFT stays flat as the conversation grows, and past the ring's capacity
the oldest turns are evicted as StreamingLLM does (sinks kept).
`/save FILE` writes the session snapshot to FILE and the messages beside it (FILE.messages.json); `/load FILE`
puts both back.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edge_runtime.atomic_write import output_target, write_file
from edge_runtime.bounded_read import read_text_bounded
from edge_runtime.errors import EdgeRuntimeError, SnapshotError

from .prompt_input import check_utf8

# edge-run imports this module with its options; what a conversation runs on (numpy, onnxruntime, jinja2,
# tokenizers) loads when one starts, so `edge-run --help` and one-shot replies do not wait for it.
if TYPE_CHECKING:
    from edge_runtime.constrain import Grammar  # llguidance loads only where a constraint is given
    from edge_runtime.generate import GenerationConfig
    from edge_runtime.session import Session
    from edge_runtime.tokenizer import Tokenizer

PROMPT = "> "
COMMANDS = {
    "/reset": "start a new conversation",
    "/save FILE": "save the conversation (ring snapshot + messages)",
    "/load FILE": "restore a saved conversation",
    "/help": "list the commands",
}


@dataclass(frozen=True)
class ChatOptions:
    system: str | None = None
    as_json: bool = False
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # --chat-template-kwargs
    grammar: Grammar | None = None  # --json-schema/--regex/--grammar/--choice: every reply obeys it
    max_tokens_given: bool = False  # --max-tokens was set: a reply it cuts says so


def _lines(interactive: bool) -> Iterator[str]:
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        armed = False  # a Ctrl-C at the prompt clears the line; a second one in a row leaves
        while True:
            try:
                line = input(PROMPT)
            except EOFError:
                click.echo()
                return
            except KeyboardInterrupt:
                click.echo()
                if armed:
                    return
                click.echo("(Ctrl-C again or Ctrl-D leaves)", err=True)
                armed = True
                continue
            armed = False
            yield line
    stream = getattr(sys.stdin, "buffer", sys.stdin)
    for number, raw in enumerate(stream, start=1):
        line = raw.decode("utf-8", errors="surrogateescape") if isinstance(raw, bytes) else raw
        yield check_utf8(line.rstrip("\r\n"), f"stdin line {number}")


def run(engine: Any, tok: Tokenizer, config: GenerationConfig, opts: ChatOptions) -> None:
    from edge_runtime.chat import ChatTemplate
    from edge_runtime.conversation import ConversationEncoder
    from edge_runtime.generate import FinishReason
    from edge_runtime.session import RingOverflowWarning, Session

    # The conversation's templates read the time it began (ChatTemplate.at): a date in the system header
    # would otherwise change at midnight and make the whole conversation new to the ring.
    template = ChatTemplate.for_bundle(engine.bundle).with_variables(opts.template_kwargs).at(datetime.now())
    session = Session(engine)
    interactive = sys.stdin.isatty() and not opts.as_json
    head = [] if opts.system is None else [{"role": "system", "content": opts.system}]
    history: list[dict[str, str]] = []
    encoder = ConversationEncoder(tok)
    if interactive:
        click.echo("chat: Ctrl-D leaves, Ctrl-C cuts a reply short, /help lists the commands", err=True)
    for line in _lines(interactive):
        command, _, arg = line.strip().partition(" ")
        if not command:
            continue
        if command.startswith("/") and command not in _NAMES and not arg:  # "/path is ..." stays a message
            _notice(f"unknown command {command!r}; /help lists them (a message starting with / needs a space)", opts)
            continue
        if command in _NAMES:
            try:
                began = _command(command, arg.strip(), session, history, template.clock, opts)
            except (EdgeRuntimeError, OSError) as e:  # a failed /save or /load costs the command, not the chat
                _notice(f"{command} failed: {_reason(e)}", opts)
                continue
            if began is not None:
                template = template.at(began)
            continue
        history.append({"role": "user", "content": line})
        text = template.render([*head, *history], add_generation_prompt=True)
        conversation = encoder.encode(text)  # re-encodes from the last special token: time ~ the turn
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RingOverflowWarning)
            reply, stats, stopped, cached = _turn(
                session, tok, conversation, config, opts.grammar, echo=not opts.as_json
            )
        for w in caught:  # a turn longer than the window: StreamingLLM keeps going, the user is told in one line
            _notice(str(w.message), opts)
        # What was shown is the reply: the next turn's session.match rolls the ring back to exactly that
        # (a Ctrl-C may land after tokens were fed that the user never saw).
        history.append({"role": "assistant", "content": reply})
        if stopped and not opts.as_json:
            _notice("reply stopped; the conversation keeps what was shown", opts)
        elif not opts.as_json and stats is not None and stats.finish_reason is FinishReason.LENGTH:  # JSON: in stats
            why = "--max-tokens" if opts.max_tokens_given else "the default limit; --max-tokens N sets it"
            _notice(f"reply cut at {stats.generated_tokens} tokens by {why}", opts)
        if opts.as_json:
            turn_stats = {**(stats.to_dict() if stats else {}), "cached_tokens": cached}
            info = {"held": session.held, "evicted": session.evicted, "position": session.position}
            click.echo(json.dumps({"text": reply, "turn": len(history) // 2, "stats": turn_stats, "session": info}))
            if stopped:
                raise KeyboardInterrupt  # a script's Ctrl-C ends it (exit 130), after its partial turn is printed


_NAMES = {c.split()[0] for c in COMMANDS}


def _command(
    command: str,
    arg: str,
    session: Session,
    history: list[dict[str, str]],
    began: datetime | None,
    opts: ChatOptions,
) -> datetime | None:
    """Run a /command; returns when the conversation now in the session began, where that changed."""
    if command == "/help":
        _notice("; ".join(f"{k}: {v}" for k, v in COMMANDS.items()), opts)
    elif command == "/reset":
        session.reset()
        history.clear()
        _notice("conversation reset", opts)
        return datetime.now()
    elif not arg:
        _notice(f"{command} needs a file name", opts)
    elif command == "/save":
        path = Path(arg)
        _, through = output_target(path)  # a directory, block device or socket: refused before any write
        session.save(path)
        saved = {"messages": history, "began": None if began is None else began.isoformat()}
        if through:  # a device or FIFO: no messages file beside it (/load could not pair one anyway)
            _notice(f"saved {session.length} tokens to {path} (no messages file beside a device)", opts)
        else:
            write_file(_sidecar(path), [json.dumps(saved).encode("utf-8")])
            _notice(f"saved {len(history)} messages, {session.length} tokens to {path}", opts)
    elif command == "/load":
        path = Path(arg)
        messages, when = _read_sidecar(_sidecar(path))
        session.load(path)  # checks bundle and geometry first; nothing changes on failure
        history[:] = messages
        _notice(f"loaded {len(history)} messages, {session.length} tokens from {path}", opts)
        return when or datetime.now()
    return None


# A messages file larger than this is not one /save wrote for a conversation this runtime can hold: refused
# before it is read (a symlink to a huge file would otherwise be read whole, twice over as JSON).
MAX_MESSAGES_BYTES = 64 << 20


def _read_sidecar(path: Path) -> tuple[list[dict[str, str]], datetime | None]:
    """(messages, when the conversation began) saved by /save; a bare list is an older file without the time."""
    try:
        saved = json.loads(read_text_bounded(path, MAX_MESSAGES_BYTES, "the messages file", SnapshotError))
        if isinstance(saved, list):
            messages, when = saved, None
        else:
            messages, began = saved["messages"], saved.get("began")
            when = None if began is None else datetime.fromisoformat(began)
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
        raise SnapshotError(f"cannot read the messages saved in '{path}': {why:.200}") from e
    if not isinstance(messages, list):
        raise SnapshotError(f"'{path}' does not hold a list of messages")
    for i, m in enumerate(messages):  # what /save writes: the template must not be the first to see a bad one
        if not (isinstance(m, dict) and set(m) == {"role", "content"} and isinstance(m["content"], str)):
            raise SnapshotError(f'\'{path}\': message {i} is not {{"role": ..., "content": "..."}}: {m!r:.60}')
        if m["role"] not in ("user", "assistant"):
            raise SnapshotError(f"'{path}': message {i} has role {m['role']!r:.40}; a chat saves user and assistant")
        check_utf8(m["content"], f"'{path}': message {i}")  # a JSON \ud800 escape: no tokenizer takes it
    return messages, when


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".messages.json")


def _turn(
    session: Session,
    tok: Tokenizer,
    conversation: list[int],
    config: GenerationConfig,
    grammar: Grammar | None,
    *,
    echo: bool,
) -> tuple[str, Any, bool, int]:
    """Reply to the conversation: (the text shown, the stats, whether Ctrl-C stopped it, the tokens reused from
    the ring). The session stays consistent wherever the Ctrl-C lands (session.py's sections), so the next
    turn simply goes on."""
    from edge_runtime.generate import GenerationCancelled, close_cancelled, stream_generate

    parts: list[str] = []
    stats = None
    stream = None
    rest = conversation
    try:
        rest = session.match(conversation)
        stream = stream_generate(session, tok, rest, config, grammar=grammar)
        for ev in stream:
            parts.append(ev.text)
            stats = ev.stats or stats
            if echo:
                click.echo(ev.text, nl=False)
                sys.stdout.flush()
    except KeyboardInterrupt as e:  # the reply is cut short; what was shown stays in the conversation
        closed = e if isinstance(e, GenerationCancelled) else None
        if closed is None and stream is not None:
            closed = close_cancelled(stream)
        if closed is not None:
            parts.append(closed.final.text)  # text held back for a possible stop string
            stats = closed.final.stats
            if echo:
                click.echo(closed.final.text, nl=False)
        if echo:
            click.echo()
        return "".join(parts), stats, True, len(conversation) - len(rest)
    if echo:
        click.echo()
    return "".join(parts), stats, False, len(conversation) - len(rest)


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: '{e.filename}'" if e.filename else e.strerror
    return str(e)


def _notice(text: str, opts: ChatOptions) -> None:
    if opts.as_json:
        click.echo(json.dumps({"notice": text}))
    else:
        click.echo(f"({text})", err=True)
