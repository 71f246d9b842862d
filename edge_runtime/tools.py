"""Tool calls: OpenAI `tools` to the chat template, the model's call constrained, the reply as OpenAI `tool_calls`.

    reply = tools.chat(engine, tok, messages, TOOLS, tool_choice="auto")
    # {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function",
    #   "function": {"name": "move_to", "arguments": "{\"x\": 1.2, \"y\": 0.4}"}}]}, reply["finish_reason"]
    messages += [reply_message, {"role": "tool", "tool_call_id": "call_0", "content": "done"}]   # and go on

Formats recognised from the template's source:
- `hermes`: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Qwen2.5/Qwen3, Hermes 2/3, SmolLM3
  and most templates that render `tools`); also the format for templates that ignore `tools` (SmolLM2): the
  tools go in a Hermes-style system prompt and earlier calls and tool results are rendered as text.
- `llama3`: the whole reply is `{"name": ..., "parameters": {...}}` (Llama 3.1/3.2's JSON tool calling).
Other tool formats (Mistral's `[TOOL_CALLS]`, ...) are not recognised: such templates are prompted and constrained
as hermes. The call is constrained to one of the given functions with arguments valid against its `parameters`
(tool_choice "required" or a named function); "auto" lets the reply be text or calls, a call always well formed;
"none" is free text, never parsed for calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .chat import ChatTemplate
from .constrain import JSON_OPTIONS, Grammar, lark
from .errors import ConstraintError

Tool = Mapping[str, Any]


def functions(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """The `function` objects of OpenAI-style tools, checked (name, a JSON-schema `parameters`)."""
    out = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, Mapping) and t.get("type", "function") == "function" else None
        if not isinstance(f, Mapping) or not isinstance(f.get("name"), str) or not f["name"]:
            raise ConstraintError(f"tool {i} must be {{'type': 'function', 'function': {{'name': ..., ...}}}}")
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ConstraintError(f"tool {f['name']!r}: parameters must be a JSON schema object")
        out.append({**f, "parameters": dict(params)})
    if not out:
        raise ConstraintError("tools is empty: give at least one function")
    return out


def detect_format(template: ChatTemplate | None) -> str:
    source = template.source if template is not None else ""
    if "<tool_call>" in source or "tools" not in source:
        return "hermes"
    if "parameters" in source and ("<|eom_id|>" in source or "<|python_tag|>" in source or "ipython" in source):
        return "llama3"
    return "hermes"


def native_tools(template: ChatTemplate | None) -> bool:
    """Whether the template renders `tools` itself (else they go in a system prompt here)."""
    return template is not None and "tools" in template.source


def tools_prompt(fns: Sequence[Mapping[str, Any]]) -> str:
    """Hermes' tool-use system prompt (NousResearch's Hermes 2 Pro format, which Qwen2.5 follows)."""
    sigs = "\n".join(json.dumps({"type": "function", "function": dict(f)}) for f in fns)
    return (
        "You are a function calling AI model. You may call one or more functions to assist with the user query. "
        f"Here are the available tools:\n<tools>\n{sigs}\n</tools>\n"
        "For each function call, return a json object with the function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def prepare_messages(
    messages: Sequence[Mapping[str, Any]], fns: Sequence[Mapping[str, Any]], template: ChatTemplate | None
) -> list[dict[str, Any]]:
    """For a template that ignores `tools`: the tools prompt in the system message, assistant tool_calls and
    tool results as the text the model would have written and read."""
    if native_tools(template):
        return [dict(m) for m in messages]
    out: list[dict[str, Any]] = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [_hermes_text(c) for c in m["tool_calls"]]
            m = {"role": "assistant", "content": "\n".join([*([m["content"]] if m.get("content") else []), *calls])}
        elif m.get("role") == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m.get('content', '')}\n</tool_response>"}
        out.append(m)
    prompt = tools_prompt(fns)
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{out[0].get('content', '')}\n\n{prompt}"}
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out


def _hermes_text(call: Mapping[str, Any]) -> str:
    f = call.get("function", {})
    args = f.get("arguments", "{}")
    args = json.loads(args) if isinstance(args, str) else args
    return "<tool_call>\n" + json.dumps({"name": f.get("name"), "arguments": args}) + "\n</tool_call>"


def call_schema(fns: Sequence[Mapping[str, Any]], fmt: str) -> dict[str, Any]:
    key = "parameters" if fmt == "llama3" else "arguments"
    alts = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, key: f["parameters"]},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for f in fns
    ]
    return {**(alts[0] if len(alts) == 1 else {"anyOf": alts}), "x-guidance": JSON_OPTIONS}


def call_grammar(fns: Sequence[Mapping[str, Any]], tool_choice: Any, fmt: str, parallel: bool = True) -> Grammar | None:
    """The constraint for `tool_choice`: None for "none"; a call (more than one if `parallel`, as OpenAI's
    parallel_tool_calls) for "required" or a named function; text or calls for "auto"."""
    if tool_choice == "none":
        return None
    if isinstance(tool_choice, Mapping):  # {"type": "function", "function": {"name": ...}}
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [f for f in fns if f["name"] == name]
        if not chosen:
            raise ConstraintError(f"tool_choice names {name!r:.40}, which is not among the tools")
        fns, tool_choice = chosen, "required"
    if tool_choice not in ("auto", "required"):
        raise ConstraintError(f"tool_choice must be 'auto', 'none', 'required' or a function, got {tool_choice!r:.40}")
    schema = json.dumps(call_schema(fns, fmt))
    if fmt == "llama3":
        calls = f"call: %json {schema}"
        start = "start: call" if tool_choice == "required" else "start: TEXT | call\nTEXT: /[^{](.|\\n)*/"
        return lark(f"{start}\n{calls}")
    calls = 'calls: tool_call ("\\n" tool_call)*' if parallel else "calls: tool_call"
    rules = f'{calls}\ntool_call: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json {schema}'
    # Free text may not start with "<": a reply that begins a tag is a tool call, and that one is constrained.
    start = "start: calls" if tool_choice == "required" else "start: TEXT | calls\nTEXT: /[^<](.|\\n)*/"
    return lark(f"{start}\n{rules}")


_HERMES = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def parse_tool_calls(text: str, fmt: str = "hermes") -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI tool_calls) from a reply; calls that do not parse as {"name", "arguments"} are left in
    the content (only unconstrained output has such)."""
    found: list[tuple[str, Any]] = []
    content = text
    if fmt == "llama3":
        obj = _json_object(text.strip())
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get("parameters"), dict):
            found.append((obj["name"], obj["parameters"]))
            content = ""
    else:
        kept = []
        last = 0
        for m in _HERMES.finditer(text):
            obj = _json_object(m.group(1))
            if isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get("arguments"), dict):
                found.append((obj["name"], obj["arguments"]))
                kept.append(text[last : m.start()])
                last = m.end()
        content = "".join([*kept, text[last:]]) if found else text
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for i, (name, args) in enumerate(found)
    ]
    content = content.strip()
    return (content or None), calls


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def chat(
    engine: Any,
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Tool],
    tool_choice: Any = "auto",
    config: Any = None,
    *,
    parallel_tool_calls: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One assistant turn with tools: {"role": "assistant", "content", "tool_calls", "finish_reason"} (OpenAI's
    message, finish_reason "tool_calls" when there are calls). One call per turn unless `parallel_tool_calls`
    (OpenAI defaults it to true; a 135M model allowed several repeats its call until max_tokens)."""
    from .generate import generate

    fns = functions(tools)
    bundle = getattr(engine, "engine", engine).bundle
    template = ChatTemplate.for_bundle(bundle).with_variables(chat_template_kwargs or {}, "chat_template_kwargs")
    fmt = detect_format(template)
    grammar = call_grammar(
        fns, tool_choice, fmt, parallel_tool_calls
    )  # a bad tool or tool_choice fails before anything runs
    chat_messages = prepare_messages(messages, fns, template)
    rendered = template.render(chat_messages, tools=[{"type": "function", "function": f} for f in fns])
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    result = generate(engine, tokenizer, ids, config, grammar=grammar)
    content, calls = (result.text, []) if tool_choice == "none" else parse_tool_calls(result.text, fmt)
    if tool_choice == "none":
        content = content or None
    reply: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        reply["tool_calls"] = calls
    reason = result.stats.finish_reason
    reply["finish_reason"] = "tool_calls" if calls and reason == "eos" else {"eos": "stop"}.get(reason, reason)
    return reply
