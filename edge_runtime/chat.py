"""Chat templates: a bundle's Jinja template rendered the way `transformers`' `apply_chat_template` renders it.

template = ChatTemplate.for_bundle(engine.bundle)
text = template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
ids = tokenizer.encode(text, add_special_tokens=False)   # the template wrote BOS itself where it wants one

Templates come from the Hub and are untrusted code: they run in Jinja's `ImmutableSandboxedEnvironment` with the
globals and filters `transformers` gives them (`raise_exception`, `strftime_now`, a JSON `tojson`, a
`{% generation %}` block that renders its body), and nothing else. Every failure (a syntax error, a template that
raises, a message the template cannot take) is a `ChatTemplateError` naming what went wrong.

A template is also bounded, since one that loops would hang a chat and an edge-serve request: a render runs at
most MAX_RENDER_STEPS steps (loop iterations, calls, filters, operators) and MAX_RENDER_SECONDS, and builds no
text or list over MAX_RENDER_CHARS (checked before `'x' * n`, `10 ** n`, `~`, `join`, `replace`, format widths
are computed, not after). Nothing is computed when a template compiles: Jinja folds constant expressions
(`{{ 'x' * 3000000000 }}`) at compile time, outside any bound, so the optimizer is off and constant output is
only literal text. Going over a bound is a ChatTemplateLimitError.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .bundle import Bundle
from .errors import BundleError, ChatTemplateError, ChatTemplateLimitError

# Roles a conversation may carry. Templates differ in which they accept, but a role outside this set is a typo
# ("usr") far more often than a model's private role, and most templates would render it without complaint.
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "ipython"})
_MAX_TEMPLATE_BYTES = 1 << 20
# render()'s own variables: a user's template variable of one of these names would replace the conversation.
RESERVED_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})

Message = Mapping[str, Any]


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering keeps the body."""

    tags = frozenset({"generation"})

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False):
    # Jinja's own tojson escapes HTML characters, which changes prompts; transformers replaces it with this.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


# One render's bounds. A chat template's render is a loop over the messages, a few dozen steps a message (a
# call or filter counts _CALL_STEPS: it costs that many loop iterations), so a thousand-message conversation
# takes under 100,000; a render of 5 million is a template that loops. The text bound is above the largest
# prompt edge-run takes (16 MiB, twice: --system and --message); the seconds are a backstop for slow steps.
MAX_RENDER_STEPS = 5_000_000
MAX_RENDER_SECONDS = 10.0
MAX_RENDER_CHARS = 64 << 20
_CALL_STEPS = 8
_MAX_INT_BITS = 1 << 16  # `10 ** n` or `x * x` in a loop: an integer of more bits is no prompt's business
_SIZED = (str, list, tuple, dict)
_FORMAT_WIDTH = re.compile(r"\d{8,}")  # a width or precision of 10^7 or more in a %- or {}-format string


class _Limit(Exception):
    """A bound exceeded (render() turns it into a ChatTemplateLimitError naming the template). Not one of the
    exceptions a filter or Jinja's undefined handling catches: nothing in the template can swallow it."""


class _Budget(threading.local):
    """Each thread's render budget (edge-serve renders in a thread pool, one template shared). Outside a render
    none is left: the template's code runs only inside render()."""

    steps = 0
    check_at = 0
    deadline = 0.0


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator with the two places it computes outside the sandbox's hooks bounded."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Frame) -> None:
        # `a ~ b`: its size checked before the join, a loop of `s ~ s` stops at the bound, not at memory's end
        self.write("environment.bounded_join(context.eval_ctx, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def _output_child_to_const(self, node: jinja2.nodes.Expr, frame: Frame, finalize: Any) -> str:
        # Jinja evaluates `{{ expr }}` at compile time when it can (a filter on a literal, say); only literal
        # text is, here, so compiling a template never runs its expressions.
        if not isinstance(node, (jinja2.nodes.TemplateData, jinja2.nodes.Const)):
            raise jinja2.nodes.Impossible()
        return super()._output_child_to_const(node, frame, finalize)


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every step counted and every operator that can build a large value checked first."""

    code_generator_class = _BoundedCodeGenerator
    # Intercepted operators are also never folded at compile time (BinExpr.as_const refuses them).
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self, **options: Any):
        super().__init__(optimized=False, **options)  # the optimizer folds constants at compile time
        self.budget = _Budget()
        for name, f in list(self.filters.items()):
            self.filters[name] = _bounded_filter(self, f)
        self.globals["lipsum"] = _no_lipsum

    def _parse(self, source: str, name: str | None, filename: str | None) -> jinja2.nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in list(tree.find_all(jinja2.nodes.For)):  # each iteration is a step
            guard = jinja2.nodes.EnvironmentAttribute("guard_iter", lineno=loop.lineno)
            loop.iter = jinja2.nodes.Call(guard, [loop.iter], [], None, None, lineno=loop.lineno)
        return tree

    def step(self, n: int = 1) -> None:
        b = self.budget
        b.steps -= n
        if b.steps < b.check_at:  # the clock read once in a thousand steps
            if b.steps < 0:
                raise _Limit(f"ran over {MAX_RENDER_STEPS} steps (a loop that does not end?)")
            b.check_at = b.steps - 1024
            if time.monotonic() > b.deadline:
                raise _Limit(f"ran over {MAX_RENDER_SECONDS:g} seconds")

    def guard_iter(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            self.step()
            yield item

    def bounded_join(self, eval_ctx: Any, parts: tuple[Any, ...]) -> str:
        texts = [p if isinstance(p, str) else str(p) for p in parts]
        _check_size(sum(map(len, texts)), "`~`")
        if eval_ctx.autoescape:
            return jinja2.runtime.markup_join(texts)
        return "".join(texts)

    # `__self`, `__context`, `__obj` as Jinja names them: no clash with the keyword arguments being passed on
    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        __self.step(_CALL_STEPS)
        _check_call(__obj, args, kwargs, getattr(__obj, "__name__", "a function"))
        return _bounded(super().call(__context, __obj, *args, **kwargs), "a call")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.step()
        _check_binop(operator, left, right)
        return _bounded(super().call_binop(context, operator, left, right), f"`{operator}`")


def _check_size(n: int, what: str) -> None:
    if n > MAX_RENDER_CHARS:
        raise _Limit(f"builds a value of {n} items with {what}, over the {MAX_RENDER_CHARS} a render may")


def _bounded(value: Any, what: str) -> Any:
    if isinstance(value, _SIZED):
        _check_size(len(value), what)
    elif isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
        raise _Limit(f"builds an integer of {value.bit_length()} bits with {what}")
    return value


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_binop(op: str, left: Any, right: Any) -> None:
    if op == "*":
        if _is_int(left) and _is_int(right):
            if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise _Limit("multiplies integers past the bound")
        elif (isinstance(left, _SIZED) and _is_int(right)) or (isinstance(right, _SIZED) and _is_int(left)):
            seq, n = (left, right) if _is_int(right) else (right, left)
            _check_size(len(seq) * max(n, 0), "`*`")
    elif op == "**" and _is_int(left) and _is_int(right) and right > 0:
        if left.bit_length() * right > _MAX_INT_BITS:
            raise _Limit(f"raises an integer to the power {right}, past the bound")
    elif op == "+" and isinstance(left, _SIZED) and isinstance(right, _SIZED):
        _check_size(len(left) + len(right), "`+`")
    elif op == "%" and isinstance(left, str):
        _check_format(left, right if isinstance(right, tuple) else (right,), {})


def _check_format(fmt: str, args: Iterable[Any], kwargs: Mapping[str, Any]) -> None:
    """A %- or {}-format whose widths (literal, or `*` from the arguments) would build a huge string."""
    if _FORMAT_WIDTH.search(fmt):
        raise _Limit("formats with a width or precision past the bound")
    for a in (*args, *kwargs.values()):
        if _is_int(a) and abs(a) > MAX_RENDER_CHARS:
            raise _Limit(f"formats with {a} as a width, past the bound")


def _size(x: Any) -> int:
    return len(x) if isinstance(x, str) else len(str(x))


def _check_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> None:
    """The arguments that make a str method or a filter build a large value: an int width or count (`center`,
    `ljust`, `zfill`, `batch`), a replacement, a join, a format."""
    for a in (*args, *kwargs.values()):
        if _is_int(a) and abs(a) > MAX_RENDER_CHARS:
            raise _Limit(f"passes {a} to {name}, past the bound")
    method = getattr(obj, "__wrapped__", obj)  # the sandbox hands out str.format wrapped, its string bound in
    self_, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if isinstance(self_, str) and name in _STR_AMPLIFIERS:
        _STR_AMPLIFIERS[name](self_, args, kwargs)


def _replace_size(s: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    old, new = [*args, kwargs.get("old"), kwargs.get("new")][:2]
    count = args[2] if len(args) > 2 else kwargs.get("count", -1)
    if isinstance(old, str) and isinstance(new, str) and len(new) > len(old):
        n = s.count(old) if old else len(s) + 1
        if _is_int(count) and count >= 0:
            n = min(n, count)
        _check_size(len(s) + n * (len(new) - len(old)), "`replace`")


def _join_size(sep: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    items = args[0] if args else kwargs.get("iterable")
    if isinstance(items, (list, tuple)):
        _check_size(sum(_size(x) for x in items) + len(sep) * max(len(items) - 1, 0), "`join`")


def _expandtabs_size(s: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    tab = args[0] if args else kwargs.get("tabsize", 8)
    if _is_int(tab):
        _check_size(len(s) + s.count("\t") * max(tab, 0), "`expandtabs`")


def _format_method(s: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    _check_format(s, args, kwargs)


_STR_AMPLIFIERS = {
    "replace": _replace_size,
    "join": _join_size,
    "expandtabs": _expandtabs_size,
    "format": _format_method,
    "format_map": _format_method,
}


def _filter_precheck(name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Filters whose output grows with an argument, sized before they run."""
    if name == "replace" and isinstance(value, str):
        _replace_size(value, args, kwargs)
    elif name == "join" and isinstance(value, (list, tuple)):
        sep = args[0] if args else kwargs.get("d", "")
        _join_size(sep if isinstance(sep, str) else "", (value,), {})
    elif name == "format" and isinstance(value, str):
        _check_format(value, args, kwargs)
    elif name in ("indent", "wordwrap") and isinstance(value, str):
        width = args[0] if args else kwargs.get("width", 4 if name == "indent" else 79)
        if name == "indent":
            per_line = width if _is_int(width) else len(str(width))
            _check_size(len(value) + (value.count("\n") + 1) * max(per_line, 0), "`indent`")
        else:
            wrap = args[2] if len(args) > 2 else kwargs.get("wrapstring") or "\n"
            lines = len(value) // max(width, 1) + value.count("\n") + 1 if _is_int(width) else len(value)
            _check_size(len(value) + lines * len(str(wrap)), "`wordwrap`")


def _bounded_filter(env: _BoundedEnvironment, f: Any) -> Any:
    """`f` as a context filter that counts a step and sizes its output. A context filter is also never run at
    compile time (Jinja folds a filter on a literal otherwise: `{{ 'x' | center(3000000000) }}`)."""
    kind = getattr(getattr(f, "jinja_pass_arg", None), "name", None)
    name = getattr(f, "__name__", "filter").removeprefix("do_")

    @jinja2.pass_context
    def bounded(context: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        env.step(_CALL_STEPS)
        _check_call(f, args, kwargs, f"the `{name}` filter")
        _filter_precheck(name, value, args, kwargs)
        lead = {"context": (context,), "eval_context": (context.eval_ctx,), "environment": (context.environment,)}
        return _bounded(f(*lead.get(kind, ()), value, *args, **kwargs), f"the `{name}` filter")

    bounded.__name__ = name
    return bounded


def _no_lipsum(*args: Any, **kwargs: Any) -> str:
    # Jinja's lorem-ipsum generator is a Python loop of any length the template asks for; no chat template uses it.
    raise jinja2.exceptions.SecurityError("lipsum is not available to chat templates")


def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _bounded_filter(env, _tojson)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def template_variables(value: Any, source: str) -> dict[str, Any]:
    """Chat template variables a user gives (`{"enable_thinking": false}` for Qwen3 and SmolLM3, what
    `apply_chat_template(**kwargs)` and OpenAI-compatible servers' `chat_template_kwargs` pass), checked: an
    object whose keys are names and not render()'s own. `source` names where they came from."""
    if not isinstance(value, Mapping):
        raise ChatTemplateError(f"{source} must be an object of template variables, got {type(value).__name__}")
    bad = sorted(repr(k) for k in value if not isinstance(k, str) or not k.isidentifier() or k in RESERVED_VARIABLES)
    if bad:
        raise ChatTemplateError(
            f"{source}: {', '.join(bad)} cannot be set (not a name, or one of the conversation's own: "
            f"{', '.join(sorted(RESERVED_VARIABLES))})"
        )
    return dict(value)


class ChatTemplate:
    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None, *, origin: str = "chat template"):
        self.source = source
        self.origin = origin
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if isinstance(v, str)}
        self.variables: dict[str, Any] = {}  # every render's defaults (with_variables)
        self.clock: datetime | None = None  # what strftime_now reads (at); None: the time of each render
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"{origin} has a syntax error on line {e.lineno}: {e.message}") from None

    @classmethod
    def for_bundle(cls, bundle: Bundle) -> ChatTemplate:
        """The bundle's template; a bundle exported without one refuses chat (raw completion still works)."""
        spec = bundle.manifest.tokenizer
        if spec.chat_template is None:
            raise ChatTemplateError(
                f"bundle '{bundle.path}' has no chat template (its checkpoint had none): use a raw prompt "
                "(--prompt), or re-export it with edge-export --chat-template FILE"
            )
        path = bundle.path / spec.chat_template
        try:
            if path.stat().st_size > _MAX_TEMPLATE_BYTES:
                raise BundleError(f"'{path}' is larger than {_MAX_TEMPLATE_BYTES} bytes; not a chat template")
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise BundleError(f"cannot read the chat template '{path}': {e}") from e
        return cls(source, spec.special_tokens, origin=f"the chat template of '{bundle.path}'")

    def with_variables(self, variables: Mapping[str, Any], source: str = "chat template variables") -> ChatTemplate:
        """This template with `variables` as every render's defaults (a render's own still win)."""
        out = copy.copy(self)
        out.variables = {**self.variables, **template_variables(variables, source)}
        return out

    def at(self, when: datetime) -> ChatTemplate:
        """This template with `strftime_now` reading `when`, not the clock. A conversation rendered turn after
        turn must render its earlier turns alike for the ring to be reused: Llama 3.2's and SmolLM3's system
        header carries today's date, so at midnight a long conversation would otherwise be all new to the
        session and be fed again from its first token."""
        out = copy.copy(self)
        out.clock = when
        return out

    def render(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **variables: Any,
    ) -> str:
        """The prompt text for `messages`; with `add_generation_prompt`, ending where the assistant's reply begins."""
        chat = normalize_messages(messages)
        budget = self._template.environment.budget  # type: ignore[attr-defined]
        budget.steps, budget.check_at = MAX_RENDER_STEPS, MAX_RENDER_STEPS
        budget.deadline = time.monotonic() + MAX_RENDER_SECONDS
        out: list[str] = []
        try:
            size = 0
            for piece in self._template.generate(
                messages=chat,
                tools=None if tools is None else [dict(t) for t in tools],
                documents=None if documents is None else [dict(d) for d in documents],
                add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **self._clock(), **self.variables, **variables},
            ):
                size += len(piece)
                if size > MAX_RENDER_CHARS:
                    raise _Limit(f"renders over {MAX_RENDER_CHARS} characters")
                out.append(piece)
                if len(out) > 4096:  # millions of one-character pieces would take 50 bytes each
                    out[:] = ["".join(out)]
        except _Limit as e:
            raise ChatTemplateLimitError(f"{self.origin} {e}; refusing it") from None
        except RecursionError:  # a macro or a recursive loop that calls itself without end
            raise ChatTemplateLimitError(f"{self.origin} recursed past Python's stack limit; refusing it") from None
        except jinja2.TemplateError as e:  # raise_exception(), undefined names, sandbox refusals
            raise ChatTemplateError(f"{self.origin} refused the conversation: {_one_line(e)}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as e:
            why = f"{type(e).__name__}: {_one_line(e)}"
            raise ChatTemplateError(f"{self.origin} failed on this conversation: {why}") from None
        finally:
            budget.steps = 0  # nothing of this template runs outside a render
        return "".join(out)

    def _clock(self) -> dict[str, Any]:
        when = self.clock
        if when is None:
            return {}  # the environment's strftime_now: the time of this render
        return {"strftime_now": lambda fmt: when.strftime(fmt)}  # a render's variable hides the global


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:500]


def check_template_bounds(
    source: str, special_tokens: Mapping[str, str] | None = None, *, origin: str = "chat template"
) -> None:
    """What every use of `source` would refuse, found before a bundle is written with it: a syntax error, or a
    render over the bounds on a short conversation (a template that loops, or builds a huge string whatever the
    messages). A template's refusal of that conversation itself (a role it does not take, raise_exception) is
    not an error here: other conversations may suit it. ChatTemplateError naming `origin`."""
    template = ChatTemplate(source, special_tokens, origin=origin)
    for conversation in (_PROBE, _PROBE[1:]):
        try:
            template.render(list(conversation), add_generation_prompt=True)
            return
        except ChatTemplateLimitError:
            raise
        except ChatTemplateError:
            continue


_PROBE = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hello, how can I help you today?"},
    {"role": "user", "content": "What is the capital of France?"},
)


def normalize_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Check a conversation and bring it to what templates expect.

    Keys whose value is None are dropped (as `transformers` does: templates render a literal 'None' otherwise);
    OpenAI-style content parts that are all text become one string; anything else is refused by name.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError("messages must be a list of {'role': ..., 'content': ...} objects")
    if not messages:
        raise ChatTemplateError("the conversation is empty: give at least one message")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"message {i} must be an object with 'role' and 'content', got {message!r:.60}")
        m = {k: v for k, v in message.items() if v is not None}
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise ChatTemplateError(f"message {i} has role {role!r:.40}; expected one of {sorted(ROLES)}")
        if "content" in m:
            m["content"] = _content_text(m["content"], i)
        elif role != "assistant" or "tool_calls" not in m:
            raise ChatTemplateError(f"message {i} ({role}) has no content")
        if "tool_calls" in m:
            _check_tool_calls(m["tool_calls"], i)
        out.append(m)
    return out


def _check_tool_calls(calls: Any, i: int) -> None:
    """OpenAI's assistant tool_calls: a list of {"function": {"name": str, "arguments": JSON text or object}}.
    Templates and tools.py read these fields; a call of another shape is the client's mistake, named here."""
    if not isinstance(calls, list):
        raise ChatTemplateError(f"message {i} tool_calls must be a list, got {type(calls).__name__}")
    for j, call in enumerate(calls):
        f = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(f, Mapping) or not isinstance(f.get("name"), str):
            shape = "{'function': {'name': ..., 'arguments': ...}}"
            raise ChatTemplateError(f"message {i} tool call {j} must be {shape}")
        args = f.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError) as e:
                raise ChatTemplateError(f"message {i} tool call {j}: 'arguments' is not JSON ({e})") from None
        if not isinstance(args, Mapping):
            raise ChatTemplateError(f"message {i} tool call {j}: 'arguments' must be a JSON object")


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) for p in content):
        kinds = {p.get("type") for p in content}
        if kinds <= {"text"} and all(isinstance(p.get("text"), str) for p in content):
            return "".join(p["text"] for p in content)
        raise ChatTemplateError(
            f"message {i} has content parts of type {sorted(map(str, kinds - {'text'}))}; this model takes text only"
        )
    kind = type(content).__name__
    raise ChatTemplateError(f"message {i} content must be a string or a list of text parts, got {kind}")


def encode_messages(
    engine: Any,
    tokenizer: Any,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> list[int]:
    """Prompt ids for `messages` through the bundle template of `engine` (an Engine or a Session): what
    `apply_chat_template(tokenize=True, **chat_template_kwargs)` gives (encoded without added special tokens:
    the template placed them). `now`: the time the template's `strftime_now` reads (ChatTemplate.at); give a
    conversation's every turn the same one."""
    bundle = getattr(engine, "engine", engine).bundle  # an Engine, or a Session's
    template = ChatTemplate.for_bundle(bundle).with_variables(chat_template_kwargs or {}, "chat_template_kwargs")
    template = template if now is None else template.at(now)
    text = template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
    return tokenizer.encode(text, add_special_tokens=False)
