"""Chat templates: a bundle's Jinja template rendered the way `transformers`' `apply_chat_template` renders it.

template = ChatTemplate.for_bundle(engine.bundle)
text = template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
ids = tokenizer.encode(text, add_special_tokens=False)   # the template wrote BOS itself where it wants one

Templates come from the Hub and are untrusted code: they run in Jinja's `ImmutableSandboxedEnvironment` with the
globals and filters `transformers` gives them (`raise_exception`, `strftime_now`, a JSON `tojson`, a
`{% generation %}` block that renders its body), and nothing else. Every failure (a syntax error, a template that
raises, a message the template cannot take) is a `ChatTemplateError` naming what went wrong.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .bundle import Bundle
from .errors import BundleError, ChatTemplateError

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


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
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
                "(--prompt), or re-export from a checkpoint whose tokenizer_config.json has a chat_template"
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
        try:
            return self._template.render(
                messages=chat,
                tools=None if tools is None else [dict(t) for t in tools],
                documents=None if documents is None else [dict(d) for d in documents],
                add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **self._clock(), **self.variables, **variables},
            )
        except jinja2.TemplateError as e:  # raise_exception(), undefined names, sandbox refusals
            raise ChatTemplateError(f"{self.origin} refused the conversation: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as e:
            raise ChatTemplateError(f"{self.origin} failed on this conversation: {type(e).__name__}: {e}") from None

    def _clock(self) -> dict[str, Any]:
        when = self.clock
        if when is None:
            return {}  # the environment's strftime_now: the time of this render
        return {"strftime_now": lambda fmt: when.strftime(fmt)}  # a render's variable hides the global


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
        out.append(m)
    return out


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
