"""Generation, layered `generate_step -> stream_generate -> generate` (as in mlx-lm).

- `generate_step` is the decode loop: it yields one `Step` (token, logprobs if asked for) per token: prefill
  once, then choose and decode one token at a time, over the state it is given (decoding.Source: an Engine
  starts a fresh stream, a Session continues its conversation). speculative.py's `speculative_generate_step` is
  its sibling with the same contract; `step_generator` chooses between them.
- `stream_generate` adds text (incremental detokenizer), stop conditions, logprobs and timings; it yields one
  `TokenEvent` per token, the last one carrying `finish_reason` and the run's `GenerationStats`. Every
  front end (edge-run, edge-bench, edge-serve, `generate`) reaches generation through it.
- `generate` collects a stream into a `GenerationResult`.

Ctrl-C is never swallowed: library loops over requests (edge-bench's trials, a server's queue) must
stop when the user says so. Both layers re-raise it as `GenerationCancelled`, a KeyboardInterrupt that
carries what was produced: the closing event (finish_reason "cancelled", the run's stats) and, from
`generate`, the partial `GenerationResult`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .decoding import Selector, Source
from .errors import EdgeRuntimeError
from .latency import LatencyHistogram
from .rss import peak_rss_bytes
from .sampling import LogitsProcessor, Sampler, SamplingParams, Step
from .tokenizer import StreamingDetokenizer, Tokenizer

if TYPE_CHECKING:
    from .constrain import Grammar
    from .engine import Engine
    from .session import Session
    from .speculative import SpeculativeDecoder


# Bounds on stop strings (GenerationConfig, so edge-run --stop; edge-serve takes at most OpenAI's 4 of this
# length). Matching is linear in each token's text, but each token's text goes through every stop string,
# the held text is up to the longest one's length, and each costs a failure table when a request starts;
# a bound keeps all three small on the engine's thread. Real stop sequences (an end-of-turn marker, a
# delimiter, a closing tag) are far shorter and fewer.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 400


def check_stop_strings(stops: Sequence[str]) -> None:
    """EdgeRuntimeError naming the bound for too many, an empty or a too-long stop string."""
    if len(stops) > MAX_STOP_STRINGS:
        raise EdgeRuntimeError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
    if any(not s for s in stops):
        raise EdgeRuntimeError("stop strings must be non-empty")
    for s in stops:  # a command line's undecodable bytes arrive as lone surrogates: such a stop never matches
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            raise EdgeRuntimeError(f"stop string {s[:20]!a} is not valid UTF-8 (character {e.start})") from None
    longest = max(stops, key=len, default="")
    if len(longest) > MAX_STOP_CHARS:
        raise EdgeRuntimeError(
            f"stop strings are at most {MAX_STOP_CHARS} characters, got one of {len(longest)} ({longest[:20]!r}...)"
        )


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_strings: tuple[str, ...] = ()
    stop_on_eos: bool = True

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise EdgeRuntimeError(f"max_tokens must be >= 1, got {self.max_tokens}")
        check_stop_strings(self.stop_strings)


class FinishReason(str, enum.Enum):
    """Why a generation ended. A str, so it compares, serializes and prints as its value ("eos")."""

    EOS = "eos"  # the model emitted an end-of-sequence token
    STOP = "stop"  # a stop string matched
    LENGTH = "length"  # max_tokens reached
    CANCELLED = "cancelled"  # the caller interrupted it

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass
class GenerationStats:
    prompt_tokens: int
    generated_tokens: int
    ttft_s: float  # start -> first token sampled (tokenize + prefill + sample)
    prefill_s: float
    decode_s: float
    itl_ms: dict[str, float]  # inter-token latency percentiles p50, p90, p99 (within 1%: latency.py)
    peak_rss_bytes: int
    finish_reason: FinishReason

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        """Tokens per second after the first one (the first is part of TTFT)."""
        n = self.generated_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "ttft_ms": round(self.ttft_s * 1e3, 3),
            "prefill_tokens_per_s": round(self.prefill_tps, 2),
            "decode_tokens_per_s": round(self.decode_tps, 2),
            "itl_ms": {k: round(v, 3) for k, v in self.itl_ms.items()},
            "peak_rss_bytes": self.peak_rss_bytes,
            "finish_reason": self.finish_reason,
        }


@dataclass
class TokenEvent:
    token_id: int
    text: str  # text completed by this token (may be empty while a character is incomplete)
    index: int  # 0-based position among generated tokens
    elapsed_s: float  # since the start of the request
    finish_reason: FinishReason | None = None  # set on the last event only
    stats: GenerationStats | None = None  # set on the last event only
    logprob: float | None = None  # with logprobs asked for (sampling.Step): the token's log-probability
    top_logprobs: tuple[tuple[int, float], ...] = ()  # and its most likely alternatives, most likely first


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    stats: GenerationStats


class GenerationCancelled(KeyboardInterrupt):
    """Ctrl-C during a generation, re-raised with the partial output (a KeyboardInterrupt, so code that
    handles Ctrl-C sees it). `final`: the closing event (finish_reason "cancelled", stats, any text held
    back for a stop string); `result`: the partial GenerationResult (set by `generate`)."""

    def __init__(self, final: TokenEvent, result: GenerationResult | None = None):
        super().__init__("generation cancelled")
        self.final = final
        self.result = result


def generate_step(
    source: Source,
    prompt_ids: Sequence[int],
    sampler: Sampler,
    *,
    logits_processors: Sequence[LogitsProcessor] = (),
    logprobs: int | None = None,
) -> Iterator[Step]:
    """The decode loop: yield one `Step` per token forever; the caller decides when to stop.

    `source` is the state the loop advances (decoding.Source): an `Engine` starts a fresh stream (reset, then
    prefill `prompt_ids`); a `Session` appends `prompt_ids` to its conversation and feeds only them
    (session.py). `logits_processors` run in order on a copy of each step's logits before sampling.
    `logprobs=k` puts each token's log-probability and its k most likely alternatives on its Step; None
    leaves them out, and then greedy decoding without processors or penalty never reads the logits back.

    A processor with a `forced_tokens(reply) -> list[int]` method (constrain.Constraint) may force tokens
    (fast-forward): they are fed to the model as one chunk with the token before them (or with the prompt),
    not sampled, and yielded as Steps of log-probability 0 (certain under the constraint). A Session whose
    caller stops inside such a run is rolled back to the last token yielded.

    speculative.py's `speculative_generate_step` is its sibling with the same contract; `step_generator`
    chooses between them.
    """
    processors = tuple(logits_processors)
    forcer = next((p for p in processors if hasattr(p, "forced_tokens")), None)
    forced: list[int] = list(forcer.forced_tokens(())) if forcer is not None else []
    engine = source.engine
    turn = source.begin([*prompt_ids, *forced])
    stops = frozenset(engine.manifest.tokenizer.eos_token_ids)
    pick = Selector(sampler, processors, turn.context(), engine.geometry.logical_capacity, logprobs, stops)
    fused, tracks = pick.fused_argmax(engine), pick.tracks
    logits, decode, chunk, sampled = turn.logits, turn.decode, turn.feed, turn.sampled
    unsaid = len(forced)  # forced tokens fed but not yet yielded
    try:
        while True:
            for f in forced:
                unsaid -= 1
                yield Step(f) if logprobs is None else Step(f, 0.0, ((f, 0.0),))
                pick.took(f)
            step = pick.select(logits)
            while True:
                token = step.token
                sampled(token)  # a session counts the token as said even if the caller stops here
                yield step
                if tracks:
                    pick.took(token)
                forced = forcer.forced_tokens(pick.reply) if forcer is not None else []
                if forced:
                    break
                logits = decode(token)
                step = Step(engine.decoded_argmax()) if fused else pick.select(logits)
            logits = chunk([token, *forced])
            unsaid = len(forced)
    finally:
        if unsaid:
            turn.unsay(unsaid)


def step_generator(
    source: Source,
    prompt_ids: Sequence[int],
    sampler: Sampler,
    *,
    logits_processors: Sequence[LogitsProcessor] = (),
    logprobs: int | None = None,
    speculative: SpeculativeDecoder | str | None = None,
) -> Iterator[Step]:
    """`generate_step`, or with `speculative` ("lookup", or a SpeculativeDecoder: speculative.py) its sibling
    `speculative_generate_step`, which verifies proposed tokens up to k at a time: the same tokens under
    greedy decoding, the same distribution under sampling. A constraint that forces tokens decodes plainly
    (its fast-forward already feeds runs of tokens in one call)."""
    if speculative is None:
        return generate_step(source, prompt_ids, sampler, logits_processors=logits_processors, logprobs=logprobs)
    from .speculative import resolve, speculative_generate_step  # proposers load only for speculation

    decoder = resolve(speculative)
    if any(hasattr(p, "forced_tokens") for p in logits_processors):
        return generate_step(source, prompt_ids, sampler, logits_processors=logits_processors, logprobs=logprobs)
    return speculative_generate_step(
        source, prompt_ids, sampler, decoder, logits_processors=logits_processors, logprobs=logprobs
    )


class StopMatcher:
    """Finds stop strings across token boundaries; holds back text that may be the start of one.

    Time per `push` is linear in the pushed text, not in the stop strings' length (comparing each of a stop
    string's prefixes with the held text is quadratic in it, on every token): each stop string keeps a
    Knuth-Morris-Pratt state, the length of the longest suffix of the text so far that is a prefix of it.
    Held back is the longest such suffix; a hit cuts before the earliest-starting occurrence."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.pending = ""
        self._fail = [_failure(s) for s in self.stops]
        self._state = [0] * len(self.stops)

    def push(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was hit)."""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        # Every state is at most len(pending) - len(text): the held text is the longest of them, so an
        # occurrence starts inside `pending` and ends inside `text` (the held text alone had none).
        end_offset = len(self.pending) - len(text) + 1
        first = None
        for j, (s, fail) in enumerate(zip(self.stops, self._fail, strict=True)):
            q, n = self._state[j], len(s)
            for i, c in enumerate(text):
                while q and s[q] != c:
                    q = fail[q - 1]
                if s[q] == c:
                    q += 1
                if q == n:  # this stop string's first occurrence: no later one can start earlier
                    start = end_offset + i - n
                    first = start if first is None else min(first, start)
                    break
            self._state[j] = q
        if first is not None:
            out, self.pending = self.pending[:first], ""
            self._state = [0] * len(self.stops)  # as if from an empty text, like the cleared `pending`
            return out, True
        hold = max(self._state)
        out, self.pending = self.pending[: len(self.pending) - hold], self.pending[len(self.pending) - hold :]
        return out, False


def _failure(s: str) -> list[int]:
    """KMP's failure function: f[k] = length of the longest proper prefix of s[: k + 1] that is also its suffix."""
    f, q = [0] * len(s), 0
    for k in range(1, len(s)):
        while q and s[k] != s[q]:
            q = f[q - 1]
        if s[k] == s[q]:
            q += 1
        f[k] = q
    return f


def stream_generate(
    engine: Engine | Session,
    tokenizer: Tokenizer,
    prompt: str | Sequence[int] | None = None,
    config: GenerationConfig | None = None,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    response_format: Mapping[str, Any] | None = None,
    grammar: Grammar | None = None,
    logits_processors: Sequence[LogitsProcessor] = (),
    logprobs: int | None = None,
    speculative: SpeculativeDecoder | str | None = None,
) -> Iterator[TokenEvent]:
    """Stream one reply: to `prompt` (text or ids), or to `messages` rendered through the bundle's chat template
    (with `chat_template_kwargs` as its variables, e.g. {"enable_thinking": False} for Qwen3 and SmolLM3).

    An Engine starts afresh. A Session appends a `prompt` to its conversation; `messages` are the whole
    conversation, of which it feeds only what its cache does not hold already (Session.resume). `response_format`
    (OpenAI's) or `grammar` (constrain.py) constrain the reply, after `logits_processors`; a bad one raises
    ConstraintError first. `logprobs=k` puts each token's log-probability and its k most likely alternatives on
    its event. `speculative`: see step_generator (a SpeculativeDecoder's `stats` count its proposals and
    acceptances). The last event releases the text held back for a stop string that never came, whatever ended
    the reply (EOS, max_tokens, a cancel)."""
    t0 = time.perf_counter()
    processors = [*logits_processors, *_constraints(engine, response_format, grammar)]
    prompt_ids = _prompt_ids(engine, tokenizer, prompt, messages, chat_template_kwargs)
    feed = prompt_ids if messages is None else engine.resume(prompt_ids)
    yield from _stream(engine, tokenizer, prompt_ids, feed, config or GenerationConfig(), t0, processors, logprobs,
                       speculative)  # fmt: skip


def _stream(
    engine: Engine | Session,
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    feed: list[int],
    config: GenerationConfig,
    t0: float,
    processors: list[LogitsProcessor],
    logprobs: int | None,
    speculative: SpeculativeDecoder | str | None,
) -> Iterator[TokenEvent]:
    """stream_generate's stream: `prompt_ids` the request's prompt (what its stats count), `feed` the part of it
    the source still needs (Source.resume)."""
    eos = set(engine.manifest.tokenizer.eos_token_ids) if config.stop_on_eos else set()
    detok = StreamingDetokenizer(tokenizer)
    stops = StopMatcher(config.stop_strings)
    itl = LatencyHistogram()  # constant memory however long the stream runs
    steps = step_generator(
        engine,
        feed,
        Sampler(config.sampling),
        logits_processors=processors,
        logprobs=logprobs,
        speculative=speculative,
    )
    prefill_s = first_s = 0.0
    last = t0
    index = produced = 0
    try:
        for index, step in enumerate(steps):
            now = time.perf_counter()
            if index == 0:
                first_s = now - t0
                prefill_s = first_s  # prefill + one sample; sampling is microseconds
            else:
                itl.add((now - last) * 1e3)
            last = now
            token = step.token
            finished = token in eos
            text, hit = ("", False) if finished else stops.push(detok.add(token))
            if finished or hit or index + 1 >= config.max_tokens:
                if not hit:  # EOS or max_tokens: the text held back for a stop string that never came
                    tail, hit = stops.push(detok.flush())
                    text += tail + ("" if hit else stops.pending)
                reason = FinishReason.EOS if finished else FinishReason.STOP if hit else FinishReason.LENGTH
                yield _final(step, text, index, index + 1, t0, reason, prompt_ids, first_s, prefill_s, itl)
                return
            produced = index + 1
            yield TokenEvent(token, text, index, now - t0, logprob=step.logprob, top_logprobs=step.top_logprobs)
    except KeyboardInterrupt:  # re-raised, never swallowed: the caller's loop must stop too
        text = stops.pending  # text held back for a possible stop string is released on cancel
        final = _final(
            Step(-1), text, produced, produced, t0, FinishReason.CANCELLED, prompt_ids, first_s, prefill_s, itl
        )
        raise GenerationCancelled(final) from None
    finally:
        steps.close()


def _final(
    step: Step,
    text: str,
    index: int,
    generated: int,
    t0: float,
    reason: FinishReason,
    prompt_ids: Sequence[int],
    first_s: float,
    prefill_s: float,
    itl: LatencyHistogram,
) -> TokenEvent:
    now = time.perf_counter()
    pct = [itl.percentile(q) for q in (50, 90, 99)]
    stats = GenerationStats(
        prompt_tokens=len(prompt_ids),
        generated_tokens=generated,
        ttft_s=first_s,
        prefill_s=prefill_s,
        decode_s=max(0.0, (now - t0) - first_s) if generated > 1 else 0.0,
        itl_ms={"p50": float(pct[0]), "p90": float(pct[1]), "p99": float(pct[2])},
        peak_rss_bytes=peak_rss_bytes(),
        finish_reason=reason,
    )
    return TokenEvent(
        step.token, text, index, now - t0, reason, stats, logprob=step.logprob, top_logprobs=step.top_logprobs
    )


def generate(
    engine: Engine | Session,
    tokenizer: Tokenizer,
    prompt: str | Sequence[int] | None = None,
    config: GenerationConfig | None = None,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    response_format: Mapping[str, Any] | None = None,
    grammar: Grammar | None = None,
    speculative: SpeculativeDecoder | str | None = None,
) -> GenerationResult:
    """Run a whole request (as stream_generate: a Session given `messages` feeds only what it does not hold).
    Ctrl-C raises GenerationCancelled (a KeyboardInterrupt) whose
    `result` is the partial GenerationResult, finish_reason 'cancelled'."""
    if response_format is not None or grammar is not None:  # a bad constraint fails before the prompt is encoded
        from . import constrain

        grammar, response_format = constrain.resolve(response_format, grammar), None  # compiled once, not twice
    prompt_ids = _prompt_ids(engine, tokenizer, prompt, messages, chat_template_kwargs)
    ids: list[int] = []
    parts: list[str] = []
    final: list[GenerationStats] = []

    def take(ev: TokenEvent) -> None:
        if ev.token_id >= 0:
            ids.append(ev.token_id)
        parts.append(ev.text)
        if ev.stats is not None:
            final.append(ev.stats)

    feed = prompt_ids if messages is None else engine.resume(prompt_ids)  # as stream_generate does
    t0 = time.perf_counter()
    processors = _constraints(engine, response_format, grammar)
    stream = _stream(
        engine, tokenizer, prompt_ids, feed, config or GenerationConfig(), t0, processors, None, speculative
    )
    try:
        for ev in stream:
            take(ev)
    except KeyboardInterrupt as e:
        cancelled = e if isinstance(e, GenerationCancelled) else close_cancelled(stream)
        if cancelled is None:  # the stream had already ended: nothing partial to attach
            raise
        take(cancelled.final)
        text = "".join(parts)
        cancelled.result = GenerationResult(text=text, token_ids=ids, prompt_token_ids=prompt_ids, stats=final[-1])
        raise cancelled from None
    return GenerationResult(text="".join(parts), token_ids=ids, prompt_token_ids=prompt_ids, stats=final[-1])


def _prompt_ids(
    engine: Engine | Session,
    tokenizer: Tokenizer,
    prompt: str | Sequence[int] | None,
    messages: Sequence[Mapping[str, Any]] | None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    if (prompt is None) == (messages is None):
        raise EdgeRuntimeError("give a prompt (text or token ids) or messages, not both and not neither")
    if messages is not None:
        from .chat import encode_messages  # jinja2 loads only for chat

        return encode_messages(engine, tokenizer, messages, chat_template_kwargs=chat_template_kwargs)
    if chat_template_kwargs:
        raise EdgeRuntimeError("chat_template_kwargs are the chat template's variables: give messages, not a prompt")
    assert prompt is not None
    return tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)


def _constraints(
    engine: Engine | Session, response_format: Mapping[str, Any] | None, grammar: Grammar | None
) -> list[LogitsProcessor]:
    if response_format is None and grammar is None:
        return []
    from . import constrain  # llguidance loads only for structured output

    return list(constrain.processors(engine, response_format, grammar))


def close_cancelled(stream: Iterator[TokenEvent]) -> GenerationCancelled | None:
    """After Ctrl-C landed outside `stream` (in the caller's loop body), close it the way an interrupt
    inside it would have: the GenerationCancelled carrying its closing event, or None if it had ended."""
    throw = getattr(stream, "throw", None)
    if throw is None:
        return None
    try:
        throw(KeyboardInterrupt())
    except GenerationCancelled as e:
        return e
    except (KeyboardInterrupt, StopIteration):
        return None
    return None
