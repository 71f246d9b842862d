"""--mixed: INT4 exports with chosen Linear groups INT8 per channel (exporters/quant_mixed.py)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

from edge_runtime import kernels
from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import ExportError
from edge_runtime.exporters import load_checkpoint
from edge_runtime.exporters.quant import MixedPlan, QuantConfig, QuantMethod
from edge_runtime.exporters.quant_mixed import group_sizes, llama_use_more_bits

from .tiny_models import _TEXT, save_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """8 layers (llama-down keeps layers 0, 3, 6, 7: the first and last eighth and (i - 1) % 3 == 2),
    H 64 and I 128: every product's K a multiple of 64, so --kernel edge runs MatMulQ4 and MatMulQ8."""
    d = tmp_path_factory.mktemp("mixed")
    save_tiny_checkpoint("llama-tied", d, intermediate_size=128, num_hidden_layers=8)
    (d / "calibration.txt").write_text(_TEXT)
    return d


def _nodes(graph):
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(a.g)
            for g in a.graphs:
                yield from _nodes(g)


def _export(ckpt, out, *args):
    r = CliRunner().invoke(export_cli, [str(ckpt), "-o", str(out), "--quant", "int4", *args])
    assert r.exit_code == 0, r.output
    return json.loads((out / "manifest.json").read_text())


def _sizes(ckpt):
    """Weights per group of one layer, and of every Linear of the model."""
    w = load_checkpoint(ckpt).weights
    sizes = group_sizes(w.layers[0])
    return sizes, len(w.layers) * sum(sizes.values())


def _layer_ops(out):
    """{(layer, projection): (op_type, bits)} over the graph's layer products (each branch of the If alike)."""
    g = onnx.load(str(out / "model.onnx"))
    inits = {i.name: i for i in g.graph.initializer}
    found = {}
    for n in _nodes(g.graph):
        if "layers." not in n.name or n.op_type not in ("MatMulNBits", "MatMulQ4", "MatMulQ8"):
            continue
        layer = int(n.name.split("layers.")[1].split("/")[0])
        proj = n.name.split("/")[-2]
        attrs = {a.name: a.i for a in n.attribute}
        bits = attrs.get("bits", 4 if n.op_type == "MatMulQ4" else 8)
        codes = numpy_helper.to_array(inits[n.input[1]])  # the packed codes: K * N * bits / 8 bytes
        assert codes.dtype == np.uint8 and codes.size == attrs["K"] * attrs["N"] * bits // 8, n.name
        found.setdefault((layer, proj), set()).add((n.op_type, bits))
    return found


def test_llama_down_layers_follow_llama_cpp():
    assert [i for i in range(30) if llama_use_more_bits(i, 30)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    assert [i for i in range(8) if llama_use_more_bits(i, 8)] == [0, 3, 6, 7]


@pytest.mark.parametrize("kernel", ["mlas", "edge"])
def test_llama_down_bundle_validates_with_int8_down_in_its_layers(ckpt, tmp_path, kernel):
    if kernel == "edge" and kernels.unavailable_reason() is not None:
        pytest.skip(kernels.unavailable_reason())
    m = _export(ckpt, tmp_path / "b", "--mixed", "llama-down", "--kernel", kernel)
    q = m["quantization"]
    assert q["mixed"]["int8_groups"] == ["0.down", "3.down", "6.down", "7.down"]
    sizes, total = _sizes(ckpt)
    assert q["mixed"]["linear_code_bits"] == pytest.approx(4 + 4 * 4 * sizes["down"] / total, abs=1e-4)
    for name, entry in q["per_tensor"].items():
        if ".layers." not in name:
            continue
        layer = int(name.split(".layers.")[1].split(".")[0])
        int8 = "down_proj" in name and layer in (0, 3, 6, 7)
        assert (entry["bits"], entry["block"]) == ((8, "channel") if int8 else (4, 32)), name
    assert m["validation"]["max_rel_err"] <= m["validation"]["tolerance"]
    ops = _layer_ops(tmp_path / "b")
    int8_op = ("MatMulQ8", 8) if kernel == "edge" else ("MatMulNBits", 8)
    int4_op = ("MatMulQ4", 4) if kernel == "edge" else ("MatMulNBits", 4)
    for (layer, proj), kinds in ops.items():
        want = int8_op if proj == "down_proj" and layer in (0, 3, 6, 7) else int4_op
        assert kinds == {want}, (layer, proj, kinds)
    assert {p for _, p in ops} >= {"down_proj", "o_proj"}


def test_sensitivity_plan_spends_its_budget_on_the_largest_scores(ckpt, tmp_path):
    m = _export(ckpt, tmp_path / "b", "--mixed", "sensitivity")
    mixed = m["quantization"]["mixed"]
    assert 4.0 < mixed["linear_code_bits"] <= 4.5 and mixed["budget_code_bits"] == 4.5
    assert len(mixed["scores"]) == 8 * 4 and mixed["int8_groups"]
    assert m["quantization"]["calibration"]["tokens"] > 0  # plain int4 calibrates for this plan
    sizes, total = _sizes(ckpt)
    density = {k: v / sizes[k.split(".")[1]] for k, v in mixed["scores"].items()}
    chosen = set(mixed["int8_groups"])
    # greedy by score per weight: the densest group is taken; every skipped denser group did not fit
    assert max(density, key=density.get) in chosen
    spent = sum(sizes[k.split(".")[1]] for k in chosen)
    budget = 0.125 * total
    for k, d in density.items():
        if k not in chosen and d > min(density[c] for c in chosen):
            assert spent + sizes[k.split(".")[1]] > budget, k
    per = m["quantization"]["per_tensor"]
    for g in chosen:
        layer, group = g.split(".")
        proj = {"qkv": "self_attn.v_proj", "o": "self_attn.o_proj", "gate_up": "mlp.up_proj", "down": "mlp.down_proj"}
        assert per[f"model.layers.{layer}.{proj[group]}.weight"]["bits"] == 8
    assert m["validation"]["max_rel_err"] <= m["validation"]["tolerance"]


def test_sensitivity_budget_is_the_configured_code_bits(ckpt):
    """A larger mixed_bits keeps more weights INT8 and stays within its own budget (the greedy fill need
    not keep the smaller plan's groups); a budget outside (4, 8] is refused in one line."""
    from edge_runtime.exporters.calibrate import capture_linear_inputs, load_calibration
    from edge_runtime.exporters.quant_model import quantize_model

    ck = load_checkpoint(ckpt)
    acts = capture_linear_inputs(ck.args, ck.weights, load_calibration(ck))

    def plan(bits):
        config = QuantConfig(QuantMethod.INT4, 32, mixed=MixedPlan.SENSITIVITY, mixed_bits=bits)
        return quantize_model(ck.args, ck.weights, ck.arch.weights, config, acts).record["mixed"]

    small, large = plan(4.5), plan(5.5)
    assert small["int8_weight_share"] < large["int8_weight_share"]
    assert small["linear_code_bits"] <= 4.5 < large["linear_code_bits"] <= 5.5 and large["budget_code_bits"] == 5.5
    for bad in (4, 8.5, "4.5", True):
        with pytest.raises(ExportError, match=r"mixed-precision budget .* must be average code bits in \(4, 8\]"):
            QuantConfig(QuantMethod.INT4, 32, mixed=MixedPlan.SENSITIVITY, mixed_bits=bad)


def test_gptq_damping_follows_the_plan(ckpt):
    """GPTQ damps 0.01 of the mean diagonal with every Linear INT4 and 0.1 under the sensitivity plan (each
    measured best on the real model, quant_model.py); the manifest records the one used."""
    from edge_runtime.exporters import quant_model
    from edge_runtime.exporters.calibrate import capture_linear_inputs, load_calibration

    ck = load_checkpoint(ckpt)
    acts = capture_linear_inputs(ck.args, ck.weights, load_calibration(ck))
    damps = {}
    for plan in (MixedPlan.NONE, MixedPlan.LLAMA_DOWN, MixedPlan.SENSITIVITY):
        config = QuantConfig(QuantMethod.INT4_GPTQ, 32, mixed=plan)
        damps[plan] = quant_model.quantize_model(ck.args, ck.weights, ck.arch.weights, config, acts).record["gptq"]
    assert [damps[p]["damp"] for p in MixedPlan] == [0.01, 0.01, 0.1]
    assert quant_model.GPTQ_DAMP == 0.01 and quant_model.GPTQ_DAMP_MIXED == 0.1


@pytest.mark.parametrize(
    "args,message",
    [
        (["--quant", "int8", "--mixed", "llama-down"], "--mixed llama-down keeps some INT4 Linears at INT8; it needs"),
        (["--mixed", "llama-down"], "--mixed llama-down keeps some INT4 Linears at INT8; it needs"),
    ],
)
def test_mixed_without_int4_fails_in_one_line(ckpt, tmp_path, args, message):
    r = CliRunner().invoke(export_cli, [str(ckpt), "-o", str(tmp_path / "out"), *args])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.strip().splitlines()[-1].startswith("Error: ") and message in r.output
    assert not (tmp_path / "out").exists()


def test_unknown_plan_is_a_usage_error_and_the_choices_are_the_enum(ckpt, tmp_path):
    r = CliRunner().invoke(export_cli, [str(ckpt), "-o", str(tmp_path / "o"), "--quant", "int4", "--mixed", "q6"])
    assert r.exit_code == 2 and "Traceback" not in r.output and "'q6' is not one of" in r.output
    help_text = CliRunner().invoke(export_cli, ["build", "--help"]).output
    assert "[none|llama-down|sensitivity]" in help_text.replace("\n", "").replace(" ", "")
    assert [m.value for m in MixedPlan] == ["none", "llama-down", "sensitivity"]
    from edge_runtime.targets.schema import MIXED_PLANS  # targets import no exporters: the same list, kept equal

    assert MIXED_PLANS == tuple(m.value for m in MixedPlan)
    with pytest.raises(ExportError, match="unknown mixed-precision plan 'q6'; choose one of: none, llama-down"):
        MixedPlan.parse("q6")
    with pytest.raises(ExportError, match="must be a MixedPlan"):
        QuantConfig(QuantMethod.INT4, 32, mixed="llama-down")
