"""Chat templates that loop or build huge values: bounded renders, nothing computed at compile time, one line
from edge-run and edge-export, an OpenAI error from edge-serve (which still stops on SIGTERM)."""

from __future__ import annotations

import json
import signal
import threading

import pytest
from click.testing import CliRunner

from edge_runtime import chat
from edge_runtime.chat import ChatTemplate, check_template_bounds
from edge_runtime.cli.export import main as export_cli
from edge_runtime.cli.run import main as run_cli
from edge_runtime.errors import ChatTemplateError, ChatTemplateLimitError
from edge_runtime.exporters.export import ExportOptions, export

from .bad_inputs_util import one_line_error
from .tiny_models import demo_with_template

HI = [{"role": "user", "content": "hi"}]
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
# A template that is fine for every conversation but two: the export's check passes, those requests do not.
TRAPS = (
    "{% for m in messages %}{% if m['content'] == 'loop' %}" + LOOP + "{% endif %}"
    "{% if m['content'] == 'big' %}{{ 'x' * 3000000000 }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
)


@pytest.fixture
def few_steps(monkeypatch):
    """A small step budget: a looping template is refused after a fraction of a second, not a few seconds."""
    monkeypatch.setattr(chat, "MAX_RENDER_STEPS", 50_000)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("{{ 'x' * 3000000000 }}", "items with `\\*`"),
        ("{{ [0] * 3000000000 }}", "items with `\\*`"),
        ("{{ 10 ** 10000000 }}", "power"),
        ("{{ 'x' | center(3000000000) }}", "`center` filter"),
        ("{{ 'x'.ljust(3000000000) }}", "ljust"),
        ("{{ '%1000000000d' % 1 }}", "width"),
        ("{{ '{:>1000000000}'.format(1) }}", "width"),
        ("{% for i in range(1000000000) %}{% endfor %}", "safe_range"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "`~`"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "`\\+`"),
        (
            "{% set ns = namespace(s='a') %}{% for _ in range(64) %}"
            "{% set ns.s = ns.s | replace('a', 'aa') %}{% endfor %}",
            "`replace`",
        ),
        ("{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}", "integers"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed"),
        ("{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}", "recursed"),
    ],
)
def test_constant_and_growing_expressions_compile_and_are_refused_in_one_line(source, match):
    template = ChatTemplate(source)  # nothing is folded at compile time: this returns at once
    with pytest.raises(ChatTemplateLimitError, match=match) as e:
        template.render(HI)
    assert "\n" not in str(e.value)


def test_a_looping_template_runs_out_of_steps(few_steps):
    for source in (LOOP, "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(60) }}"):
        with pytest.raises(ChatTemplateLimitError, match="50000 steps"):
            ChatTemplate(source).render(HI)


def test_a_render_is_bounded_in_seconds_and_size(monkeypatch):
    monkeypatch.setattr(chat, "MAX_RENDER_SECONDS", 0.05)
    slow = "{% for i in range(100000) %}{% for j in range(100000) %}{{ loop.index }}{% endfor %}{% endfor %}"
    with pytest.raises(ChatTemplateLimitError, match=r"0\.05 seconds"):
        ChatTemplate(slow).render(HI)
    monkeypatch.setattr(chat, "MAX_RENDER_CHARS", 1000)
    with pytest.raises(ChatTemplateLimitError, match="renders over 1000 characters"):
        ChatTemplate("{% for i in range(100) %}{{ 'abcdefghijklmnopqrstuvwxyz' }}{% endfor %}").render(HI)


def test_ordinary_templates_render_as_before_after_a_refusal(few_steps):
    template = ChatTemplate(TRAPS)
    with pytest.raises(ChatTemplateLimitError):
        template.render([{"role": "user", "content": "loop"}])
    ok = "{{ 'ab' ~ 'cd' }} {{ [1, 2] | join(',') }} {{ 'a b' | replace(' ', '_') | upper }} {{ '%3d' % 7 }}"
    assert ChatTemplate(ok).render(HI) == "abcd 1,2 A_B   7"
    assert template.render(HI) == "user: hi\n"  # the budget is each render's own


def test_check_template_bounds_refuses_only_what_every_conversation_would(few_steps):
    check_template_bounds(TRAPS)  # only some conversations trip it: a bundle may carry it
    check_template_bounds("{{ raise_exception('no system') if messages[0].role == 'system' }}")
    for bad in (LOOP, "{{ 'x' * 3000000000 }}"):
        with pytest.raises(ChatTemplateLimitError):
            check_template_bounds(bad)
    with pytest.raises(ChatTemplateError, match="syntax error"):
        check_template_bounds("{% if %}")


@pytest.mark.parametrize("source", [LOOP, "{{ 'x' * 3000000000 }}", "{{ messages[0].content | center(10**9) }}"])
def test_export_refuses_a_checkpoint_template_the_runtime_would_refuse(tmp_path, few_steps, source):
    ck = demo_with_template(tmp_path / "ck", source)
    r = CliRunner().invoke(export_cli, [str(ck), "-o", str(tmp_path / "out"), "--window", "64"])
    one_line_error(r, "chat template", "--chat-template FILE")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def traps_bundle(tmp_path_factory):
    ck = demo_with_template(tmp_path_factory.mktemp("ck") / "demo", TRAPS)
    out = tmp_path_factory.mktemp("b") / "b"
    export(ExportOptions(checkpoint=ck, out=out, window=100))
    return out


def test_edge_run_refuses_a_looping_render_in_one_line(traps_bundle, few_steps):
    for content in ("loop", "big"):
        r = CliRunner().invoke(
            run_cli, ["--bundle", str(traps_bundle), "--target", "x86", "--message", content, "--max-tokens", "2"]
        )
        one_line_error(r, "chat template")
    ok = CliRunner().invoke(
        run_cli, ["--bundle", str(traps_bundle), "--target", "x86", "--message", "hi", "--max-tokens", "2"]
    )
    assert ok.exit_code == 0, ok.output


def test_edge_serve_starts_refuses_with_json_and_stops_on_sigterm_mid_render(traps_bundle, tmp_path):
    """The constant `'x' * 3000000000` is not computed when the server compiles the template (it used to be,
    and the server never started); a looping render is a 422, and SIGTERM during one still ends the server."""
    pytest.importorskip("starlette")
    from .serve_util import Server

    server = Server(traps_bundle, "--target", "x86", "--window", "100", "--threads", "1", log=tmp_path / "log")
    try:
        body = {"model": "b", "max_tokens": 2}
        status, data = server.post("/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "big"}]})
        assert status == 422 and data["error"]["code"] == "template_refused", data
        got: list = []
        looping = {**body, "messages": [{"role": "user", "content": "loop"}]}

        def send() -> None:
            try:
                got.append(server.post("/v1/chat/completions", looping))
            except (OSError, ValueError):  # the server closed the connection as it went: also no hang
                pass

        t = threading.Thread(target=send)
        t.start()
        t.join(0.5)  # the render is under way (a full step budget takes seconds)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0, server.output()
        t.join(60)
        if got:  # answered before the server went: the bound's error, not a hang
            status, data = got[0]
            assert status == 422 and "steps" in json.dumps(data), data
    finally:
        server.stop()
