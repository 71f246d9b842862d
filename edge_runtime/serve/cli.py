"""`edge-serve`: the OpenAI-compatible server (see the package docstring for the design).

edge-serve --bundle out/                       # 127.0.0.1:8080, target auto-detected
edge-serve --model CHECKPOINT --slots 4 --port 9000
edge-serve --bundle out/ --host 0.0.0.0 --api-key "$KEY"   # another address needs a key (or EDGE_SERVE_API_KEY)
edge-serve --bundle out/ --served-model-name gpt-4o-mini   # the name listed; any requested name is served
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from edge_runtime.cli.common import (
    debug_option,
    friendly_errors,
    model_options,
    speculative_options,
    template_kwargs_option,
)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


@click.command()
@click.option("--bundle", type=click.Path(path_type=Path), help="A bundle directory (from edge-export).")
@model_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless --api-key).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option(
    "--slots",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Conversations kept, one KV cache each (allocated at start); a request goes to the longest shared prefix.",
)
@click.option(
    "--parallel",
    type=click.IntRange(1, 64),
    default=None,
    help="Generations run at once, their decode steps batched into one model call (at most --slots) "
    "[default: the target's serve_parallel; 1 with --speculative].",
)
@click.option(
    "--queue",
    "queue_size",
    type=click.IntRange(1, 4096),
    default=8,
    show_default=True,
    help="Requests that may wait for the engine; beyond, 503 with Retry-After.",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1, 1 << 20),
    default=1024,
    show_default=True,
    help="Most tokens a request may generate (and the default when it names none).",
)
@click.option(
    "--api-key",
    envvar="EDGE_SERVE_API_KEY",
    default=None,
    help="Require 'Authorization: Bearer KEY' on /v1/* [env: EDGE_SERVE_API_KEY].",
)
@click.option(
    "--served-model-name",
    "--model-id",
    "model_id",
    metavar="NAME",
    default=None,
    help="The name /v1/models lists and responses carry [default: the bundle's directory name].",
)
@click.option(
    "--strict-model-name",
    is_flag=True,
    help="Refuse requests naming another model (404 model_not_found); by default any name gets this model.",
)
@click.option("--sinks", type=int, default=None, help="Attention sinks [default: target, then bundle].")
@click.option("--window", type=int, default=None, help="Recent-token window [default: target, then bundle].")
@click.option("--threads", type=int, default=None, help="Compute threads [default: target, then all cores].")
@click.option(
    "--energy/--no-energy",
    default=True,
    show_default=True,
    help="Sample the target's power meter during each generation (energy metrics).",
)
@click.option(
    "--shutdown-timeout",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds SIGTERM waits for requests in flight before cancelling them.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Server log to stderr; info and below include one access line per request.",
)
@speculative_options
@template_kwargs_option
@debug_option
@friendly_errors
def main(
    bundle: Path | None,
    model: str | None,
    target: str,
    host: str,
    port: int,
    slots: int,
    parallel: int | None,
    queue_size: int,
    max_tokens: int,
    api_key: str | None,
    model_id: str | None,
    strict_model_name: bool,
    sinks: int | None,
    window: int | None,
    threads: int | None,
    energy: bool,
    shutdown_timeout: float,
    log_level: str,
    speculative: str | None,
    draft: Path | None,
    draft_tokens: int | None,
    template_kwargs: dict[str, Any],
) -> None:
    """Serve a model over the OpenAI API (chat and completions, streaming), with Prometheus /metrics."""
    from edge_runtime.errors import EdgeRuntimeError

    try:
        import uvicorn  # noqa: F401
    except ImportError:
        raise EdgeRuntimeError("edge-serve needs its extra: pip install 'edge-runtime[serve]'") from None
    if (bundle is None) == (model is None):
        raise EdgeRuntimeError("give one of --bundle DIR or --model CHECKPOINT")
    if parallel is not None and parallel > slots:
        raise EdgeRuntimeError(f"--parallel {parallel} needs as many --slots (one per generation); got --slots {slots}")
    if parallel is not None and parallel > 1 and speculative is not None:
        raise EdgeRuntimeError("speculative decoding runs one generation at a time: use --parallel 1 with it")
    if api_key is not None and not api_key.strip():
        raise EdgeRuntimeError("--api-key is empty")
    if not is_loopback(host) and api_key is None:
        # Refused, not warned: a robot's model server on a shared network is anyone's compute otherwise.
        raise EdgeRuntimeError(
            f"--host {host} is not a loopback address: give --api-key KEY (or EDGE_SERVE_API_KEY) so that only "
            "clients with the key can use the model, or bind 127.0.0.1 behind your own proxy"
        )
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s: %(name)s: %(message)s", stream=sys.stderr)
    state, closers = _build(
        ServeOptions(
            bundle,
            model,
            target,
            slots,
            queue_size,
            max_tokens,
            api_key,
            model_id,
            sinks,
            window,
            threads,
            energy,
            SpeculativeChoice(speculative, draft, draft_tokens),
            template_kwargs,
            strict_model_name=strict_model_name,
            parallel=parallel,
        )
    )
    try:
        _serve(state, host, port, shutdown_timeout, log_level)
    finally:
        state.scheduler.close()
        for close in closers:
            close()


@dataclass(frozen=True)
class SpeculativeChoice:
    """--speculative / --draft / --draft-tokens as given (speculative.from_options checks them at load)."""

    method: str | None = None
    draft: Path | None = None
    k: int | None = None


@dataclass(frozen=True)
class ServeOptions:
    """What `_build` needs from the command line, in one value."""

    bundle: Path | None
    model: str | None
    target: str
    slots: int
    queue_size: int
    max_tokens: int
    api_key: str | None
    model_id: str | None
    sinks: int | None
    window: int | None
    threads: int | None
    energy: bool
    speculative: SpeculativeChoice = SpeculativeChoice()
    # --chat-template-kwargs: every chat request's template variables (its own chat_template_kwargs win)
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    strict_model_name: bool = False  # refuse requests naming another model than model_id's
    parallel: int | None = None  # generations at once; None: the target's serve_parallel (1 with speculation)


def _build(opts: ServeOptions) -> tuple[Any, list[Any]]:
    from edge_runtime import __version__
    from edge_runtime.chat import ChatTemplate
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.errors import ChatTemplateError
    from edge_runtime.first_use import resolve_run
    from edge_runtime.rss import return_large_buffers
    from edge_runtime.sampling_defaults import model_defaults
    from edge_runtime.snapshot import bundle_checksum
    from edge_runtime.speculative import from_options
    from edge_runtime.telemetry.accounting import open_sampler
    from edge_runtime.tokenizer import Tokenizer

    from .app import ServerState
    from .metrics import Metrics
    from .scheduler import Scheduler
    from .slots import SlotPool, memory_needed

    bundle, model, slots, max_tokens, model_id = opts.bundle, opts.model, opts.slots, opts.max_tokens, opts.model_id
    log = logging.getLogger("edge_serve")
    # Worker threads each handle large requests now and then: their buffers go back to the OS when freed, so the
    # server's memory stays flat (rss.py says why).
    return_large_buffers()
    # The bundle runs under the target it was exported for unless --target names another; a model is exported
    # on first use for this machine's target, its progress logged.
    chosen = resolve_run(bundle, model, opts.target, progress=log.info)
    log.debug(chosen.reason)
    if chosen.warning:
        log.warning(chosen.warning)
    profile, bundle = chosen.profile, chosen.bundle
    log.info("target %s", profile.name)
    sc = opts.speculative
    parallel = opts.parallel
    if parallel is None:  # the target's, within the slots; one where speculation runs (it steps one stream)
        parallel = 1 if sc.method is not None else min(profile.serve_parallel, slots)
    # One KV cache per slot, preallocated (a slot's conversation stays in its own ring); the load refuses what the
    # target's memory budget cannot hold, before any of them is allocated. The compute threads spin between calls
    # also with --parallel: sleeping ones made the 4-client aggregate slower (scripts/serve_batch_load.py).
    load_opts = LoadOptions(sinks=opts.sinks, window=opts.window, threads=opts.threads, caches=slots)
    engine = load(bundle, load_opts, target=profile)
    spec = from_options(engine, sc.method, sc.draft, sc.k, opts.threads)  # bad ones: one line, nothing served
    if spec is not None:
        log.info("speculative decoding: %s", spec.describe())
    tokenizer = Tokenizer.for_engine(engine)
    try:
        template: ChatTemplate | None = ChatTemplate.for_bundle(engine.bundle).with_variables(opts.template_kwargs)
    except ChatTemplateError as e:
        log.warning("%s; /v1/chat/completions will refuse requests", e)
        template = None
    closers: list[Any] = []
    power = None
    if opts.energy:
        power, notes = open_sampler(profile)
        for note in notes:
            log.info("power: %s", note)
        closers.append(power.meter.close)
    if parallel > 1:
        loaded = engine.model
        log.info(
            "%d generations at once: %s",
            parallel,
            f"decode steps batched, up to {parallel} rows a call; rows round as one row alone up to "
            f"{loaded.exact_rows} (Model.exact_rows, measured here)"
            if loaded.batched
            else "this bundle's graph decodes one sequence a call (re-export it with --kernel edge to batch)",
        )
    metrics = Metrics()
    pool = SlotPool(engine, slots)
    scheduler = Scheduler(
        pool,
        tokenizer,
        engine.manifest.tokenizer.eos_token_ids,
        metrics,
        queue_size=opts.queue_size,
        power=power,
        speculative=spec,
        parallel=parallel,
    )
    name = model_id or (Path(model).name if model is not None else bundle.name)
    g = engine.geometry
    defaults = model_defaults(engine.manifest.generation)
    log.info("sampling defaults: %s; request fields win", defaults.describe())
    need = memory_needed(engine)
    metrics.describe(
        model=name,
        bundle=engine.bundle.path,
        target=profile.name,
        sinks=g.sinks,
        window=g.window,
        slots=slots,
        parallel=parallel,
        version=__version__,
        power=power.meter.description if power is not None else "off",
    )
    state = ServerState(
        engine=engine,
        tokenizer=tokenizer,
        template=template,
        scheduler=scheduler,
        metrics=metrics,
        model_id=name,
        strict_model=opts.strict_model_name,
        fingerprint=f"edge-runtime-{__version__}-{bundle_checksum(engine.manifest)[:12]}",
        max_tokens=max_tokens,
        api_key=opts.api_key,
        sampling=defaults,
        extra={
            "target": profile.name,
            "cache": {"sinks": g.sinks, "window": g.window},
            "slots": slots,
            "parallel": parallel,
            "memory_needed_bytes": need,
            "memory_budget_bytes": profile.memory_budget_bytes,
            "speculative": spec.describe() if spec is not None else None,
        },
    )
    log.info(
        "model %s: %d slots, cache %d+%d, %.1f MiB for weights and slots (budget %s)",
        name,
        slots,
        g.sinks,
        g.window,
        need / 2**20,
        "none" if profile.memory_budget_bytes is None else f"{profile.memory_budget_bytes / 2**20:.0f} MiB",
    )
    return state, closers


class _Stopped(Exception):
    """A SIGTERM or SIGINT after uvicorn's graceful shutdown (or before it started)."""


def _stopped(sig: int, frame: Any) -> None:
    raise _Stopped(sig)


def _serve(state: Any, host: str, port: int, shutdown_timeout: float, log_level: str) -> None:
    import uvicorn

    from .app import create_app

    config = uvicorn.Config(
        create_app(state),
        host=host,
        port=port,
        log_level=log_level,
        access_log=log_level == "debug",
        timeout_graceful_shutdown=shutdown_timeout,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it has shut down gracefully, under the handlers that
    # were in place before it: ours end the process with status 0 after our cleanup, not killed by the signal.
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()  # SIGTERM / SIGINT: stop accepting, finish what is in flight, then the lifespan's shutdown
    except _Stopped:
        return
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:  # the port was taken or the address is not ours: uvicorn logged why
        from edge_runtime.errors import EdgeRuntimeError

        raise EdgeRuntimeError(f"could not serve on {host}:{port} (see the message above)")


if __name__ == "__main__":
    main()
