"""The export plan (exporters/plan.py): flags + target profile + source -> one validated, frozen ExportPlan that
edge-export, the first-use export and the memory estimate all take; every default and option refusal there."""

from __future__ import annotations

import dataclasses
import re

import pytest
from click.testing import CliRunner

from edge_runtime import kernels
from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import ExportError
from edge_runtime.exporters.checkpoint import load_checkpoint
from edge_runtime.exporters.export import ExportOptions
from edge_runtime.exporters.gguf_quant import GGUFCodes
from edge_runtime.exporters.memory_plan import estimate_export_memory, estimate_plan_memory
from edge_runtime.exporters.plan import (
    ExportFlags,
    ExportPlan,
    Flavor,
    KvDtype,
    Precision,
    default_block,
    plan_export,
)
from edge_runtime.exporters.quant import MatMulKernel, MixedPlan, QuantMethod
from edge_runtime.models import DEMO_CHECKPOINT
from edge_runtime.targets import load_target
from edge_runtime.targets.export_settings import settings_for
from edge_runtime.targets.loader import known_targets

needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"{kernels.unavailable_reason()}")


def _plan(tmp_path, profile=None, source=DEMO_CHECKPOINT, **flags) -> ExportPlan:
    return plan_export(source, tmp_path / "out", ExportFlags(**flags), profile)


def test_without_flags_or_profile_every_default_is_portable(tmp_path):
    p = _plan(tmp_path)
    q = p.quant
    assert (p.flavor, p.precision, q.method, q.block, q.kernel, q.table_bits, q.mixed, q.int8_block) == (
        Flavor.ORT, Precision.FP32, QuantMethod.NONE, 32, MatMulKernel.MLAS, 8, MixedPlan.NONE, None,
    )  # fmt: skip
    geometry = (p.sinks, p.window, p.fit_window, p.fit_block, p.target, p.kv_dtype)
    assert geometry == (4, None, False, False, None, KvDtype.FP32)
    assert ExportOptions is ExportPlan  # the older name builds the same validated plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.window = 5  # type: ignore[misc]


def test_the_int4_block_default_is_one_rule_per_flavor(tmp_path):
    assert (default_block(Flavor.ORT), default_block(Flavor.TRT)) == (32, 128)
    assert _plan(tmp_path, quant=QuantMethod.INT4).quant.block == 32
    assert _plan(tmp_path, quant=QuantMethod.INT4, flavor=Flavor.TRT).quant.block == 128
    # a profile's block, dropped with the profile's flavor
    nuc = load_target("nuc")
    assert _plan(tmp_path, nuc, flavor=Flavor.TRT).quant.block == 128


@pytest.mark.parametrize("name", known_targets())
def test_a_profile_plan_is_what_first_use_names_its_bundle_after(tmp_path, name):
    """first_use.py names a cached bundle from the profile's settings without importing the exporters: the plan
    of no flags must hold exactly those values (a .gguf's held-back mixed plan included)."""
    profile = load_target(name)
    s = settings_for(profile, edge_kernels_here=kernels.available())
    for source in (DEMO_CHECKPOINT, tmp_path / "m.gguf"):
        (tmp_path / "m.gguf").touch()
        p = _plan(tmp_path, profile, source=source)
        q = p.quant
        named = (s.flavor, s.quant, s.block, s.kernel, s.table_bits, s.mixed)
        mixed = p.deferred_mixed or q.mixed
        assert (p.flavor.value, q.method.value, q.block, q.kernel.value, q.table_bits, mixed.value) == named
        assert (p.sinks, p.window, p.fit_window, p.fit_block, p.target) == (s.sinks, s.window, True, True, name)


def test_a_gguf_keeps_its_codes_over_a_profile_mixed_plan_unless_asked_to_requantize(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.touch()
    nuc = load_target("nuc")  # int4-gptq with the sensitivity plan
    held = _plan(tmp_path, nuc, source=gguf, quant=QuantMethod.INT4)  # another method drops the plan outright
    assert (held.quant.mixed, held.deferred_mixed) == (MixedPlan.NONE, None)
    held = _plan(tmp_path, nuc, source=gguf)
    assert (held.quant.mixed, held.deferred_mixed) == (MixedPlan.NONE, MixedPlan.SENSITIVITY)
    asked = _plan(tmp_path, nuc, source=gguf, gguf_codes=GGUFCodes.REQUANTIZE)
    assert (asked.quant.mixed, asked.deferred_mixed) == (MixedPlan.SENSITIVITY, None)
    hf = _plan(tmp_path, nuc)
    assert (hf.quant.mixed, hf.deferred_mixed) == (MixedPlan.SENSITIVITY, None)


def test_a_profile_kernel_that_does_not_run_here_is_a_note_not_a_refusal(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "available", lambda: False)
    p = _plan(tmp_path, load_target("x86"))
    assert p.quant.kernel is MatMulKernel.MLAS and len(p.notes) == 1 and "do not run on this machine" in p.notes[0]
    assert _plan(tmp_path, load_target("x86"), quant=QuantMethod.NONE).notes == ()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"prune": 0.2, "prune_budget": 5.0}, "--prune and --prune-budget are mutually exclusive"),
        ({"prune_layers": 1, "prune_budget": 5.0}, "--prune-layers and --prune-budget are mutually exclusive"),
        ({"prune_budget": -3.0}, "prune budget -3.0 must be a positive percentage"),
        ({"window": 0}, "--window 0 is out of range"),
        ({"block": 32}, "--block 32 sizes quantized blocks"),
        ({"quant": QuantMethod.INT4, "block": 48}, "INT4 block size 48 is not supported"),
        ({"kv_dtype": KvDtype.FP16}, "--kv-dtype fp16 needs --kernel edge with a quantized model"),
        ({"flavor": Flavor.TRT, "kv_dtype": KvDtype.Q8}, "--kv-dtype q8 needs the ort flavor"),
        ({"flavor": Flavor.TRT, "quant": QuantMethod.INT4, "table_bits": 4}, "--table-bits 4 needs --flavor ort"),
        ({"flavor": Flavor.TRT, "quant": QuantMethod.INT8, "block": 32}, "INT8 blocks need --flavor ort"),
        ({"kernel": MatMulKernel.EDGE}, "--kernel edge applies to quantized bundles"),
        ({"quant": QuantMethod.INT8, "mixed": MixedPlan.LLAMA_DOWN}, "--mixed llama-down keeps some INT4 Linears"),
        ({"quant": QuantMethod.INT8, "gguf_codes": GGUFCodes.KEEP}, "--gguf-codes applies to a .gguf checkpoint"),
    ],
)
def test_option_refusals_are_one_typed_line_before_any_work(tmp_path, flags, message):
    with pytest.raises(ExportError, match="^" + re.escape(message)) as e:
        _plan(tmp_path, **flags)
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


def test_a_plan_made_directly_is_validated_too(tmp_path):
    with pytest.raises(ExportError, match="mutually exclusive"):
        ExportPlan(DEMO_CHECKPOINT, tmp_path / "out", prune=0.2, prune_budget=10.0)
    with pytest.raises(ExportError, match="needs the ort flavor"):
        ExportPlan(DEMO_CHECKPOINT, tmp_path / "out", flavor=Flavor.TRT, kv_dtype=KvDtype.FP16)
    p = ExportPlan(DEMO_CHECKPOINT, tmp_path / "out")
    with pytest.raises(ExportError, match="--window 0 is out of range"):
        dataclasses.replace(p, window=0)


def test_the_output_is_checked_by_the_plan(tmp_path):
    with pytest.raises(ExportError, match="is the checkpoint"):
        plan_export(DEMO_CHECKPOINT, DEMO_CHECKPOINT, ExportFlags())
    (tmp_path / "out").mkdir()
    with pytest.raises(ExportError, match="already exists; pass --overwrite"):
        _plan(tmp_path)


def test_kv_dtype_has_one_spelling_and_takes_the_manifests_as_an_alias(tmp_path):
    assert [KvDtype.parse(t) for t in ("fp16", "float16", "q8", "float32")] == [
        KvDtype.FP16, KvDtype.FP16, KvDtype.Q8, KvDtype.FP32,
    ]  # fmt: skip
    assert [k.manifest_dtype for k in KvDtype] == ["float32", "float16", "q8"]
    with pytest.raises(ExportError, match="unknown KV cache type 'int3'; choose one of: fp32, fp16, q8"):
        KvDtype.parse("int3")
    # the CLI takes the alias; the plan (and its refusal) says fp16
    r = CliRunner().invoke(export_cli, ["demo", "-o", str(tmp_path / "b"), "--kv-dtype", "float16"])
    assert r.exit_code == 1 and "--kv-dtype fp16 needs --kernel edge" in r.output, r.output
    r = CliRunner().invoke(export_cli, ["demo", "-o", str(tmp_path / "b"), "--kv-dtype", "fp8"])
    assert r.exit_code == 2 and "unknown KV cache type 'fp8'" in r.output and "Traceback" not in r.output


def test_the_memory_estimate_takes_the_plan(tmp_path):
    ckpt = load_checkpoint(DEMO_CHECKPOINT, stored_tables=True)
    p = _plan(tmp_path, quant=QuantMethod.INT4, prune=0.2)
    want = estimate_export_memory(ckpt, p.quant, p.flavor, True, False, True, p.kv_dtype)
    assert estimate_plan_memory(ckpt, p, codes_held=False, spilled=True) == want
    over = dataclasses.replace(p, max_memory=want.total - 1)
    with pytest.raises(ExportError, match=r"over --max-memory .*; a smaller --quant"):
        over.check_memory(want)
    p.check_memory(want)


@needs_kernels
def test_an_edge_plan_takes_an_fp16_cache(tmp_path):
    p = _plan(tmp_path, quant=QuantMethod.INT4, kernel=MatMulKernel.EDGE, kv_dtype=KvDtype.FP16)
    assert (p.kv_dtype, p.quant.kernel) == (KvDtype.FP16, MatMulKernel.EDGE)
    p.check_model(load_checkpoint(DEMO_CHECKPOINT).args)  # head size 32: RingAttention takes it


def test_the_cache_is_fp16_by_default_where_edge_runtimes_attention_runs(tmp_path):
    """fp16 where the edge ops run (a quantized ort bundle on the edge kernels), fp32 elsewhere; a typed --kv-dtype
    always decides."""
    mlas = _plan(tmp_path, quant=QuantMethod.INT4, kernel=MatMulKernel.MLAS)
    trt = _plan(tmp_path, quant=QuantMethod.INT4, flavor=Flavor.TRT)
    assert (mlas.kv_dtype, trt.kv_dtype, _plan(tmp_path).kv_dtype) == (KvDtype.FP32,) * 3
    if not kernels.available():
        return
    edge = _plan(tmp_path, quant=QuantMethod.INT4, kernel=MatMulKernel.EDGE)
    typed = _plan(tmp_path, quant=QuantMethod.INT4, kernel=MatMulKernel.EDGE, kv_dtype=KvDtype.FP32)
    assert (edge.kv_dtype, edge.fit_kv_dtype, typed.kv_dtype, typed.fit_kv_dtype) == (
        KvDtype.FP16, True, KvDtype.FP32, False,
    )  # fmt: skip


@needs_kernels
def test_the_default_fp16_cache_falls_back_to_fp32_for_heads_ring_attention_does_not_take(tmp_path):
    """A typed fp16 cache for such heads is refused (check_model); the default one becomes fp32, said in one line."""
    ckpt = load_checkpoint(DEMO_CHECKPOINT)
    odd = dataclasses.replace(ckpt, args=dataclasses.replace(ckpt.args, head_dim=36))
    said: list[str] = []
    edge = _plan(tmp_path, quant=QuantMethod.INT4, kernel=MatMulKernel.EDGE)
    fitted = edge.fitted(odd, said.append)
    assert (fitted.kv_dtype, edge.fitted(ckpt, said.append).kv_dtype) == (KvDtype.FP32, KvDtype.FP16)
    assert said == ["RingAttention does not take head size 36: caching K/V in fp32"]
    fitted.check_model(odd.args)
    typed = _plan(tmp_path, quant=QuantMethod.INT4, kernel=MatMulKernel.EDGE, kv_dtype=KvDtype.FP16)
    with pytest.raises(ExportError, match="RingAttention does not take head size 36"):
        typed.fitted(odd, said.append).check_model(odd.args)
