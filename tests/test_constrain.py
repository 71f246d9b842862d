"""Structured output (constrain.py): constrained output always parses and validates, regex / choice / Lark are
honoured, forced tokens are fed as chunks, and a bad constraint is a one-line error before anything runs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from edge_runtime import constrain
from edge_runtime.engine import load
from edge_runtime.errors import ConstraintError
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.generate import GenerationConfig, generate
from edge_runtime.sampling import SamplingParams
from edge_runtime.session import Session
from edge_runtime.tokenizer import Tokenizer

from .tiny_models import demo_with_template

llguidance = pytest.importorskip("llguidance")
llg_numpy = pytest.importorskip("llguidance.numpy")
jsonschema = pytest.importorskip("jsonschema")

# A robot command: nested objects, enums, bounded numbers, a bounded array.
ROBOT = {
    "type": "object",
    "properties": {
        "action": {"enum": ["move_to", "pick", "place", "stop"]},
        "target": {
            "type": "object",
            "properties": {
                # multipleOf bounds the digits (a free fraction lets a sampled model run on to max_tokens);
                # 0.25, not 0.01: jsonschema checks it in binary floating point, where -1.15 is no multiple of 0.01.
                "x": {"type": "number", "minimum": -2.0, "maximum": 2.0, "multipleOf": 0.25},
                "y": {"type": "number", "minimum": -2.0, "maximum": 2.0, "multipleOf": 0.25},
            },
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        "speed": {"type": "integer", "minimum": 1, "maximum": 5},
        "tags": {"type": "array", "items": {"enum": ["slow", "careful", "now"]}, "maxItems": 2},
    },
    "required": ["action", "target", "speed", "tags"],
    "additionalProperties": False,
}
PROMPT = "ROMEO.\nWhat light"


# ChatML that ignores `tools`, as SmolLM2's does: tools.py then prompts for them itself.
CHATML = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    ck = demo_with_template(tmp_path_factory.mktemp("ck") / "demo", CHATML)
    out = tmp_path_factory.mktemp("b") / "demo"
    export(ExportOptions(checkpoint=ck, out=out, window=200))
    engine = load(out)
    return engine, Tokenizer.for_engine(engine)


def _sampled(seed: int, n: int = 120) -> GenerationConfig:
    # Temperature 1 on a Shakespeare model: free output is never JSON; every bit of structure is the mask's.
    return GenerationConfig(max_tokens=n, sampling=SamplingParams(temperature=1.0, seed=seed))


def test_json_schema_output_always_validates(demo):
    engine, tok = demo
    grammar = constrain.json_schema(ROBOT)
    free = generate(engine, tok, PROMPT, _sampled(0, 40)).text
    with pytest.raises(json.JSONDecodeError):
        json.loads(free)
    for seed in range(6):
        r = generate(engine, tok, PROMPT, _sampled(seed), grammar=grammar)
        assert r.stats.finish_reason == "eos", r.text
        jsonschema.validate(json.loads(r.text), ROBOT)


def test_response_format_forms(demo):
    engine, tok = demo
    rf = {"type": "json_schema", "json_schema": {"name": "robot", "schema": ROBOT, "strict": True}}
    r = generate(engine, tok, PROMPT, _sampled(7), response_format=rf)
    jsonschema.validate(json.loads(r.text), ROBOT)
    r = generate(engine, tok, PROMPT, _sampled(8, 60), response_format={"type": "json_object"})
    if r.stats.finish_reason == "eos":  # any object may run past 60 tokens; one that ended must parse
        assert isinstance(json.loads(r.text), dict)
    else:
        assert r.text.startswith("{")
    free = generate(engine, tok, PROMPT, _sampled(9, 8), response_format={"type": "text"})
    assert free.text == generate(engine, tok, PROMPT, _sampled(9, 8)).text


def test_regex_choice_and_lark_are_honoured(demo):
    engine, tok = demo
    pattern = r"[A-Z][a-z]{2,6} [0-9]{1,3}(\.[0-9])?"
    lark = 'start: "go " DIR " " NUM\nDIR: "north" | "south"\nNUM: /[1-9][0-9]?/'
    options = ["Juliet", "Romeo", "Mercutio", "Tybalt"]
    for seed in range(4):
        text = generate(engine, tok, PROMPT, _sampled(seed, 30), grammar=constrain.regex(pattern)).text
        assert re.fullmatch(pattern, text), text
        assert generate(engine, tok, PROMPT, _sampled(seed, 30), grammar=constrain.choice(options)).text in options
        text = generate(engine, tok, PROMPT, _sampled(seed, 30), grammar=constrain.lark(lark)).text
        assert re.fullmatch(r"go (north|south) [1-9][0-9]?", text), text


def test_mask_matches_llguidance_reference(demo):
    engine, _ = demo
    c = constrain.Constraint.for_engine(engine, constrain.json_schema(ROBOT))
    tokenizer = constrain.lltokenizer(engine)
    rng = np.random.default_rng(0)
    reply: list[int] = []
    for _ in range(12):  # walk a few steps so the masks mix allowed and banned words
        reply += c.forced_tokens(reply)
        logits = rng.standard_normal(engine.manifest.model.vocab_size).astype(np.float32)
        ref = logits.copy()
        m = llguidance.LLMatcher(tokenizer, c.grammar.text, log_level=0)
        assert m.consume_tokens(reply)
        bitmask = llg_numpy.allocate_token_bitmask(1, tokenizer.vocab_size)
        llg_numpy.fill_next_token_bitmask(m, bitmask)
        llg_numpy.apply_token_bitmask_inplace(ref[None], bitmask)
        ours = c(reply, logits.copy())
        assert np.array_equal(ours, ref)
        if m.is_stopped():
            break
        reply.append(int(np.argmax(ours)))


def test_forced_tokens_are_fed_as_chunks_not_decoded(demo, monkeypatch):
    engine, tok = demo
    decodes = {"n": 0}
    real = engine.decode

    def counting(token):
        decodes["n"] += 1
        return real(token)

    monkeypatch.setattr(engine, "decode", counting)
    r = generate(engine, tok, PROMPT, _sampled(3), grammar=constrain.json_schema(ROBOT))
    jsonschema.validate(json.loads(r.text), ROBOT)
    # Keys, braces, quotes, the rest of each enum value: a large share of a schema's tokens are forced.
    assert decodes["n"] < 0.7 * len(r.token_ids), (decodes["n"], len(r.token_ids))


def test_session_constrained_turns_and_rollback_inside_a_forced_run(demo):
    engine, tok = demo
    session = Session(engine)
    grammar = constrain.json_schema(ROBOT)
    steps = list(session.send(tok.encode(PROMPT), SamplingParams(temperature=1.0, seed=1), grammar=grammar))
    jsonschema.validate(json.loads(tok.decode([s.token for s in steps])), ROBOT)
    before = session.length
    ids = tok.encode("JULIET.\nO", add_special_tokens=False)
    stream = session.send(ids, grammar=grammar)
    first = next(stream)  # `{"action": "` is forced: fed with the turn, but only its first token was taken
    stream.close()
    assert session.length == before + len(ids) + 1 and first.token == steps[0].token
    assert session.pending is None


BAD = [
    (lambda: constrain.json_schema("{not json"), "invalid JSON schema"),
    (lambda: constrain.json_schema({"type": "strin"}), "invalid JSON schema"),
    (lambda: constrain.json_schema({"type": "integer", "minimum": 5, "maximum": 1}), "unsatisfiable JSON schema"),
    (lambda: constrain.json_schema({"allOf": [{"type": "string"}, {"type": "integer"}]}), "unsatisfiable"),
    (lambda: constrain.json_schema({"type": "object", "if": {}, "then": {}}), "unsupported JSON schema feature"),
    (lambda: constrain.lark("start: ( "), "invalid Lark grammar"),
    (lambda: constrain.regex("a(b"), "invalid regular expression"),
    (lambda: constrain.choice([]), "invalid choice"),
    (lambda: constrain.from_response_format({"type": "xml"}), "response_format type"),
]


@pytest.mark.parametrize("make,message", BAD, ids=[m for _, m in BAD])
def test_bad_constraints_are_one_line_errors(make, message):
    with pytest.raises(ConstraintError, match=message) as e:
        make()
    assert "\n" not in str(e.value)


def test_a_bad_constraint_generates_nothing(demo, monkeypatch):
    engine, tok = demo
    fed = []
    monkeypatch.setattr(engine, "prefill", lambda ids, **kw: fed.append(ids))
    unsatisfiable = {"type": "number", "minimum": 3, "maximum": 1}
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": unsatisfiable}}
    with pytest.raises(ConstraintError, match="unsatisfiable"):
        generate(engine, tok, PROMPT, response_format=bad)
    with pytest.raises(ConstraintError, match="not both"):
        generate(engine, tok, PROMPT, response_format={"type": "json_object"}, grammar=constrain.regex("a"))
    assert fed == []


@pytest.fixture(scope="module")
def demo_dir(demo):
    return demo[0].bundle.path


def _run(bundle, *args):
    from click.testing import CliRunner

    from edge_runtime.cli.run import main as run_cli

    common = ["--bundle", str(bundle), "--target", "x86", "--prompt", PROMPT, "--temperature", "1", "--seed", "2"]
    return CliRunner().invoke(run_cli, [*common, *args])


def test_cli_constraints(demo_dir, tmp_path):
    schema = tmp_path / "robot.json"
    schema.write_text(json.dumps(ROBOT))
    r = _run(demo_dir, "--json-schema", str(schema), "--json", "--max-tokens", "120")
    assert r.exit_code == 0, r.output
    jsonschema.validate(json.loads(json.loads(r.stdout.strip().splitlines()[-1])["text"]), ROBOT)
    r = _run(demo_dir, "--choice", "yes", "--choice", "no", "--json")
    assert json.loads(r.stdout.strip().splitlines()[-1])["text"] in ("yes", "no")
    r = _run(demo_dir, "--regex", "[0-9]{4}", "--json")
    assert re.fullmatch("[0-9]{4}", json.loads(r.stdout.strip().splitlines()[-1])["text"])


def test_cli_bad_constraints_are_one_line(demo_dir, tmp_path):
    (tmp_path / "bad.json").write_text('{"type": "integer", "minimum": 9, "maximum": 1}')
    (tmp_path / "bad.lark").write_text("start: ( ")
    for args, message in [
        (["--json-schema", str(tmp_path / "bad.json")], "unsatisfiable JSON schema"),
        (["--grammar", str(tmp_path / "bad.lark")], "invalid Lark grammar"),
        (["--regex", "a(b"], "invalid regular expression"),
        (["--regex", "a", "--choice", "b"], "give one of"),
        (["--json-schema", str(tmp_path / "missing.json")], "cannot read"),
    ]:
        r = _run(demo_dir, *args)
        assert r.exit_code == 1, r.output
        assert r.output.count("\n") == 1 and message in r.output, r.output


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Verona", "Mantua"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
MOVE = {
    "type": "function",
    "function": {"name": "move_to", "parameters": ROBOT["properties"]["target"]},
}


def _check_calls(reply, names):
    assert reply["finish_reason"] == "tool_calls", reply
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, MOVE)}
    for call in reply["tool_calls"]:
        assert call["type"] == "function" and call["function"]["name"] in names
        jsonschema.validate(json.loads(call["function"]["arguments"]), by_name[call["function"]["name"]])


def test_tool_calls_constrained_and_parsed_into_openai_tool_calls(demo):
    from edge_runtime import tools

    engine, tok = demo
    messages = [{"role": "user", "content": "Will it rain in Verona?"}]
    for seed in range(2):
        reply = tools.chat(engine, tok, messages, [WEATHER, MOVE], "required", _sampled(seed, 200))
        _check_calls(reply, {"get_weather", "move_to"})
    named = {"type": "function", "function": {"name": "move_to"}}
    reply = tools.chat(engine, tok, messages, [WEATHER, MOVE], named, _sampled(5, 200))
    _check_calls(reply, {"move_to"})
    # The round trip: the call and its result go back, and the conversation continues.
    messages += [
        {"role": "assistant", "content": None, "tool_calls": reply["tool_calls"]},
        {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "arrived"},
    ]
    for choice in ("auto", "none"):
        after = tools.chat(engine, tok, messages, [WEATHER, MOVE], choice, _sampled(6, 20))
        assert after["role"] == "assistant" and (choice == "auto" or "tool_calls" not in after)
        if "tool_calls" in after:
            _check_calls(after, {"get_weather", "move_to"})


def test_parse_tool_calls_formats():
    from edge_runtime import tools

    text = (
        'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
        '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    )
    content, calls = tools.parse_tool_calls(text)
    assert content == "Sure." and [c["function"]["name"] for c in calls] == ["f", "g"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1} and calls[1]["id"] == "call_1"
    assert tools.parse_tool_calls("<tool_call>{broken</tool_call>") == ("<tool_call>{broken</tool_call>", [])
    content, calls = tools.parse_tool_calls('{"name": "f", "parameters": {"x": 2}}', "llama3")
    assert content is None and calls[0]["function"]["arguments"] == '{"x": 2}'
    with pytest.raises(ConstraintError, match="not among the tools"):
        tools.call_grammar(tools.functions([WEATHER]), {"type": "function", "function": {"name": "nope"}}, "hermes")
    with pytest.raises(ConstraintError, match="unsatisfiable"):
        bad = {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "integer", "minimum": 2, "maximum": 1}},
        }
        tools.call_grammar(tools.functions([bad]), "required", "hermes")


def test_serve_response_format(demo, tmp_path):
    """edge-serve with the official client: json_schema output validates; a bad schema is a 400, nothing run."""
    openai = pytest.importorskip("openai")
    from .serve_util import Server

    server = Server(demo[0].bundle.path, "--target", "x86", log=tmp_path / "serve.log")
    try:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        rf = {"type": "json_schema", "json_schema": {"name": "robot", "schema": ROBOT}}
        messages = [{"role": "user", "content": "Move."}]
        r = client.chat.completions.create(
            model="demo", messages=messages, response_format=rf, max_tokens=120, temperature=1.0, seed=4
        )
        jsonschema.validate(json.loads(r.choices[0].message.content), ROBOT)
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "if": {}}}}
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="demo", messages=messages, response_format=bad)
        assert "unsupported JSON schema feature" in str(e.value) and e.value.body["param"] == "response_format"
        _serve_tool_round_trip(openai, client)
    finally:
        server.stop()


def _serve_tool_round_trip(openai, client):
    """tools through edge-serve: the call comes back as tool_calls (whole and streamed), the tool's result goes
    back and the conversation continues; a tool_choice naming no tool is a 400."""
    messages = [{"role": "user", "content": "Will it rain in Verona?"}]
    kw = {"model": "demo", "tools": [MOVE], "max_tokens": 200, "temperature": 1.0, "seed": 3}  # the window: 508
    r = client.chat.completions.create(messages=messages, tool_choice="required", **kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, MOVE)}
    jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])
    chunks = list(client.chat.completions.create(messages=messages, tool_choice="required", stream=True, **kw))
    streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in streamed] == [call.function.name]  # same seed, same call
    assert streamed[0].function.arguments == call.function.arguments
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "light rain"},
    ]
    after = client.chat.completions.create(messages=messages, tool_choice="none", **{**kw, "max_tokens": 12})
    assert after.choices[0].message.tool_calls is None and after.choices[0].message.role == "assistant"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(messages=messages, tool_choice={"type": "function", "function": {"name": "x"}},
                                       **kw)  # fmt: skip
    assert e.value.body["param"] == "tool_choice"


def test_real_model_robot_commands_validate(real_int4_bundle):
    """SmolLM2-135M-Instruct int4: constrained replies validate, and a required tool call parses (the full
    50-prompt figure, free vs constrained, is scripts/structured_eval.py's)."""
    from edge_runtime import tools

    engine = load(real_int4_bundle)
    tok = Tokenizer.for_engine(engine)
    rf = {"type": "json_schema", "json_schema": {"name": "robot", "schema": ROBOT}}
    config = GenerationConfig(max_tokens=96)
    for task in ("Pick up the cup at x 1.25, y 0.5, speed 3.", "Stop now, slowly, at (0, -1)."):
        messages = [{"role": "user", "content": task}]
        jsonschema.validate(
            json.loads(generate(engine, tok, messages=messages, config=config, response_format=rf).text), ROBOT
        )
    reply = tools.chat(engine, tok, messages, [WEATHER, MOVE], "required", config)
    _check_calls(reply, {"get_weather", "move_to"})
