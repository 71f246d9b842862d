"""What every command shares: one-line errors instead of tracebacks (docs/architecture.md §10), and `--debug`."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from edge_runtime.errors import EdgeRuntimeError

debug_option = click.option("--debug", is_flag=True, help="Show the full traceback on errors.")
verbose_option = click.option("--verbose", "-v", is_flag=True, help="Say how the target profile was chosen.")


class TemplateVariables(click.ParamType):
    """--chat-template-kwargs: a JSON object of chat template variables (edge_runtime.chat.template_variables)."""

    name = "JSON"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> dict[str, Any]:
        if isinstance(value, dict):
            return value
        try:
            variables = json.loads(value)
        except json.JSONDecodeError as e:
            self.fail(f"not JSON ({e.msg} at character {e.pos}): {value!r:.60}", param, ctx)
        if variables == {}:  # the default: nothing to check, and no jinja2 import for a raw prompt
            return {}
        from edge_runtime.chat import template_variables
        from edge_runtime.errors import ChatTemplateError

        try:
            return template_variables(variables, "the value")
        except ChatTemplateError as e:
            self.fail(str(e), param, ctx)


template_kwargs_option = click.option(
    "--chat-template-kwargs",
    "template_kwargs",
    type=TemplateVariables(),
    default="{}",
    help="Chat template variables, a JSON object: '{\"enable_thinking\": false}' makes Qwen3 and SmolLM3 answer "
    "without a thinking block.",
)


def speculative_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--speculative lookup | --draft BUNDLE [--draft-tokens K], as edge-run, edge-bench and edge-serve take
    them (speculative.from_options checks them against the loaded bundle)."""
    k_help = "Proposals per step [default: 8 lookup, 4 draft]."
    fn = click.option("--draft-tokens", type=int, default=None, help=k_help)(fn)
    draft_help = "Speculative decoding with this draft bundle."
    fn = click.option("--draft", type=click.Path(path_type=Path), help=draft_help)(fn)
    return click.option(
        "--speculative",
        type=click.Choice(["lookup"]),
        default=None,
        help="Speculative decoding by prompt lookup (n-grams of the context): same tokens, faster on replies that "
        "re-emit their context.",
    )(fn)


def model_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--model and --target, as edge-run, edge-bench and edge-serve take them (edge_runtime/first_use.py)."""
    fn = click.option(
        "--target",
        default="auto",
        show_default=True,
        help="Target profile name, YAML path, or 'auto': the bundle's own target, else this machine's.",
    )(fn)
    return click.option(
        "--model",
        default=None,
        help="A Hugging Face checkpoint directory, a .gguf file, or a bundled model's name (demo); exported for "
        "this machine's target on first use into the cache (see edge-cache).",
    )(fn)


def _one_line_warning(message: Warning | str, category: type[Warning], *_args: Any, **_kwargs: Any) -> str:
    return f"warning: {message}\n"


def friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn an EdgeRuntimeError into `error: <message>` and exit code 1; `--debug` re-raises."""

    @functools.wraps(fn)
    def wrapper(*args: Any, debug: bool = False, **kwargs: Any) -> Any:
        try:
            with _one_line_warnings():
                return fn(*args, **kwargs)
        except EdgeRuntimeError as e:
            if debug:
                raise
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            raise SystemExit(130) from None
        except BrokenPipeError:  # the reader went away (`edge-run | head -1`): nobody left to tell
            _drop_stdout()
            raise SystemExit(141) from None  # 128 + SIGPIPE, what a shell reports for a writer the pipe killed
        except OSError as e:  # disk full, read-only file system, device busy, ...: the OS's reason, one line
            if debug:
                raise
            raise click.ClickException(os_message(e)) from None

    return wrapper


def require_stdout() -> None:
    """Refuse to run with standard output closed (`cmd >&-`): Python then has no sys.stdout, click.echo
    drops every write without a word, and the command would exit 0 with its output lost."""
    if sys.stdout is None:
        raise EdgeRuntimeError(
            "standard output is closed, so the output would be lost; redirect it (to a file, or to /dev/null)"
        )


def os_message(e: OSError) -> str:
    """`No space left on device: 'out/model.onnx.data'`: the OS's reason and the path it concerns."""
    where = f": '{e.filename}'" if e.filename else ""
    return f"{e.strerror or e}{where}"


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail on the broken pipe again."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):
        pass


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """While a command runs, a library warning prints as one line, like its errors (not file:line plus a
    source line)."""
    saved = warnings.formatwarning
    warnings.formatwarning = _one_line_warning  # type: ignore[assignment]
    try:
        yield
    finally:
        warnings.formatwarning = saved


def check_writable(path: Path, flag: str) -> None:
    """Refuse an output the run could not write, before the run: found afterwards, the results are lost.

    Probed by creating (and removing) a file beside the file to be written (beside the file a symlink
    names), which catches what permission bits do not tell (read-only mounts, a full disk's inodes, root's
    bypassing of the bits); an existing file is opened for appending, which changes nothing in it. A
    device or FIFO (/dev/null, /dev/stdout) is written through, so nothing is created beside it and only
    its permission is checked: opening a FIFO here would wait for a reader, or end the one it has.
    """
    import errno
    import os
    import tempfile

    from edge_runtime.atomic_write import output_target
    from edge_runtime.errors import EdgeRuntimeError, OutputError

    parent = path.parent
    if not parent.is_dir():
        raise EdgeRuntimeError(f"cannot write {flag} '{path}': directory '{parent}' does not exist; create it first")
    if path.is_dir():
        raise EdgeRuntimeError(f"cannot write {flag} '{path}': it is a directory; give a file name")
    try:
        target, through = output_target(path)
        if through:
            if not os.access(path, os.W_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return
        if target.exists():
            os.close(os.open(target, os.O_WRONLY | os.O_APPEND))
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.probe-", dir=target.parent)
        os.close(fd)
        os.unlink(probe)
    except OutputError as e:
        raise EdgeRuntimeError(f"{flag}: {e}; nothing was run") from None
    except OSError as e:
        raise EdgeRuntimeError(f"cannot write {flag} '{path}': {os_message(e)}; nothing was run") from e
