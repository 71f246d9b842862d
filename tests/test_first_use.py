"""What a user has, run directly: `edge-run/edge-serve/edge-bench --model FILE.gguf` exports on first use into
the cache; `--bundle` given a model file says which option to use; two processes asking for the same bundle
export it once; a bundle runs under the target it was exported for; sampling defaults come from the model."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_runtime import bundle_cache
from edge_runtime.cli.bench import main as bench_cli
from edge_runtime.cli.export import main as export_cli
from edge_runtime.cli.run import main as run_cli
from edge_runtime.sampling import SamplingParams
from edge_runtime.sampling_defaults import FALLBACK, FALLBACK_SOURCE, MODEL_SOURCE, model_defaults
from edge_runtime.targets.choose import choose_target
from edge_runtime.targets.detect import read_facts

from .bad_inputs_util import cli
from .tiny_models import save_tiny_checkpoint

X86 = read_facts().is_x86


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty first-use cache of this test's own (a cold start)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(d))
    return d


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    pytest.importorskip("gguf")
    from .test_gguf import write_gguf

    d = tmp_path_factory.mktemp("tiny-hf")
    save_tiny_checkpoint("llama-untied", d)
    path = tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf"
    write_gguf(d, path)
    return path


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


GREEDY = ["--prompt", "hello", "--max-tokens", "6", "--temperature", "0", "--json"]


def test_a_gguf_runs_with_model_exported_once_into_the_cache(cache, tiny_gguf, tmp_path):
    first = CliRunner().invoke(run_cli, ["--model", str(tiny_gguf), "--target", "x86", *GREEDY])
    got = _json(first)
    assert "exporting tiny.gguf for target x86 on first use" in first.stderr
    bundle = Path(got["bundle"])
    assert bundle.parent == cache / "bundles" and bundle.name.startswith("tiny-ort-")
    again = CliRunner().invoke(run_cli, ["--model", str(tiny_gguf), "--target", "x86", *GREEDY])
    assert _json(again)["token_ids"] == got["token_ids"] and "exporting" not in again.stderr
    # the cache knows where it came from: not stale while the file is there, stale once it is gone
    (cached,) = bundle_cache.list_bundles()
    assert cached.source == str(tiny_gguf.resolve()) and cached.stale_reason() is None
    # the same bundle as edge-export --target x86 writes, token for token
    out = tmp_path / "exported"
    res = CliRunner().invoke(export_cli, [str(tiny_gguf), "-o", str(out), "--target", "x86"])
    assert res.exit_code == 0, res.output
    direct = _json(CliRunner().invoke(run_cli, ["--bundle", str(out), *GREEDY]))
    assert direct["token_ids"] == got["token_ids"]


def test_edge_bench_takes_model_and_bundle_options(cache, tiny_gguf, tmp_path):
    args = ["--target", "x86", "--trials", "1", "--warmup", "0", "--prompt-tokens", "4", "--gen-tokens", "4"]
    res = CliRunner().invoke(bench_cli, ["--model", str(tiny_gguf), *args])
    assert res.exit_code == 0, res.output
    assert "decode" in res.stdout
    (cached,) = bundle_cache.list_bundles()
    for form in (["--bundle", str(cached.path)], [str(cached.path)]):
        res = CliRunner().invoke(bench_cli, [*form, *args])
        assert res.exit_code == 0, res.output
    both = CliRunner().invoke(bench_cli, [str(cached.path), "--bundle", str(cached.path), *args])
    assert both.exit_code == 1 and "give the bundle once" in both.output


def test_edge_serve_serves_a_gguf_exported_on_first_use(cache, tiny_gguf, tmp_path):
    """A real server process given --model FILE.gguf, driven by the official client; the export's progress is
    in its log, and the bundle is the one edge-run exports for the same target."""
    openai = pytest.importorskip("openai")
    from edge_runtime.serve.process import ServerProcess

    args = ("--model", str(tiny_gguf), "--target", "x86", "--no-energy")
    server = ServerProcess(None, *args, log=tmp_path / "server.log", startup_s=180)
    try:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        got = client.completions.create(model="any", prompt="hello", max_tokens=6, temperature=0)
        assert got.usage.completion_tokens >= 1 and got.model == "tiny.gguf"
    finally:
        server.stop()
    log = (tmp_path / "server.log").read_text()
    assert "exporting tiny.gguf for target x86 on first use" in log and "sampling defaults:" in log
    ran = _json(CliRunner().invoke(run_cli, ["--model", str(tiny_gguf), "--target", "x86", *GREEDY]))
    assert ran["text"] == got.choices[0].text


@pytest.mark.parametrize("command", [run_cli, bench_cli])
def test_bundle_given_a_model_says_which_option_to_use(cache, tiny_gguf, tmp_path, command):
    hf = tmp_path / "hf"
    save_tiny_checkpoint("llama-tied", hf)
    cases = {
        tiny_gguf: "is a GGUF model file, not a bundle: run it with --model",
        hf: "is a Hugging Face checkpoint, not a bundle: run it with --model",
        tmp_path / "nothing": "does not exist",
    }
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    cases[text] = "is a file; --bundle takes a bundle directory"
    for path, needle in cases.items():
        res = CliRunner().invoke(command, ["--bundle", str(path), "--target", "x86"])
        assert res.exit_code == 1 and needle in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1, res.output
    res = CliRunner().invoke(run_cli, ["--model", str(text), "--target", "x86"])
    assert res.exit_code == 1 and "neither a Hugging Face checkpoint directory nor a .gguf file" in res.output
    fake = tmp_path / "fake.gguf"  # named as a GGUF, not one: refused before an export is announced
    fake.write_text("not a gguf")
    res = CliRunner().invoke(run_cli, ["--model", str(fake), "--target", "x86"])
    assert res.exit_code == 1, res.output
    assert res.output.strip() == f"Error: '{fake}' is not a valid GGUF file (truncated or corrupt?): 10 bytes"
    assert not (cache / "bundles").exists() or not any((cache / "bundles").iterdir())


def test_concurrent_first_use_exports_once_and_both_run(cache):
    """Two `edge-run --model demo` on a cold cache: one exports, the other waits and uses what it published.
    The lock is held here until both wait on it, so the two always overlap."""
    name = bundle_cache.first_use_name
    from edge_runtime import kernels
    from edge_runtime.models import DEMO_CHECKPOINT
    from edge_runtime.targets import load_target
    from edge_runtime.targets.export_settings import settings_for

    s = settings_for(load_target("x86"), edge_kernels_here=kernels.available())
    bundle = name(DEMO_CHECKPOINT, s.flavor, s.quant, s.block or 32, s.kernel, s.table_bits, s.mixed)
    from edge_runtime.first_use import lock_path

    fd = os.open(lock_path(bundle), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    env = {"EDGE_RUNTIME_CACHE": str(cache)}
    args = ["--model", "demo", "--target", "x86", "--max-tokens", "3", "--temperature", "0", "--json"]
    procs = [cli("run", *args, env=env) for _ in range(2)]
    try:
        time.sleep(3)  # both are past their imports and blocked on the lock (they print that they wait)
    finally:
        os.close(fd)
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    errs = [e.decode() for _, e in results]
    assert sum("on first use into" in e for e in errs) == 1, errs
    assert sum("exported meanwhile by another process" in e for e in errs) == 1, errs
    outs = [json.loads(o.decode().strip().splitlines()[-1]) for o, _ in results]
    assert outs[0]["token_ids"] == outs[1]["token_ids"] and outs[0]["bundle"] == outs[1]["bundle"]


# --- targets that stick --------------------------------------------------------------------------


@pytest.mark.skipif(not X86, reason="the x86 profiles are chosen on x86 machines")
def test_choose_target_prefers_the_bundles_own_profile_where_it_fits():
    nuc = choose_target("auto", "nuc")
    assert nuc.profile.name == "nuc" and nuc.warning is None and "bundle's manifest" in nuc.detection.reason
    board = choose_target("auto", "rpi5")  # a Raspberry Pi bundle checked on an x86 host
    assert board.profile.name != "rpi5" and "exported for target 'rpi5'" in board.warning
    named = choose_target("x86", "nuc")
    assert named.profile.name == "x86" and not named.auto
    assert "exported for target 'nuc'; running under 'x86' as --target says" in named.warning
    assert choose_target("x86", "x86").warning is None
    assert choose_target("auto", "no-such-profile").warning is None  # an unknown name: detection, quietly


@pytest.mark.skipif(not X86, reason="the x86 profiles are chosen on x86 machines")
def test_a_bundle_exported_for_a_target_runs_under_it(tmp_path):
    out = tmp_path / "nuc"
    res = CliRunner().invoke(export_cli, ["demo", "-o", str(out), "--target", "nuc", "--quant", "int8"])
    assert res.exit_code == 0, res.output
    plain = CliRunner().invoke(run_cli, ["--bundle", str(out), *GREEDY])
    assert _json(plain)["target"] == "nuc"
    assert "no device profile fits" not in plain.stderr and "warning" not in plain.stderr  # no paragraph
    named = CliRunner().invoke(run_cli, ["--bundle", str(out), "--target", "x86", *GREEDY])
    assert _json(named)["target"] == "x86"
    warnings = [line for line in named.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: this bundle was exported for target 'nuc'; running under 'x86' as --target says"]
    verbose = CliRunner().invoke(run_cli, ["--bundle", str(out), "--verbose", *GREEDY])
    assert "target 'nuc' from the bundle's manifest" in verbose.stderr
    assert "sampling defaults:" in verbose.stderr
    # an error prints one line, no detection paragraph in front of it
    bad = CliRunner().invoke(run_cli, ["--model", "demo", "--max-tokens", "0"])
    assert bad.exit_code != 0 and len(bad.output.strip().splitlines()) == 1, bad.output


# --- sampling defaults from the model -----------------------------------------------------------


def test_model_defaults_follow_transformers_reading_of_generation_config():
    assert model_defaults({}) == model_defaults(None)
    assert model_defaults({}).params == FALLBACK and model_defaults({}).source == FALLBACK_SOURCE
    assert not FALLBACK.greedy  # greedy loops on a small model's open prompts
    assert model_defaults({"bos_token_id": 1, "max_new_tokens": 20}).params == FALLBACK  # no sampling keys
    gemma = model_defaults({"do_sample": True, "top_k": 64, "top_p": 0.95})
    assert gemma.params == SamplingParams(temperature=1.0, top_k=64, top_p=0.95) and gemma.source == MODEL_SOURCE
    qwen = model_defaults({"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": None})
    assert qwen.params == SamplingParams(temperature=0.6, top_k=20, top_p=0.95)
    greedy = model_defaults({"do_sample": False, "temperature": 0.7, "repetition_penalty": 1.1})
    assert greedy.params == SamplingParams(repetition_penalty=1.1)  # do_sample false: greedy, as transformers
    assert model_defaults({"temperature": 0.7}).params.greedy  # no do_sample: transformers' default, greedy
    # values of the wrong type or range are dropped key by key, never an error
    odd = model_defaults({"do_sample": True, "temperature": "hot", "top_k": -3, "top_p": 2.0})
    assert odd.params == SamplingParams(temperature=1.0, top_k=50, top_p=1.0)
    assert "temperature 0.8, top-k 40, top-p 0.9, repetition penalty 1.1" in model_defaults({}).describe()


def test_edge_serve_requests_without_sampling_fields_get_the_models_defaults():
    from edge_runtime.serve.schemas import OPENAI_SAMPLING, parse_chat

    msgs = {"messages": [{"role": "user", "content": "hi"}]}
    fallback = model_defaults(None)
    assert parse_chat(msgs, 64, fallback).params.sampling == FALLBACK
    assert parse_chat(msgs, 64).params.sampling == OPENAI_SAMPLING.params
    given = parse_chat({**msgs, "temperature": 0.5, "top_k": 5}, 64, fallback).params.sampling
    assert given == SamplingParams(temperature=0.5, top_k=5, top_p=0.9, repetition_penalty=1.1)
    # temperature 0 over the fallback is plain greedy; a model's own penalty stays
    assert parse_chat({**msgs, "temperature": 0}, 64, fallback).params.sampling == SamplingParams()
    own = model_defaults({"do_sample": True, "temperature": 0.7, "repetition_penalty": 1.2})
    expected = SamplingParams(top_k=50, repetition_penalty=1.2)  # top-k is moot under greedy
    assert parse_chat({**msgs, "temperature": 0}, 64, own).params.sampling == expected


def test_edge_run_samples_by_the_models_defaults_and_flags_win(tiny_bundle_with_generation):
    bundle = tiny_bundle_with_generation
    greedy = _json(CliRunner().invoke(run_cli, ["--bundle", str(bundle), "--target", "x86", *GREEDY]))
    # the record says do_sample false: no flag gives the greedy tokens
    plain = ["--bundle", str(bundle), "--target", "x86", "--prompt", "hello", "--max-tokens", "6", "--json"]
    assert _json(CliRunner().invoke(run_cli, plain))["token_ids"] == greedy["token_ids"]
    verbose = CliRunner().invoke(run_cli, [*plain, "--verbose"])
    assert f"sampling defaults: greedy ({MODEL_SOURCE})" in verbose.stderr


@pytest.fixture
def tiny_bundle_with_generation(tmp_path):
    ckpt = tmp_path / "ckpt"
    save_tiny_checkpoint("llama-tied", ckpt)
    path = ckpt / "generation_config.json"
    gen = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**gen, "do_sample": False, "temperature": 0.9}))
    out = tmp_path / "bundle"
    res = CliRunner().invoke(export_cli, [str(ckpt), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "manifest.json").read_text())["generation"]["do_sample"] is False
    return out


def test_the_repetition_penalty_spares_the_end_of_turn():
    """The default penalty must not push a reply past its end: the template writes the end-of-turn token after
    every message, so counting it as a repetition made sampled replies run on to the limit."""
    from edge_runtime.decoding import Selector
    from edge_runtime.sampling import Sampler

    pick = Selector(Sampler(SamplingParams(repetition_penalty=1.1)), (), [5, 2, 7, 2], 100, None, frozenset({2}))
    assert list(pick.history) == [5, 7]
    pick.took(2)
    pick.took(9)
    assert list(pick.history) == [5, 7, 9]


def test_edge_run_refuses_an_unwritable_field_log_before_the_run(tmp_path):
    """--log's figures are written after the run: an output it cannot write is refused first, in one line."""
    res = CliRunner().invoke(run_cli, ["--model", "demo", "--log", str(tmp_path / "no" / "log.jsonl"), *GREEDY])
    assert res.exit_code == 1 and "cannot write --log" in res.output and "does not exist" in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
