"""A bundle corrupted after its first load, and garbage model output; bad sampling
settings and a closed stdout (item 10). Each ends in one line on stderr and a non-zero exit code.

Bit rot leaves a file's stat data unchanged, which a user-space test cannot arrange for a real write
(ctime always moves); the memo is told the new stat data instead, which is what it then sees."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime import kernels, verified
from edge_runtime.cli.run import main as run_cli
from edge_runtime.engine import LoadOptions, load
from edge_runtime.errors import CorruptOutputError
from edge_runtime.logits_check import CHECK_EVERY, check_token
from edge_runtime.manifest import MANIFEST_FILE, with_digest

from .bad_inputs_util import cli, copy_bundle, one_line_error

DATA = "model.onnx.data"


@pytest.fixture
def b(tied_bundle, tmp_path, monkeypatch) -> Path:
    """A private copy, its own memo directory; every file memoised and sampled at a 4 KiB grain."""
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(verified, "RACY_NS", 0)
    monkeypatch.setattr(verified, "FULL_HASH_BYTES", 0)
    monkeypatch.setattr(verified, "CHUNK_BYTES", 4096)
    return copy_bundle(tied_bundle, tmp_path / "b")


def _run(bundle: Path, *args: str):
    """edge-run in --json mode unless told otherwise (streaming mode also names the target on stderr)."""
    mode = [] if "--stream" in args else ["--json"]
    args = tuple(a for a in args if a != "--stream")
    return CliRunner().invoke(run_cli, ["--bundle", str(bundle), "--target", "x86", "--max-tokens", "4", *mode, *args])


def _rot(file: Path, offset: int, n: int) -> None:
    record = json.loads(verified._memo_path(file).read_text())
    with open(file, "r+b") as f:
        f.seek(offset)
        data = f.read(n)
        f.seek(offset)
        f.write(bytes(x ^ 0xFF for x in data))
    record["stat"] = verified._identity(file.stat())
    verified._memo_path(file).write_text(json.dumps(record))


def test_bytes_flipped_after_the_first_load_are_caught_by_the_next(b, monkeypatch):
    assert _run(b).exit_code == 0  # the first load hashes in full and memoises
    monkeypatch.setattr(verified, "SAMPLE_CHUNKS", 10**9)  # a sample covering the file: deterministic
    _rot(b / DATA, (b / DATA).stat().st_size // 3, 8192)
    one_line_error(_run(b), f"'{b / DATA}' does not match the checksum")


def test_verify_full_catches_what_the_sample_missed(b, monkeypatch):
    assert _run(b).exit_code == 0
    monkeypatch.setattr(verified, "SAMPLE_CHUNKS", 0)
    _rot(b / DATA, 100, 16)
    assert _run(b).exit_code == 0  # missed by the sample (the output checks are the backstop)
    one_line_error(_run(b, "--verify", "full"), "does not match the checksum")


def _nan_bundle(bundle: Path) -> Path:
    """Overwrite the embedding's float initializer (a quantized table's scales) with NaN and re-seal the
    checksums: a bundle that verifies but whose graph computes NaN (corruption the load's sample missed)."""
    import onnx

    graph = onnx.load(str(bundle / "model.onnx"), load_external_data=False)
    t = next(
        t
        for t in graph.graph.initializer
        if "embed_tokens" in t.name and t.data_type == onnx.TensorProto.FLOAT and t.external_data
    )
    ext = {e.key: int(e.value) for e in t.external_data if e.key in ("offset", "length")}
    with open(bundle / DATA, "r+b") as f:
        f.seek(ext["offset"])
        f.write(np.full(ext["length"] // 4, np.nan, np.float32).tobytes())
    m = json.loads((bundle / MANIFEST_FILE).read_text())
    m["files"][DATA] = hashlib.sha256((bundle / DATA).read_bytes()).hexdigest()
    (bundle / MANIFEST_FILE).write_text(json.dumps(with_digest(m)))
    return bundle


@pytest.fixture
def nan_bundle(b) -> Path:
    return _nan_bundle(b)


@pytest.mark.parametrize("mode", [[], ["--temperature", "0.8", "--seed", "1"]])
def test_a_graph_producing_nan_is_one_line_not_empty_text(nan_bundle, mode):
    r = _run(nan_bundle, *mode)
    one_line_error(r, "non-finite logits (NaN or Inf) at the end of the prompt", "edge-export inspect")
    assert r.stdout == ""  # no JSON object claiming a result


def test_a_graph_producing_nan_while_streaming_is_one_error_line(nan_bundle):
    r = _run(nan_bundle, "--stream")
    assert r.exit_code == 1 and "Traceback" not in r.output
    (error,) = r.stderr.strip().splitlines()  # the target paragraph only under --verbose
    assert error.startswith("Error: the model produced non-finite logits")


@pytest.mark.skipif(not kernels.available(), reason=f"{kernels.unavailable_reason()}")
@pytest.mark.parametrize("channel", ["q", "k", "v"])
def test_one_nan_weight_scale_in_an_int4_edge_bundle_is_refused_not_answered(channel, tmp_path):
    """One NaN block scale of a q, k or v channel (corruption the load's sample missed) makes one NaN
    among finite values: in a score (q, k), which the attention's vector exp once clamped to a zero
    weight, or in o_proj's input (v), which the matmuls' activation quantizer once dropped. Either way the
    model answered, degraded and undetected, instead of failing logits_check."""
    import onnx

    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod

    from .tiny_models import save_tiny_checkpoint

    save_tiny_checkpoint("llama-tied", tmp_path / "ckpt")
    quant = QuantConfig(QuantMethod.INT4, kernel=MatMulKernel.EDGE)
    out = tmp_path / "b"
    export(ExportOptions(checkpoint=tmp_path / "ckpt", out=out, window=200, quant=quant))
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False)
    t = next(t for t in graph.graph.initializer if t.name.endswith("layers.0/attn/qkv_proj/scales_f16"))
    assert not t.external_data  # a tiny model's scales sit in the graph file
    args = load(out).manifest.model
    blocks, heads, kv_heads = args.hidden_size // 32, args.num_heads[0], args.num_kv_heads[0]  # per layer
    scales = onnx.numpy_helper.to_array(t).copy()
    assert scales.size == blocks * (heads + 2 * kv_heads) * args.head_dim
    column = {"q": 0, "k": heads * args.head_dim, "v": (heads + kv_heads) * args.head_dim}[channel]
    scales.reshape(-1)[column * blocks] = np.nan
    t.CopyFrom(onnx.numpy_helper.from_array(scales, t.name))
    onnx.save(graph, str(out / "model.onnx"))  # the weights' file is untouched; the load skips checksums
    with pytest.raises(CorruptOutputError, match="non-finite logits"):
        load(out, LoadOptions(verify=False)).prefill([1, 2, 3, 4, 5])


def test_nan_during_decode_is_caught_within_check_every_steps(tied_bundle, monkeypatch):
    engine = load(tied_bundle)
    engine.prefill([1, 2, 3])
    run_decode = engine.backend.run_decode

    def rotten(row):  # the weights went bad after the prompt: every logit from now on is NaN
        run_decode(row)
        engine.pool.logits[...] = np.nan

    monkeypatch.setattr(engine.backend, "run_decode", rotten)
    with pytest.raises(CorruptOutputError, match=f"decode step {CHECK_EVERY}"):
        for _ in range(CHECK_EVERY):
            engine.decode(5)  # decode alone (as the fused-argmax path) checks the row every CHECK_EVERY


def test_a_fused_argmax_outside_the_vocabulary_is_refused():
    with pytest.raises(CorruptOutputError, match="token 70000, outside the vocabulary of 320"):
        check_token(70000, 0.0, 320, "a decode step")
    with pytest.raises(CorruptOutputError, match="non-finite"):
        check_token(3, float("nan"), 320, "a decode step")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--seed", "-1", "--temperature", "0.5"], "seed must be an integer >= 0, got -1"),
        (["--temperature", "1e-308"], "temperature must be 0 (greedy) or a finite value >= 1e-06"),
        (["--temperature", "nan"], "temperature must be 0 (greedy)"),
    ],
)
def test_sampling_settings_that_crashed_are_one_line(tied_bundle, args, needle):
    one_line_error(_run(tied_bundle, *args), needle)


@pytest.mark.parametrize("mode", [["--json"], []])
def test_a_closed_stdout_is_one_line_and_non_zero(tied_bundle, mode):
    p = cli(
        "run", "--bundle", str(tied_bundle), "--target", "x86", "--max-tokens", "3", *mode,
        stdout=None, preexec_fn=lambda: os.close(1),
    )  # fmt: skip
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    assert err.decode().strip().splitlines() == [
        "Error: standard output is closed, so the output would be lost; redirect it (to a file, or to /dev/null)"
    ]
