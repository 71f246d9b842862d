"""`edge-run`'s ways in: --prompt / --prompt-file / stdin, --message through the chat template, --chat turns."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from edge_runtime.cli.run import main as run_cli
from edge_runtime.exporters.export import ExportOptions, export

from .tiny_models import demo_with_template

TEMPLATE = (
    "{% for m in messages %}{{ 'ROMEO' if m['role'] == 'assistant' else m['role'] | upper }}.\n"
    "{{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}ROMEO.\n{% endif %}"
    # Qwen3's and SmolLM3's thinking switch, in miniature (--chat-template-kwargs)
    "{% if add_generation_prompt and enable_thinking is defined and not enable_thinking %}[aside]\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_bundle(tmp_path_factory):
    """The demo model with a chat template of its own (it ships none: it is not an instruct model)."""
    ck = demo_with_template(tmp_path_factory.mktemp("ck") / "demo", TEMPLATE)
    out = tmp_path_factory.mktemp("b") / "b"
    export(ExportOptions(checkpoint=ck, out=out, window=100))
    return out


def _run(bundle, *args, input=None):
    """edge-run greedy (the model's defaults sample) unless the arguments say otherwise: the last flag wins."""
    return CliRunner().invoke(
        run_cli, ["--bundle", str(bundle), "--target", "x86", "--temperature", "0", *args], input=input
    )


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_prompt_from_stdin_file_and_argument_agree(chat_bundle, tmp_path):
    text = "JULIET.\nO Romeo"
    (tmp_path / "p.txt").write_text(text, encoding="utf-8")
    common = ["--max-tokens", "6", "--json"]
    by_arg = _json(_run(chat_bundle, "--prompt", text, *common))
    by_dash = _json(_run(chat_bundle, "--prompt", "-", *common, input=text))
    by_file = _json(_run(chat_bundle, "--prompt-file", str(tmp_path / "p.txt"), *common))
    assert by_arg["prompt_token_ids"] == by_dash["prompt_token_ids"] == by_file["prompt_token_ids"]
    assert by_arg["token_ids"] == by_dash["token_ids"] == by_file["token_ids"]


def test_piped_stdin_is_the_prompt(chat_bundle):
    """A real pipe (CliRunner's stdin is no file descriptor, so this needs a process)."""
    cmd = [sys.executable, "-m", "edge_runtime.cli.run", "--bundle", str(chat_bundle), "--target", "x86"]
    out = subprocess.run([*cmd, "--max-tokens", "4", "--json"], input=b"KING.\nNow", capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    piped = json.loads(out.stdout)
    direct = _json(_run(chat_bundle, "--prompt", "KING.\nNow", "--max-tokens", "4", "--json"))
    assert piped["prompt_token_ids"] == direct["prompt_token_ids"]


def test_message_goes_through_the_template(chat_bundle):
    from edge_runtime.bundle import open_bundle
    from edge_runtime.chat import ChatTemplate
    from edge_runtime.tokenizer import Tokenizer

    b = open_bundle(chat_bundle)
    tok = Tokenizer(b.tokenizer_file, b.manifest.tokenizer)
    messages = [{"role": "system", "content": "Speak in verse."}, {"role": "user", "content": "Who art thou?"}]
    expected = tok.encode(ChatTemplate.for_bundle(b).render(messages), add_special_tokens=False)
    args = ["--message", "Who art thou?", "--system", "Speak in verse.", "--max-tokens", "3", "--json"]
    got = _json(_run(chat_bundle, *args))
    assert got["prompt_token_ids"] == expected
    plain = _run(chat_bundle, "--message", "Who art thou?", "--max-tokens", "3")
    assert plain.exit_code == 0 and "USER." not in plain.stdout  # the rendered prompt is not echoed


def test_chat_from_a_pipe_prints_one_object_per_turn(chat_bundle):
    lines = "Good morrow\n\n/reset\nGood morrow\nAnd thou?\n"
    result = _run(chat_bundle, "--chat", "--json", "--max-tokens", "5", input=lines)
    assert result.exit_code == 0, result.output
    objs = [json.loads(x) for x in result.stdout.strip().splitlines()]
    assert [o.get("turn") for o in objs] == [1, None, 1, 2]
    assert objs[1] == {"notice": "conversation reset"}
    assert objs[0]["text"] == objs[2]["text"]  # greedy, the same first turn after /reset
    assert objs[2]["stats"]["cached_tokens"] == 0
    # The second turn reuses the ring: only the new message (and what the template adds around it) is fed.
    second = objs[3]["stats"]
    assert second["cached_tokens"] > 0 and second["prompt_tokens"] < objs[2]["stats"]["prompt_tokens"] + 5


def test_chat_turns_equal_a_fresh_prefill_of_the_conversation(chat_bundle):
    """What the session reuses changes nothing: turn 2's reply equals one --message over the whole conversation."""
    chat = _run(chat_bundle, "--chat", "--json", "--max-tokens", "6", input="Good morrow\nAnd thou?\n")
    first, second = (json.loads(x) for x in chat.stdout.strip().splitlines())
    from edge_runtime.bundle import open_bundle
    from edge_runtime.chat import ChatTemplate
    from edge_runtime.engine import load
    from edge_runtime.generate import GenerationConfig, generate
    from edge_runtime.tokenizer import Tokenizer

    engine = load(chat_bundle)
    tok = Tokenizer.for_engine(engine)
    messages = [
        {"role": "user", "content": "Good morrow"},
        {"role": "assistant", "content": first["text"]},
        {"role": "user", "content": "And thou?"},
    ]
    ids = tok.encode(ChatTemplate.for_bundle(open_bundle(chat_bundle)).render(messages), add_special_tokens=False)
    assert generate(engine, tok, ids, GenerationConfig(max_tokens=6)).text == second["text"]


def test_chat_save_and_load(chat_bundle, tmp_path):
    snap = tmp_path / "conv.snap"
    first = _run(chat_bundle, "--chat", "--json", "--max-tokens", "4", input=f"Good morrow\n/save {snap}\n")
    assert first.exit_code == 0, first.output
    assert snap.is_file() and (tmp_path / "conv.snap.messages.json").is_file()
    resumed = _run(chat_bundle, "--chat", "--json", "--max-tokens", "4", input=f"/load {snap}\nAnd thou?\n")
    straight = _run(chat_bundle, "--chat", "--json", "--max-tokens", "4", input="Good morrow\nAnd thou?\n")
    r = [json.loads(x) for x in resumed.stdout.strip().splitlines()]
    s = [json.loads(x) for x in straight.stdout.strip().splitlines()]
    assert r[0]["notice"].startswith("loaded 2 messages")
    assert r[1]["text"] == s[1]["text"] and r[1]["stats"]["cached_tokens"] == s[1]["stats"]["cached_tokens"]
    # A failed /load or /save costs the command, not the conversation: one notice, and the chat goes on.
    missing = _run(
        chat_bundle, "--chat", "--json", "--max-tokens", "4",
        input=f"Good morrow\n/load {tmp_path / 'nope'}\n/save {tmp_path / 'no' / 'dir' / 'x'}\nAnd thou?\n",
    )  # fmt: skip
    assert missing.exit_code == 0, missing.output
    m = [json.loads(x) for x in missing.stdout.strip().splitlines()]
    assert m[1]["notice"].startswith("/load failed: cannot read the messages")
    assert m[2]["notice"].startswith("/save failed: ")
    assert m[3]["text"] == s[1]["text"] and m[3]["turn"] == 2  # the conversation was kept


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--prompt", "a", "--message", "b"], "not --prompt and --message"),
        (["--system", "s"], "--system goes with --message"),
        (["--prompt", "\udcff\udcfe"], "--prompt is not valid UTF-8"),
        (["--message", "ok", "--system", "\udcff"], "--system is not valid UTF-8"),
        (["--chat", "--prompt", "x"], "--chat reads its messages"),
        (["--prompt-file", "/nonexistent/p.txt"], "cannot read --prompt-file"),
        (["--max-tokens", "0"], "max_tokens must be >= 1, got 0"),
        (["--message", "hi", "--max-tokens", "0"], "max_tokens must be >= 1, got 0"),
    ],
)
def test_bad_prompt_options_are_one_line(chat_bundle, args, match):
    result = _run(chat_bundle, *args)
    assert result.exit_code != 0 and match in result.output
    assert "Traceback" not in result.output


def test_invalid_utf8_file_and_stdin_are_one_line(chat_bundle, tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe")
    for args, stdin in ((["--prompt-file", str(tmp_path / "bad.txt")], None), (["--prompt", "-"], b"\xc3(")):
        result = _run(chat_bundle, *args, input=stdin)
        assert result.exit_code != 0 and "not valid UTF-8" in result.output


def test_message_without_a_template_is_refused_and_raw_prompts_still_work(tied_bundle):
    refused = _run(tied_bundle, "--message", "hi")
    assert refused.exit_code != 0 and "has no chat template" in refused.output
    assert _run(tied_bundle, "--prompt", "hi", "--max-tokens", "2").exit_code == 0


def test_python_api_takes_messages(chat_bundle):
    from edge_runtime.chat import encode_messages
    from edge_runtime.engine import load
    from edge_runtime.errors import EdgeRuntimeError
    from edge_runtime.generate import GenerationConfig, generate
    from edge_runtime.session import Session
    from edge_runtime.tokenizer import Tokenizer

    engine = load(chat_bundle)
    tok = Tokenizer.for_engine(engine)
    messages = [{"role": "user", "content": "Who art thou?"}]
    config = GenerationConfig(max_tokens=5)
    by_messages = generate(engine, tok, messages=messages, config=config)
    by_ids = generate(engine, tok, encode_messages(engine, tok, messages), config)
    assert by_messages.token_ids == by_ids.token_ids
    assert by_messages.prompt_token_ids == by_ids.prompt_token_ids
    assert generate(Session(engine), tok, messages=messages, config=config).token_ids == by_ids.token_ids
    with pytest.raises(EdgeRuntimeError, match="not both"):
        generate(engine, tok, "x", messages=messages)


def test_a_turn_longer_than_the_window_is_chunked_with_a_one_line_notice(tmp_path):
    """StreamingLLM takes any length; the user learns in one line that the turn's start left the window."""
    ck = demo_with_template(tmp_path / "demo", TEMPLATE)
    export(ExportOptions(checkpoint=ck, out=tmp_path / "b", window=100))
    long_line = "So foul and fair a day I have not seen. " * 20
    args = ["--chat", "--json", "--max-tokens", "3", "--window", "60"]  # the target's window would win
    result = _run(tmp_path / "b", *args, input=long_line + "\n")
    assert result.exit_code == 0, result.output
    objs = [json.loads(x) for x in result.stdout.strip().splitlines()]
    assert "exceeds the window of 60" in objs[0].get("notice", ""), result.stdout
    assert objs[1]["turn"] == 1


def test_chat_template_kwargs_reach_the_template(chat_bundle):
    """--chat-template-kwargs renders --message and every --chat turn with the variables; bad values are one line."""
    from edge_runtime.chat import ChatTemplate
    from edge_runtime.engine import load
    from edge_runtime.tokenizer import Tokenizer

    engine = load(chat_bundle)
    tok = Tokenizer.for_engine(engine)
    template = ChatTemplate.for_bundle(engine.bundle)
    messages = [{"role": "user", "content": "Good morrow"}]
    off = tok.encode(template.render(messages, enable_thinking=False), add_special_tokens=False)
    plain = tok.encode(template.render(messages), add_special_tokens=False)
    assert len(off) > len(plain)
    kwargs = ("--chat-template-kwargs", '{"enable_thinking": false}')
    one = _json(_run(chat_bundle, "--message", "Good morrow", *kwargs, "--max-tokens", "2", "--json"))
    assert one["prompt_token_ids"] == off
    assert (
        _json(_run(chat_bundle, "--message", "Good morrow", "--max-tokens", "2", "--json"))["prompt_token_ids"] == plain
    )
    chat = _run(chat_bundle, "--chat", *kwargs, "--json", "--max-tokens", "2", input="Good morrow\n")
    assert chat.exit_code == 0, chat.output
    assert json.loads(chat.stdout.strip().splitlines()[0])["stats"]["prompt_tokens"] == len(off)
    raw = _run(chat_bundle, "--prompt", "ROMEO.", *kwargs)
    assert raw.exit_code == 1 and "give --message or --chat" in raw.output, raw.output
    for value, words in (
        ("{enable_thinking: false}", "not JSON"),
        ('{"messages": []}', "cannot be set"),
        ("[1]", "object"),
    ):
        bad = _run(chat_bundle, "--message", "Hi", "--chat-template-kwargs", value)
        assert bad.exit_code == 2 and words in bad.output and "Traceback" not in bad.output, bad.output


def test_python_api_takes_chat_template_kwargs(chat_bundle):
    """generate(messages=..., chat_template_kwargs=...) prompts as the template rendered with the variables;
    with a raw prompt they are refused (a prompt has no template)."""
    from edge_runtime.chat import ChatTemplate
    from edge_runtime.engine import load
    from edge_runtime.errors import EdgeRuntimeError
    from edge_runtime.generate import GenerationConfig, generate
    from edge_runtime.tokenizer import Tokenizer

    engine = load(chat_bundle)
    tok = Tokenizer.for_engine(engine)
    messages = [{"role": "user", "content": "Good morrow"}]
    text = ChatTemplate.for_bundle(engine.bundle).render(messages, enable_thinking=False)
    config = GenerationConfig(max_tokens=2)
    got = generate(engine, tok, messages=messages, chat_template_kwargs={"enable_thinking": False}, config=config)
    assert got.prompt_token_ids == tok.encode(text, add_special_tokens=False)
    with pytest.raises(EdgeRuntimeError, match="give messages"):
        generate(engine, tok, "ROMEO.", config, chat_template_kwargs={"enable_thinking": False})


# A header that changes at every render unless the conversation's clock is pinned (a date at midnight, sped up).
CLOCK_TEMPLATE = "NOW {{ strftime_now('%H:%M:%S.%f') }}\n\n" + TEMPLATE


def test_a_dated_header_does_not_make_every_turn_new(tmp_path):
    """--chat renders every turn at the time the conversation began (/reset: a new one; /load: the saved one),
    so a template whose header carries the time keeps the ring from turn to turn and across /save and /load."""
    ck = demo_with_template(tmp_path / "demo", CLOCK_TEMPLATE)
    bundle = tmp_path / "b"
    export(ExportOptions(checkpoint=ck, out=bundle, window=100))
    snap = tmp_path / "conv.snap"
    chat = _run(bundle, "--chat", "--json", "--max-tokens", "3", input=f"Good morrow\nAnd thou?\n/save {snap}\n")
    assert chat.exit_code == 0, chat.output
    first, second, _ = (json.loads(x) for x in chat.stdout.strip().splitlines())
    assert first["stats"]["cached_tokens"] == 0 and second["stats"]["cached_tokens"] > first["stats"]["prompt_tokens"]
    saved = json.loads((tmp_path / "conv.snap.messages.json").read_text())
    assert len(saved["messages"]) == 4 and saved["began"]
    resumed = _run(bundle, "--chat", "--json", "--max-tokens", "3", input=f"/load {snap}\nFarewell\n")
    assert resumed.exit_code == 0, resumed.output
    notice, turn = (json.loads(x) for x in resumed.stdout.strip().splitlines())
    assert notice["notice"].startswith("loaded 4 messages") and turn["stats"]["cached_tokens"] > 0


def test_message_files_of_both_vintages_load_and_bad_ones_are_named(tmp_path):
    from edge_runtime.cli.chat_repl import _read_sidecar
    from edge_runtime.errors import SnapshotError

    msgs = [{"role": "user", "content": "Hi"}]
    (tmp_path / "old.json").write_text(json.dumps(msgs))  # before the start time was saved
    assert _read_sidecar(tmp_path / "old.json") == (msgs, None)
    (tmp_path / "new.json").write_text(json.dumps({"messages": msgs, "began": "2026-12-05T23:59:59"}))
    assert _read_sidecar(tmp_path / "new.json")[1].isoformat() == "2026-12-05T23:59:59"
    for name, text in (
        ("a", "{"),
        ("b", '{"began": null}'),
        ("c", '{"messages": 3}'),
        ("d", '{"messages": [], "began": "x"}'),
    ):
        (tmp_path / name).write_text(text)
        with pytest.raises(SnapshotError, match=name):
            _read_sidecar(tmp_path / name)


def test_a_chat_reply_runs_to_its_end_of_turn_within_the_default_bound(chat_bundle):
    """No --max-tokens: a --message reply is not cut at a small fixed count but runs until the end of its turn,
    at most the window when sampling (the model's defaults) and min(GREEDY_CHAT_MAX_TOKENS, the window) when
    greedy (the demo model seldom ends a turn: it reaches the bound), and says so on its own line; a raw prompt
    keeps RAW_MAX_TOKENS."""
    from edge_runtime.cli.run import GREEDY_CHAT_MAX_TOKENS, RAW_MAX_TOKENS
    from edge_runtime.engine import load

    window = load(chat_bundle, target="x86").geometry.window  # as edge-run --target x86 loads it
    for flags, bound in (
        (["--temperature", "0"], min(GREEDY_CHAT_MAX_TOKENS, window)),
        (["--temperature", "0.8", "--seed", "3"], window),
    ):
        got = _json(_run(chat_bundle, "--message", "Speak on", "--json", *flags))
        assert got["stats"]["generated_tokens"] <= bound
        if got["stats"]["finish_reason"] == "length":
            assert got["stats"]["generated_tokens"] == bound
            plain = _run(chat_bundle, "--message", "Speak on", *flags)
            assert f"(reply cut at {bound} tokens by the default limit" in plain.stderr
    raw = _json(_run(chat_bundle, "--prompt", "ROMEO.", "--json"))
    assert raw["stats"]["generated_tokens"] <= RAW_MAX_TOKENS
