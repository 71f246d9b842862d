"""Structured output that cannot be followed: refused in one line / a 400, never an empty reply that passes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("llguidance")

from edge_runtime import constrain
from edge_runtime.cli.run import main as run_cli
from edge_runtime.engine import load
from edge_runtime.errors import ConstraintError
from edge_runtime.generate import GenerationConfig, generate
from edge_runtime.tokenizer import Tokenizer

from .bad_inputs_util import one_line_error

# A required property whose value is the object itself: no finite JSON satisfies it.
RECURSIVE = {
    "$ref": "#/$defs/a",
    "$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}},
}
MILLION_A = "^(a{1000}){1000}$"


@pytest.mark.parametrize("grammar", [lambda: constrain.json_schema(RECURSIVE), lambda: constrain.regex(MILLION_A)])
def test_an_unfollowable_constraint_is_refused_before_the_prompt_is_fed(tied_bundle, monkeypatch, grammar):
    engine = load(tied_bundle)
    fed = []
    monkeypatch.setattr(engine, "prefill", lambda ids, **kw: fed.append(ids))
    with pytest.raises(ConstraintError, match="cannot be followed") as e:
        generate(engine, Tokenizer.for_engine(engine), "Hi", GenerationConfig(max_tokens=8), grammar=grammar())
    assert "\n" not in str(e.value) and fed == []


def test_a_matcher_failing_mid_output_raises_instead_of_ending_the_reply(tied_bundle):
    engine = load(tied_bundle)
    c = constrain.Constraint.for_engine(engine, constrain.regex("[a-z]{1,40}"))

    class Failing:  # llguidance past a limit mid-output: an error state the sampled tokens did not cause
        def __init__(self, m):
            self.m = m

        def __getattr__(self, name):
            return getattr(self.m, name)

        def is_error(self):
            return True

        def get_error(self):
            return "parser error: Too many items (limit 50000)\n<state>..."

    import numpy as np

    c.matcher = Failing(c.matcher)
    with pytest.raises(ConstraintError, match="Too many items"):
        c([], np.zeros(engine.manifest.model.vocab_size, np.float32))


def test_edge_run_refuses_in_one_line(tied_bundle, tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(RECURSIVE))
    common = ["--bundle", str(tied_bundle), "--target", "x86", "--prompt", "Hi", "--max-tokens", "8"]
    for args in (["--json-schema", str(schema)], ["--regex", MILLION_A]):
        r = CliRunner().invoke(run_cli, [*common, *args, "--json"])
        one_line_error(r, "cannot be followed")
        assert r.stdout == ""  # no JSON result: nothing was generated
        plain = CliRunner().invoke(run_cli, [*common, *args])
        one_line_error(plain, "cannot be followed")
        assert plain.stdout == ""  # refused before the raw prompt is echoed


def test_edge_serve_answers_400(edge_server):
    rf = {"type": "json_schema", "json_schema": {"name": "r", "schema": RECURSIVE}}
    body = {"messages": [{"role": "user", "content": "Hail!"}], "max_tokens": 4, "response_format": rf}
    for stream in (False, True):
        status, data = edge_server.post("/v1/chat/completions", {**body, "stream": stream})
        assert status == 400, data
        assert data["error"]["code"] == "unsatisfiable_constraint" and data["error"]["param"] == "response_format"
    status, data = edge_server.post("/v1/chat/completions", {k: v for k, v in body.items() if k != "response_format"})
    assert status == 200, data  # the server goes on
