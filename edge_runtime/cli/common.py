"""What every command shares: one-line errors instead of tracebacks (DESIGN.md §9), and `--debug`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from edge_runtime.errors import EdgeRuntimeError

debug_option = click.option("--debug", is_flag=True, help="Show the full traceback on errors.")


def friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn an EdgeRuntimeError into `error: <message>` and exit code 1; `--debug` re-raises."""

    @functools.wraps(fn)
    def wrapper(*args: Any, debug: bool = False, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EdgeRuntimeError as e:
            if debug:
                raise
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            raise SystemExit(130) from None

    return wrapper
