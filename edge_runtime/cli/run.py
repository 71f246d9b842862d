"""`edge-run`: stream a completion from a bundle (or a checkpoint, exported on first use).

edge-run                                   # the bundled demo model, target auto-detected
edge-run --model demo                      # the same by name; --model DIR or FILE.gguf: exported on first use
edge-run --prompt "ROMEO." --max-tokens 64 --temperature 0 --stats   # sampling defaults: the model's (--verbose)
edge-run --bundle out/ --json
edge-run --bundle out/ --message "What is the capital of France?" --system "Be brief."   # via the chat template
echo "a long prompt" | edge-run --bundle out/          # or --prompt -, or --prompt-file FILE
edge-run --bundle out/ --chat                          # multi-turn; from a pipe, one message per line
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import click

from . import chat_repl, prompt_input
from .common import (
    check_writable,
    debug_option,
    friendly_errors,
    model_options,
    require_stdout,
    speculative_options,
    template_kwargs_option,
    verbose_option,
)

DEFAULT_PROMPT = "ROMEO.\nWhat light"
RAW_MAX_TOKENS = 64  # a raw prompt has no end of turn to stop at
MAX_CONSTRAINT_BYTES = 4 << 20  # --json-schema / --grammar files: edge-serve's whole request body limit
# A chat reply runs to its end of turn, bounded by the window (a longer reply would evict its own start) and,
# under greedy decoding, by this: greedy decoding of a small model can loop (a phrase repeated until the
# window is full), and a loop should cost seconds, not the whole window.
GREEDY_CHAT_MAX_TOKENS = 512


@click.command()
@click.option(
    "--prompt", default=None, help=f"Raw prompt text; - reads stdin (as does a pipe) [default: {DEFAULT_PROMPT!r}]."
)
@click.option("--prompt-file", type=click.Path(path_type=Path), help="Read the raw prompt from this UTF-8 file.")
@click.option("--message", default=None, help="One user message through the model's chat template; - reads stdin.")
@click.option("--system", default=None, help="A system message before --message (or every --chat conversation).")
@template_kwargs_option
@click.option(
    "--chat", is_flag=True, help="Multi-turn chat; from a pipe, one user message per line (/reset starts over)."
)
@click.option("--bundle", type=click.Path(path_type=Path), help="A bundle directory (from edge-export).")
@model_options
@click.option(
    "--max-tokens",
    type=int,
    default=None,
    help=f"Most tokens a reply may have [default: --message/--chat to the end of the turn, within the window "
    f"({GREEDY_CHAT_MAX_TOKENS} when greedy); a raw prompt {RAW_MAX_TOKENS}].",
)
@click.option("--temperature", type=float, default=None, help="0 = greedy [default: the model's; see --verbose].")
@click.option("--top-k", type=int, default=None, help="0 = off [default: the model's].")
@click.option("--top-p", type=float, default=None, help="1 = off [default: the model's].")
@click.option("--min-p", type=float, default=None, help="0 = off [default: the model's].")
@click.option("--repetition-penalty", type=float, default=None, help="1 = off [default: the model's].")
@click.option("--seed", type=int, default=None, help="Seed for reproducible sampling.")
@click.option("--stop", multiple=True, help="Stop string (repeatable; at most 16, each at most 400 characters).")
@click.option("--json-schema", type=click.Path(path_type=Path), help="Constrain the output to this JSON schema file.")
@click.option("--regex", default=None, help="Constrain the output to match this regular expression in full.")
@click.option("--grammar", "grammar_file", type=click.Path(path_type=Path), help="Constrain to a Lark grammar file.")
@click.option("--choice", multiple=True, help="Constrain the output to one of these strings (repeatable).")
@click.option("--sinks", type=int, default=None, help="Attention sinks [default: target, then bundle].")
@click.option("--window", type=int, default=None, help="Recent-token window [default: target, then bundle].")
@click.option("--threads", type=int, default=None, help="Compute threads [default: target, then all cores].")
@speculative_options
@click.option(
    "--verify",
    type=click.Choice(["sampled", "full"]),
    default="sampled",
    show_default=True,
    help="Bundle checks at load: files verified before are re-checked by sampled chunk CRCs (and hashed in "
    "full weekly); full hashes every byte.",
)
@click.option(
    "--stats",
    is_flag=True,
    help="Print TTFT, ITL p50/p90/p99, tokens/s, peak RSS, weight bandwidth and energy per phase to stderr.",
)
@click.option(
    "--log", "log_file", type=click.Path(path_type=Path), help="Append this run's figures to a field log (JSONL)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, ids, stats) instead of streaming.")
@verbose_option
@debug_option
@friendly_errors
def main(
    prompt: str | None,
    prompt_file: Path | None,
    message: str | None,
    system: str | None,
    template_kwargs: dict[str, Any],
    chat: bool,
    bundle: Path | None,
    model: str | None,
    target: str,
    max_tokens: int | None,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
    repetition_penalty: float | None,
    seed: int | None,
    stop: tuple[str, ...],
    json_schema: Path | None,
    regex: str | None,
    grammar_file: Path | None,
    choice: tuple[str, ...],
    sinks: int | None,
    window: int | None,
    threads: int | None,
    speculative: str | None,
    draft: Path | None,
    draft_tokens: int | None,
    verify: str,
    stats: bool,
    log_file: Path | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Generate text on this device. With no arguments: the bundled demo model, target auto-detected."""
    from edge_runtime.bench.figures import format_energy, format_speed, run_figures
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.errors import EdgeRuntimeError
    from edge_runtime.first_use import resolve_run
    from edge_runtime.generate import GenerationCancelled, GenerationConfig, close_cancelled, stream_generate
    from edge_runtime.sampling import SamplingParams
    from edge_runtime.sampling_defaults import SamplingDefaults, model_defaults
    from edge_runtime.telemetry.accounting import PhaseMarks, open_sampler
    from edge_runtime.tokenizer import Tokenizer

    require_stdout()
    if bundle and model:
        raise EdgeRuntimeError("give --bundle or --model, not both")
    if chat and (prompt is not None or prompt_file is not None or message is not None):
        raise EdgeRuntimeError("--chat reads its messages from the terminal or stdin; drop --prompt/--message")
    if log_file is not None:  # found unwritable after the run, its figures would be lost
        check_writable(log_file, "--log")
    # Checked before a model loads: a bad prompt costs no export and no session.
    constraint = _constraint(json_schema, regex, grammar_file, choice)  # a bad one: one line, nothing loaded
    request = None if chat else prompt_input.resolve(prompt, prompt_file, message, system, DEFAULT_PROMPT)
    if template_kwargs and request is not None and not request.is_chat:
        raise EdgeRuntimeError("--chat-template-kwargs are the chat template's variables: give --message or --chat")
    if system is not None:
        system = prompt_input.check_utf8(system, "--system")
    # So are the sampling settings (--seed -1, --temperature 1e-308): before any line of progress.
    is_chat = chat or (request is not None and request.is_chat)
    limit = max_tokens if max_tokens is not None else None if is_chat else RAW_MAX_TOKENS
    given = dict(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty, seed=seed
    )
    SamplingDefaults(SamplingParams(), "").resolve(**given)  # a bad value: one line now, not after an export
    config = GenerationConfig(  # the model's sampling defaults and an end-of-turn reply's bound: once loaded
        max_tokens=RAW_MAX_TOKENS if limit is None else limit, stop_strings=stop
    )
    # The bundle runs under the target it was exported for unless --target names another; a model (the demo by
    # default) is exported on first use for this machine's target.
    chosen = resolve_run(bundle, model or (None if bundle else "demo"), target, progress=_progress)
    if verbose:
        click.echo(chosen.reason, err=True)
    if chosen.warning:
        click.echo(f"warning: {chosen.warning}", err=True)
    profile, bundle_dir = chosen.profile, chosen.bundle
    # Power is sampled only when a figure needs it: phases load, prefill, decode (as in edge-bench).
    sampler = open_sampler(profile)[0] if stats or log_file else None
    if sampler is not None:
        # However the command ends (an error, Ctrl-C), the sampling thread stops and the meter closes.
        click.get_current_context().call_on_close(lambda: _close_sampler(sampler))
        sampler.start()
        sampler.mark("load")
    opts = LoadOptions(sinks=sinks, window=window, threads=threads, verify=verify)  # type: ignore[arg-type]
    engine = load(bundle_dir, opts, target=profile)
    tok = Tokenizer(engine.bundle.tokenizer_file, engine.manifest.tokenizer)
    from edge_runtime.speculative import from_options

    spec = from_options(engine, speculative, draft, draft_tokens, threads)  # bad ones: one line, before any output
    if constraint is not None:  # one the model's tokens cannot follow: refused before the prompt is echoed
        from edge_runtime.constrain import Constraint

        Constraint.for_engine(engine, constraint)
    if sampler is not None:
        sampler.mark(None)
    if chat and spec is not None:
        raise EdgeRuntimeError("--speculative/--draft speed up one reply; not with --chat yet")
    defaults = model_defaults(engine.manifest.generation)
    config = dataclasses.replace(config, sampling=defaults.resolve(**given))
    if verbose:
        click.echo(f"sampling defaults: {defaults.describe()}", err=True)
    if limit is None:
        bound = GREEDY_CHAT_MAX_TOKENS if config.sampling.greedy else engine.geometry.window
        config = dataclasses.replace(config, max_tokens=min(bound, engine.geometry.window))
    if chat:
        options = chat_repl.ChatOptions(system, as_json, template_kwargs, constraint, max_tokens is not None)
        chat_repl.run(engine, tok, config, options)
        return
    assert request is not None
    prompt_ids = _prompt_ids(engine, tok, request, template_kwargs)
    ids, parts, final = [], [], None
    stream = stream_generate(engine, tok, prompt_ids, config, grammar=constraint, speculative=spec)
    if not as_json and not request.is_chat:
        click.echo(request.text, nl=False)
    marks = PhaseMarks(sampler)
    marks.begin()
    cancelled: KeyboardInterrupt | None = None
    try:
        for ev in stream:
            marks.see(ev)
            final = ev.stats or final
            if as_json:  # kept only to print them all at the end; streaming keeps nothing per token
                if ev.token_id >= 0:
                    ids.append(ev.token_id)
                parts.append(ev.text)
            else:
                click.echo(ev.text, nl=False)
                sys.stdout.flush()
    except KeyboardInterrupt as e:  # Ctrl-C: print the partial output (and its stats), then exit 130
        cancelled = e
        closed = e if isinstance(e, GenerationCancelled) else close_cancelled(stream)
        if closed is not None:
            marks.see(closed.final)
            final = closed.final.stats
            parts.append(closed.final.text)
            if not as_json:
                click.echo(closed.final.text, nl=False)
    energy = figures = None
    if sampler is not None:
        energy = sampler.stop()
        if final is not None:
            figures = run_figures(final, engine.manifest.graph.weight_bytes, energy)
    if log_file is not None and figures is not None and energy is not None:
        _log_run(log_file, profile.name, bundle_dir, engine, prompt_ids, config, figures, energy)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "text": "".join(parts),
                    "token_ids": ids,
                    "prompt_token_ids": prompt_ids,
                    "stats": final.to_dict() if final else None,
                    "target": profile.name,
                    "bundle": str(bundle_dir),
                    **({"figures": figures, "power": energy.label()} if figures and energy else {}),
                }
            )
        )
        if cancelled is not None:
            raise cancelled  # friendly_errors: "interrupted", exit status 130
        return
    click.echo()
    if request.is_chat and final is not None and final.finish_reason == "length":
        why = "--max-tokens" if max_tokens is not None else "the default limit; --max-tokens N sets it"
        click.echo(f"(reply cut at {final.generated_tokens} tokens by {why})", err=True)
    if stats and figures and energy:
        s = figures
        click.echo(
            f"--- {s['finish_reason']}: {s['prompt_tokens']} prompt + {s['generated_tokens']} generated tokens | "
            f"{format_speed(s)} | target {profile.name}, cache {engine.geometry.sinks}+{engine.geometry.window}\n"
            f"--- {format_energy(s)}\n--- power: {energy.label()}",
            err=True,
        )
        if spec is not None:
            st = spec.stats
            rate = f"acceptance {st.acceptance:.0%}, {st.tokens_per_step:.2f} tokens per target call"
            click.echo(f"--- speculative: {rate}", err=True)
    if cancelled is not None:
        raise cancelled


def _progress(msg: str) -> None:
    click.echo(msg, err=True)


def _prompt_ids(engine: Any, tok: Any, request: prompt_input.PromptInput, variables: dict[str, Any]) -> list[int]:
    if request.is_chat:
        from edge_runtime.chat import ChatTemplate

        template = ChatTemplate.for_bundle(engine.bundle).with_variables(variables)
        text = template.render(request.messages(), add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)
    else:
        ids = tok.encode(request.text or "")
    if not ids:
        from edge_runtime.errors import EdgeRuntimeError

        raise EdgeRuntimeError("the prompt is empty (it encodes to no tokens and this tokenizer adds no BOS)")
    return ids


def _close_sampler(sampler: Any) -> None:
    if sampler.running:
        sampler.stop()
    sampler.meter.close()


def _log_run(
    log_file: Path,
    target: str,
    bundle_dir: Path,
    engine: Any,
    prompt_ids: list[int],
    config: Any,
    figures: dict[str, Any],
    energy: Any,
) -> None:
    """One field-log record for this run, in the same shape edge-bench writes per trial."""
    from edge_runtime.bench.environment import bundle_info, environment
    from edge_runtime.bench.fieldlog import append_record, make_record, new_run_id
    from edge_runtime.telemetry.accounting import describe_meter

    g = engine.geometry
    settings = {
        "prompt_tokens": len(prompt_ids),
        "max_tokens": config.max_tokens,
        "sampling": dataclasses.asdict(config.sampling),
        "stop": list(config.stop_strings),
        "stop_on_eos": config.stop_on_eos,
        "cache": {"sinks": g.sinks, "window": g.window},
    }
    record = make_record(
        "edge-run",
        environment=environment(),
        target=target,
        bundle=bundle_info(bundle_dir, engine.manifest),
        settings=settings,
        measurement=describe_meter(energy),
        figures=figures,
        run_id=new_run_id(),
    )
    append_record(log_file, record)


def _constraint(json_schema: Path | None, regex: str | None, grammar: Path | None, choice: tuple[str, ...]) -> Any:
    """The structured-output constraint the options ask for (edge_runtime/constrain.py), or None."""
    given = [x for x in (json_schema, regex, grammar, choice or None) if x is not None]
    if not given:
        return None
    from edge_runtime import constrain
    from edge_runtime.errors import ConstraintError

    if len(given) > 1:
        raise ConstraintError("give one of --json-schema, --regex, --grammar, --choice")
    if choice:
        return constrain.choice(choice)
    if regex is not None:
        return constrain.regex(regex)
    path = json_schema or grammar
    assert path is not None
    from edge_runtime.bounded_read import read_text_bounded

    # a regular file only (a FIFO would block, /dev/zero never end) and bounded: a schema or grammar is kilobytes
    what = "--json-schema" if json_schema else "--grammar"
    text = read_text_bounded(path, MAX_CONSTRAINT_BYTES, what, ConstraintError)
    return constrain.json_schema(text) if json_schema else constrain.lark(text)


if __name__ == "__main__":
    main()
