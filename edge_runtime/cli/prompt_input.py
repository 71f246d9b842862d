"""Where `edge-run`'s input comes from: `--prompt` / `--prompt-file` / piped stdin (raw text), or `--message`
(one user turn through the chat template). Every way in is checked for UTF-8 and size before any model loads."""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from edge_runtime.errors import EdgeRuntimeError

# A prompt larger than this is a mistake (a binary file, /dev/zero), not a prompt: 16 MiB is ~4M tokens.
MAX_PROMPT_BYTES = 16 << 20
STDIN = "-"


@dataclass(frozen=True)
class PromptInput:
    """Raw completion text, or one user message (with an optional system message) for the chat template."""

    text: str | None = None
    message: str | None = None
    system: str | None = None

    @property
    def is_chat(self) -> bool:
        return self.message is not None

    def messages(self) -> list[dict[str, str]]:
        head = [] if self.system is None else [{"role": "system", "content": self.system}]
        return [*head, {"role": "user", "content": self.message or ""}]


def check_utf8(text: str, what: str) -> str:
    """Arguments arrive with undecodable bytes as lone surrogates (PEP 383); tokenizers cannot take them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise EdgeRuntimeError(f"{what} is not valid UTF-8 (byte {e.start}); pass text, or a UTF-8 file") from None
    return text


def _decode(data: bytes, what: str) -> str:
    if len(data) > MAX_PROMPT_BYTES:
        raise EdgeRuntimeError(f"{what} is larger than {MAX_PROMPT_BYTES >> 20} MiB; not a prompt")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EdgeRuntimeError(f"{what} is not valid UTF-8 (byte {e.start}); pass text, or a UTF-8 file") from None


def read_stream(stream: BinaryIO, what: str) -> str:
    return _decode(stream.read(MAX_PROMPT_BYTES + 1), what)


def read_file(path: Path, what: str) -> str:
    try:
        with path.open("rb") as f:
            return read_stream(f, what)
    except OSError as e:
        raise EdgeRuntimeError(f"cannot read {what} '{path}': {e.strerror or e}") from None


def stdin_is_piped() -> bool:
    """A pipe or a redirected file: `echo hi | edge-run`, `edge-run < prompt.txt`. Not a terminal, not /dev/null
    (a character device: systemd's default stdin), not a socket a supervisor left open, which would block."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (AttributeError, ValueError, OSError):  # closed or replaced stdin (pytest, CliRunner)
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def _stdin_bytes() -> BinaryIO:
    return getattr(sys.stdin, "buffer", sys.stdin)


def resolve(
    prompt: str | None, prompt_file: Path | None, message: str | None, system: str | None, default: str
) -> PromptInput:
    """One input, from the options given; with none, piped stdin is the prompt, else `default`."""
    options = (("--prompt", prompt), ("--prompt-file", prompt_file), ("--message", message))
    given = [name for name, value in options if value is not None]
    if len(given) > 1:
        raise EdgeRuntimeError(f"give one of --prompt, --prompt-file and --message, not {' and '.join(given)}")
    if system is not None and message is None:
        raise EdgeRuntimeError("--system goes with --message (or --chat): a raw --prompt has no roles")
    if system is not None:
        system = check_utf8(system, "--system")
    if message is not None:
        text = read_stream(_stdin_bytes(), "stdin") if message == STDIN else check_utf8(message, "--message")
        return PromptInput(message=text, system=system)
    if prompt_file is not None:
        return PromptInput(text=read_file(prompt_file, "--prompt-file"))
    if prompt == STDIN:
        return PromptInput(text=read_stream(_stdin_bytes(), "stdin"))
    if prompt is not None:
        return PromptInput(text=check_utf8(prompt, "--prompt"))
    if stdin_is_piped():
        text = read_stream(_stdin_bytes(), "stdin")
        if text:
            return PromptInput(text=text)
    return PromptInput(text=default)
