"""`edge-export --target T`: the profile's flavor, quantization, block, kernel, table bits and cache geometry,
explicit flags winning; the manifest records the target; without --target every default is portable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_runtime import kernels
from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import EdgeRuntimeError, ProfileSchemaError
from edge_runtime.exporters import from_source as export_mod
from edge_runtime.exporters.decoder import Flavor
from edge_runtime.targets import load_target
from edge_runtime.targets.export_settings import PORTABLE, settings_for

from .tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    save_tiny_checkpoint("llama-tied", d)
    return d


@pytest.fixture
def captured(monkeypatch):
    """The ExportOptions the CLI builds, without running the export."""
    seen = []

    def fake_export(opts, progress):
        seen.append(opts)
        raise EdgeRuntimeError("captured")

    monkeypatch.setattr(export_mod, "export", fake_export)
    return seen


def _options(captured, tiny, tmp_path, *args):
    r = CliRunner().invoke(export_cli, [str(tiny), "-o", str(tmp_path / "out"), *args])
    assert r.exit_code == 1 and "captured" in r.output, r.output
    return captured[-1]


def test_without_target_the_defaults_are_portable(captured, tiny, tmp_path):
    o = _options(captured, tiny, tmp_path)
    q = o.quant
    assert (o.flavor, q.method.value, q.kernel.value, q.table_bits, q.block, o.sinks, o.window) == (
        Flavor.ORT,
        "none",
        "mlas",
        8,
        32,
        4,
        None,
    )
    assert o.target is None and not o.fit_window
    help_text = CliRunner().invoke(export_cli, ["--help"]).output
    assert "Without --target every default is portable" in help_text
    assert "--quant" in help_text and "--target" in help_text  # the build options show on the top-level --help


def test_target_applies_the_profile(captured, tiny, tmp_path):
    nuc = load_target("nuc")
    o = _options(captured, tiny, tmp_path, "--target", "nuc")
    assert o.flavor is Flavor.ORT and o.quant.method.value == nuc.quantization and o.quant.block == nuc.block_size
    assert o.quant.kernel.value == ("edge" if kernels.available() else "mlas")
    assert o.quant.table_bits == nuc.table_bits
    assert (o.sinks, o.window, o.fit_window, o.target) == (nuc.kv_cache.sinks, nuc.kv_cache.window, True, "nuc")
    o = _options(captured, tiny, tmp_path, "--target", "orin-nano")
    assert (o.flavor, o.quant.method.value, o.quant.block, o.quant.kernel.value) == (
        Flavor.TRT,
        "int4-awq",
        128,
        "mlas",
    )


def test_explicit_flags_win_over_the_profile(captured, tiny, tmp_path):
    o = _options(captured, tiny, tmp_path, "--target", "nuc", "--quant", "int8", "--kernel", "mlas", "--window", "64")
    assert (o.quant.method.value, o.quant.kernel.value, o.window, o.fit_window) == ("int8", "mlas", 64, False)
    assert o.quant.int8_block is None  # the profile's block_size sizes INT4 only: INT8 stays per channel
    o = _options(captured, tiny, tmp_path, "--target", "x86", "--block", "32")  # x86: int8
    assert (o.quant.method.value, o.quant.int8_block) == ("int8", 32)
    # a flavor the profile was not made for drops the profile's ort-only choices instead of failing on them
    o = _options(captured, tiny, tmp_path, "--target", "nuc", "--flavor", "trt")
    want = (Flavor.TRT, "int4-gptq", 128, "mlas")
    assert (o.flavor, o.quant.method.value, o.quant.block, o.quant.kernel.value) == want
    o = _options(captured, tiny, tmp_path, "--target", "nuc", "--quant", "none")
    assert (o.quant.method.value, o.quant.kernel.value) == ("none", "mlas")
    o = _options(captured, tiny, tmp_path, "--target", "x86", "--table-bits", "4", "--block", "64", "--quant", "int4")
    assert (o.quant.table_bits, o.quant.block) == (4, 64)


def test_a_profile_mixed_precision_plan_applies_to_int4_exports_only(captured, tiny, tmp_path):
    p = tmp_path / "mixed.yaml"
    p.write_text("extends: nuc\nmixed_precision: sensitivity\n")
    o = _options(captured, tiny, tmp_path, "--target", str(p))
    assert (o.quant.method.value, o.quant.mixed.value) == ("int4-gptq", "sensitivity")
    o = _options(captured, tiny, tmp_path, "--target", str(p), "--mixed", "llama-down")  # the flag wins
    assert o.quant.mixed.value == "llama-down"
    o = _options(captured, tiny, tmp_path, "--target", str(p), "--quant", "int8")  # the plan is for INT4: dropped
    assert (o.quant.method.value, o.quant.mixed.value) == ("int8", "none")
    # chosen for the profile's own method and flavor: another INT4 method or flavor drops it too
    o = _options(captured, tiny, tmp_path, "--target", str(p), "--quant", "int4")
    assert (o.quant.method.value, o.quant.mixed.value) == ("int4", "none")
    o = _options(captured, tiny, tmp_path, "--target", str(p), "--flavor", "trt")
    assert (o.flavor, o.quant.method.value, o.quant.mixed.value) == (Flavor.TRT, "int4-gptq", "none")
    o = _options(captured, tiny, tmp_path, "--target", str(p), "--quant", "int4-gptq")  # the profile's own
    assert o.quant.mixed.value == "sensitivity"
    args = [str(tiny), "-o", str(tmp_path / "x"), "--quant", "int8", "--mixed", "sensitivity"]
    r = CliRunner().invoke(export_cli, args)
    assert r.exit_code != 0 and "needs --quant int4" in r.output  # typed by the user: refused, not dropped
    p.write_text("extends: nuc\nquantization: int8\n")  # the base's plan is not inherited by an int8 file
    assert load_target(str(p)).mixed_precision == "none"
    p.write_text("extends: x86\nmixed_precision: sensitivity\n")  # x86 exports int8
    with pytest.raises(ProfileSchemaError, match=r"mixed_precision.*unless quantization is int4"):
        load_target(str(p))


def test_the_manifest_records_the_target_and_the_window_is_cut_to_the_context(tiny, tmp_path):
    out = tmp_path / "b"
    r = CliRunner().invoke(export_cli, [str(tiny), "-o", str(out), "--target", "rpi5"])
    assert r.exit_code == 0, r.output
    assert "for target rpi5" in r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["provenance"]["target"] == "rpi5"
    assert m["provenance"]["options"] | {"prune": None} == {
        "flavor": "ort",
        "quant": "int4-gptq",
        "block": 32,
        "int8_block": None,
        "kernel": "mlas",
        "table_bits": 8,
        "prune": None,
        "prune_budget": None,
        "prune_layers": 0,
        "kv_dtype": "fp32",
    }
    context = m["model"]["max_position_embeddings"]
    rpi5 = load_target("rpi5")
    assert m["cache"]["sinks"] == rpi5.kv_cache.sinks
    assert m["cache"]["window"] == min(rpi5.kv_cache.window, context - rpi5.kv_cache.sinks)
    portable = tmp_path / "p"
    assert CliRunner().invoke(export_cli, [str(tiny), "-o", str(portable)]).exit_code == 0
    assert json.loads((portable / "manifest.json").read_text())["provenance"]["target"] is None


def test_settings_for_a_profile_and_the_table_bits_key(tmp_path):
    nuc = load_target("nuc")
    assert settings_for(nuc, edge_kernels_here=False).kernel == "mlas"
    assert settings_for(nuc, edge_kernels_here=True).kernel == "edge"
    assert PORTABLE.target is None and PORTABLE.quant == "none"
    from edge_runtime.targets.loader import load_target as load

    p = tmp_path / "t4.yaml"
    p.write_text("extends: nuc\ntable_bits: 4\n")
    assert load(str(p)).table_bits == 4
    p.write_text("extends: orin-nano\ntable_bits: 4\n")
    with pytest.raises(ProfileSchemaError, match="table_bits"):
        load(str(p))


def test_a_profiles_int4_block_is_cut_to_one_that_divides_the_model(tmp_path):
    """A block nobody typed is not refused: --target nuc's 32 on a model of widths 64 and 96 stays, a profile
    block of 128 becomes 32 (ort) with a note; a typed --block that does not divide is still one error line."""
    from edge_runtime.cli.export import main as cli

    ckpt = tmp_path / "ckpt"
    save_tiny_checkpoint("llama-tied", ckpt)  # Linear input widths 64 and 96
    profile = tmp_path / "p128.yaml"
    profile.write_text(
        (Path(load_target("nuc").source).read_text())
        .replace("name: nuc", "name: nuc128")
        .replace("block_size: 32", "block_size: 128")
        .replace("mixed_precision: sensitivity", "mixed_precision: none")
        .replace("int4-gptq", "int4")
    )
    r = CliRunner().invoke(cli, [str(ckpt), "-o", str(tmp_path / "b"), "--target", str(profile)])
    assert r.exit_code == 0, r.output
    assert "INT4 block 128 does not divide this model's widths (64, 96); using block 32" in r.stderr
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["quantization"]["block"] == 32
    typed = CliRunner().invoke(cli, [str(ckpt), "-o", str(tmp_path / "c"), "--target", str(profile), "--block", "128"])
    assert typed.exit_code == 1 and "does not divide the input dimension" in typed.output
