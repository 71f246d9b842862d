"""Structured output: decoding constrained to a JSON schema, a regular expression, a Lark grammar or a choice.

    g = constrain.json_schema({"type": "object", ...})       # or regex(...), lark(...), choice([...])
    result = generate(engine, tok, messages=msgs, grammar=g)  # or response_format={"type": "json_schema", ...}
    session.send(ids, grammar=g)

The grammar engine is llguidance (the library llama.cpp and onnxruntime-genai use; a Rust core, no Python
dependencies): it is handed the bundle's own tokenizer.json and EOS ids, and answers two questions per step,
which tokens may come next (a bitmask, applied here as a logits processor that sets the rest to -inf) and
which tokens are forced whatever the model says (fast-forward: `{"action": "` after a schema's first key,
the rest of an enum value once it is unambiguous). generate_step feeds forced tokens to the model as one
chunk instead of sampling them one decode step at a time, so constrained output can be faster than free.

Every problem with the constraint itself (invalid JSON in a schema, an invalid or unsatisfiable schema, a
schema keyword llguidance does not implement, a regex or Lark syntax error) is a one-line `ConstraintError`
raised when the constraint is compiled: before anything is prefilled or generated. Some constraints only
show they cannot be followed once bound to a tokenizer: a required property that recurses without end, or
`(a{1000}){1000}`, put llguidance past its limits on the first forced tokens. Constraint probes those before
the prompt is fed; a matcher that fails later (its limits mid-output) raises too, never ends the output as
if it were complete (the mask then allows only EOS, and an empty reply passed for a valid one).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConstraintError

# Separators as json.dumps writes them: what instruct models saw most in training. Whitespace elsewhere is not
# allowed: a small model given free whitespace inside JSON sometimes emits newlines until max_tokens.
JSON_OPTIONS: dict[str, Any] = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


@dataclass(frozen=True)
class Grammar:
    """A compiled-to-text constraint: `kind` (json_schema, json_object, regex, lark, choice) and llguidance's
    grammar text. Tokenizer-independent; `Constraint` binds it to a bundle's tokenizer for one generation."""

    kind: str
    text: str


def _llg() -> Any:
    try:
        import llguidance
    except ImportError:
        raise ConstraintError("structured output needs llguidance: pip install 'edge-runtime[structured]'") from None
    return llguidance


def _one_line(message: str) -> str:
    """llguidance's messages for Lark and regex errors draw the offending line with a caret under it."""
    lines = [ln.strip() for ln in message.splitlines()]
    kept = [ln for ln in lines if ln and not re.fullmatch(r"\^+|\d+ \|.*", ln)]
    return re.sub(r"\s+", " ", " ".join(kept))[:400]


def _utf8(text: str, what: str) -> str:
    """Command-line text arrives with undecodable bytes as lone surrogates (PEP 383), a JSON `"\\ud800"` escape
    too: llguidance cannot take them (a UnicodeEncodeError from its binding), so they are named here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConstraintError(f"invalid {what}: not valid UTF-8 (character {e.start}); give text") from None
    return text


def _check(kind: str, text: str) -> Grammar:
    llg = _llg()
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(text)
    if is_error:
        raise ConstraintError(_describe(kind, messages[0] if messages else "rejected by llguidance"))
    return Grammar(kind, text)


def _describe(kind: str, message: str) -> str:
    m = _one_line(message)
    if kind in ("json_schema", "json_object"):
        if m.startswith("Unsatisfiable"):
            return f"unsatisfiable JSON schema: {m}"
        if m.startswith(("Unimplemented", "Unknown format", "Unsupported")):
            return f"unsupported JSON schema feature: {m} (llguidance implements most of draft 2020-12)"
        return f"invalid JSON schema: {m}"
    what = {"regex": "regular expression", "lark": "Lark grammar", "choice": "choice"}.get(kind, kind)
    return f"invalid {what}: {m}"


def json_schema(schema: Mapping[str, Any] | str) -> Grammar:
    """Output that parses as JSON and validates against `schema` (a dict, or JSON text)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"invalid JSON schema: not JSON: {e}") from None
    if not isinstance(schema, Mapping):
        raise ConstraintError(f"invalid JSON schema: must be an object, got {type(schema).__name__}")
    try:
        text = _llg().LLMatcher.grammar_from_json_schema(dict(schema), defaults=JSON_OPTIONS)
    except (ValueError, TypeError, RecursionError) as e:  # a value JSON cannot hold (a lone surrogate), nesting
        raise ConstraintError(f"invalid JSON schema: {_one_line(str(e))}") from None
    return _check("json_schema", text)


def json_object() -> Grammar:
    """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
    return _check("json_object", _llg().LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS))


def regex(pattern: str) -> Grammar:
    """Output that matches `pattern` in full (Rust regex syntax, close to Python's re without look-around)."""
    return _check("regex", _llg().LLMatcher.grammar_from_regex(_utf8(pattern, "regular expression")))


def lark(source: str) -> Grammar:
    """Output of a Lark grammar in llguidance's dialect (`start:` rule; `%json {...}` embeds a JSON schema)."""
    return _check("lark", _llg().LLMatcher.grammar_from_lark(_utf8(source, "Lark grammar")))


def choice(options: Sequence[str]) -> Grammar:
    """Exactly one of `options`."""
    if isinstance(options, str) or not options or not all(isinstance(o, str) and o for o in options):
        raise ConstraintError("invalid choice: give at least one non-empty string to choose among")
    for o in options:
        _utf8(o, "choice")
    return _check("choice", _llg().LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in options)))


def from_response_format(response_format: Mapping[str, Any]) -> Grammar | None:
    """OpenAI's `response_format`: {"type": "text"} (None: unconstrained), {"type": "json_object"}, or
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}."""
    if not isinstance(response_format, Mapping):
        raise ConstraintError("response_format must be an object with a 'type'")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object()
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
            raise ConstraintError("response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}")
        return json_schema(spec["schema"])
    raise ConstraintError(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r:.40}")


def resolve(response_format: Mapping[str, Any] | None = None, grammar: Grammar | None = None) -> Grammar | None:
    """The one constraint of a request (generate's and Session.send's `response_format` / `grammar` arguments)."""
    if response_format is not None and grammar is not None:
        raise ConstraintError("give response_format or grammar, not both")
    if grammar is not None and not isinstance(grammar, Grammar):
        raise ConstraintError(f"grammar must be a constrain.Grammar (json_schema(), regex(), ...), got {grammar!r:.60}")
    return grammar if response_format is None else from_response_format(response_format)


@lru_cache(maxsize=4)
def _tokenizer(path: str, mtime_ns: int, eos: tuple[int, ...], n_vocab: int) -> Any:
    # ~0.3 s for a 49k vocabulary (llguidance builds its token trie): once per bundle, not per request.
    llg = _llg()
    text = Path(path).read_text(encoding="utf-8")
    size = llg.LLTokenizer(text).vocab_size
    # The model's logits row may be wider than the tokenizer (padded embeddings); the extra ids are never allowed.
    return llg.LLTokenizer(text, n_vocab=max(n_vocab, size), eos_token=list(eos) or None)


def lltokenizer(engine: Any) -> Any:
    """llguidance's tokenizer for an Engine's (or a Session's) bundle, cached."""
    engine = getattr(engine, "engine", engine)
    path = engine.bundle.tokenizer_file
    spec, vocab = engine.manifest.tokenizer, engine.manifest.model.vocab_size
    return _tokenizer(str(path), path.stat().st_mtime_ns, tuple(spec.eos_token_ids), vocab)


class Constraint:
    """One generation's grammar state: a logits processor (`(reply, logits) -> logits`) that also answers
    `forced_tokens(reply)` for generate_step's fast-forward. It follows `reply`, consuming the tokens it has
    not seen; a reply that starts over (empty) starts the grammar over."""

    def __init__(self, grammar: Grammar, tokenizer: Any, vocab_size: int):
        llg = _llg()
        self.grammar, self.vocab_size = grammar, vocab_size
        self.matcher = llg.LLMatcher(tokenizer, grammar.text, log_level=0)
        self._seen = 0
        self._foreign = False  # the last tokens fed were outside the grammar (a caller's own)
        words = (max(vocab_size, tokenizer.vocab_size) + 31) // 32
        self._bitmask = np.zeros(words, np.int32)
        self._keep = np.empty(vocab_size, np.uint32)
        self._ninf = np.float32(-np.inf).view(np.uint32)
        self._fill_mask()  # an unsatisfiable grammar shows here, before anything is generated
        if self.matcher.is_error() or not self._bitmask.any():
            raise ConstraintError(_describe(grammar.kind, self.matcher.get_error() or "no token can start the output"))
        probe = self.matcher.deep_copy()  # ... or in the first forced tokens (an endless required recursion)
        forced = probe.compute_ff_tokens()
        if forced:
            probe.consume_tokens(forced)
        self._check_matcher(probe)

    def _check_matcher(self, matcher: Any) -> None:
        if matcher.is_error():
            what = {"json_schema": "JSON schema", "json_object": "JSON object", "regex": "regular expression"}
            first = (matcher.get_error() or "").strip().splitlines()[:1] or ["no reason given"]
            raise ConstraintError(
                f"the {what.get(self.grammar.kind, self.grammar.kind)} cannot be followed (no finite output "
                f"satisfies it, or it is past llguidance's limits): {_one_line(first[0])}"
            )

    @classmethod
    def for_engine(cls, engine: Any, grammar: Grammar) -> Constraint:
        vocab = getattr(engine, "engine", engine).manifest.model.vocab_size
        return cls(grammar, lltokenizer(engine), vocab)

    @property
    def done(self) -> bool:
        """The output is complete: only EOS may follow."""
        return bool(self.matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self.matcher.is_accepting())

    def _sync(self, reply: Sequence[int]) -> None:
        if len(reply) < self._seen:  # a new reply (or a shorter one): roll the grammar back to it
            self.matcher.rollback(self._seen - len(reply))
            self._seen = len(reply)
        if len(reply) > self._seen:
            new = list(reply[self._seen :])
            # A token outside the grammar can only come from a caller feeding its own: the matcher then stays in
            # its error state and the mask allows EOS alone, so the stream ends rather than running unconstrained.
            # Tokens the grammar allows that still fail are llguidance's limits: __call__ raises on those.
            self._foreign = self._foreign or self.matcher.validate_tokens(new) < len(new)
            self.matcher.consume_tokens(new)
            self._seen = len(reply)

    def forced_tokens(self, reply: Sequence[int]) -> list[int]:
        """Tokens the grammar forces after `reply` (consumed here: the caller appends them to the reply)."""
        self._sync(reply)
        if self.matcher.is_error() or self.matcher.is_stopped():
            return []
        ff = list(self.matcher.compute_ff_tokens())
        self._check_matcher(self.matcher)
        if ff and self.matcher.consume_tokens(ff):
            self._seen += len(ff)
            return ff
        return []

    def _fill_mask(self) -> None:
        m = self._bitmask
        self.matcher.unsafe_compute_mask_ptr(m.ctypes.data, m.nbytes)

    def __call__(self, reply: Sequence[int], logits: np.ndarray) -> np.ndarray:
        self._sync(reply)
        if logits.dtype != np.float32 or not logits.flags.c_contiguous:
            logits = np.ascontiguousarray(logits, dtype=np.float32)
        self._fill_mask()
        if not self._foreign:
            self._check_matcher(self.matcher)  # past its limits mid-output: an error, not an EOS-only mask
        # Branch-free on the float bits (a masked copy costs 10x more on a mask of mixed words):
        # kept entries AND 0xFFFFFFFF, banned ones become -inf's bit pattern.
        bits = np.unpackbits(self._bitmask.view(np.uint8), count=self.vocab_size, bitorder="little")
        keep, row = self._keep, logits.view(np.uint32)
        np.copyto(keep, bits)
        np.negative(keep, out=keep)  # 1 -> 0xFFFFFFFF
        np.bitwise_and(row, keep, out=row)
        np.invert(keep, out=keep)
        np.bitwise_and(keep, self._ninf, out=keep)
        np.bitwise_or(row, keep, out=row)
        return logits


def processors(engine: Any, response_format: Mapping[str, Any] | None, grammar: Grammar | None) -> list[Constraint]:
    """The logits processors one request's constraint needs: [] without one, else one fresh Constraint."""
    g = resolve(response_format, grammar)
    return [] if g is None else [Constraint.for_engine(engine, g)]
