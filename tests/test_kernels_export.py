"""`--kernel edge` exports: the graphs edge-runtime's own ops give a tiny model, their validation against the
MLAS bundle, greedy decoding through the fused argmax, the pool written in place, and the refusals.

The ops themselves (MatMulQ4, SiluMul, LinearAttention) are checked in tests/test_kernels.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from edge_runtime import kernels
from edge_runtime.errors import BundleError, ExportError

from .test_kernels import _cache_copies, needs_kernels

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from .tiny_models import save_tiny_checkpoint

    d = tmp_path_factory.mktemp("kernels-ckpt")
    save_tiny_checkpoint("llama-tied", d, intermediate_size=128)  # every K a multiple of 64: all MatMulQ4
    return d


@pytest.fixture(scope="module")
def tiny_ckpt_d8(tmp_path_factory):
    from .tiny_models import save_tiny_checkpoint

    d = tmp_path_factory.mktemp("kernels-ckpt-d8")
    save_tiny_checkpoint("qwen2", d, intermediate_size=128)  # head size 8: GroupQueryAttention refuses it
    return d


@pytest.fixture(scope="module")
def tiny_ckpt_k96(tmp_path_factory):
    from .tiny_models import save_tiny_checkpoint

    d = tmp_path_factory.mktemp("kernels-ckpt-96")
    save_tiny_checkpoint("llama-tied", d)  # intermediate 96: down_proj's K is not a multiple of 64
    return d


def _export(ckpt, out, kernel):
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod

    quant = QuantConfig(QuantMethod.INT4, 32, table_bits=4, kernel=MatMulKernel(kernel))
    return export(ExportOptions(checkpoint=ckpt, out=out, window=60, quant=quant))


@needs_kernels
def test_a_bad_isa_pin_is_one_line_from_the_cli_and_writes_nothing(tiny_ckpt, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from edge_runtime.cli.export import main as export_cli

    monkeypatch.setenv("EDGE_KERNELS_ISA", "avx9000")
    out = tmp_path / "edge"
    args = [str(tiny_ckpt), "-o", str(out), "--quant", "int4", "--kernel", "edge"]
    r = CliRunner().invoke(export_cli, ["build", *args])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.strip().splitlines()[-1].startswith("Error: EDGE_KERNELS_ISA=avx9000 is not a MatMulQ4")
    assert not out.exists() and not list(tmp_path.glob(".edge*"))


@needs_kernels
def test_edge_kernel_export_validates_and_matches_the_mlas_bundle(tiny_ckpt, tmp_path):
    import onnx

    from edge_runtime.engine import load

    edge = _export(tiny_ckpt, tmp_path / "edge", "edge")
    _export(tiny_ckpt, tmp_path / "mlas", "mlas")
    graph = onnx.load(str(tmp_path / "edge" / "model.onnx"), load_external_data=False).graph
    top = [n.op_type for n in graph.node]
    assert top.count("If") == 1 and top.count("MatMulQ4") == 1  # one If around every layer; the INT4 LM head
    (if_node,) = [n for n in graph.node if n.op_type == "If"]
    for branch in if_node.attribute:  # each branch: every layer, reading the one copy of the weights
        ops = [n.op_type for n in branch.g.node]
        assert ops.count("MatMulQ4") == 2 * 4 and "MatMulNBits" not in ops  # qkv, o, gate_up, down
        assert kernels.SILU_MUL not in ops and "QuickGelu" not in ops and "If" not in ops  # folded into down:
        folded = [n for n in branch.g.node if any(a.name == "silu_mul" and a.i == 1 for a in n.attribute)]
        assert [n.name.split("/")[-2] for n in folded] == ["down_proj"] * 2
        normed = [n.name.split("/")[-2] for n in branch.g.node if any(a.name == "rms_norm" for a in n.attribute)]
        assert normed == ["qkv_proj", "gate_up_proj"] * 2  # the layers' norms folded into their products
        final = f"/ring_full/{branch.name[:4]}/model/norm/SkipLayerNorm"  # the last norm feeds the LM head
        assert [n.name for n in branch.g.node if "LayerNorm" in n.name] == [final]
        assert not branch.g.initializer
    branches = {a.name: [n.op_type for n in a.g.node] for a in if_node.attribute}
    assert branches["else_branch"].count(kernels.LINEAR_ATTENTION) == 2  # the ring is still a linear cache
    assert "GroupQueryAttention" not in branches["else_branch"]
    then = branches["then_branch"]  # the full ring: one RingAttention a layer, none of ONNX's attention ops
    assert then.count(kernels.RING_ATTENTION) == 2 and kernels.LINEAR_ATTENTION not in then
    assert not {"TensorScatter", "Attention", "RotaryEmbedding"} & set(then)
    assert not {"Sub", "Concat", "Shape"} & set(top)  # nor the general path's sink-term inputs
    # scripts/matmul_floor.py finds the layer products inside the If, each weight once: 2 x 4 + the LM head
    spec = importlib.util.spec_from_file_location("matmul_floor", SCRIPTS / "matmul_floor.py")
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    assert len(floor._floor_nodes(graph, set())) == 2 * 4 + 1
    assert edge.provenance["options"]["kernel"] == "edge"
    assert edge.validation.max_rel_err <= edge.validation.tolerance
    assert edge.quantization["exact_parity"]["max_rel_err"] < 1e-4  # the accuracy_level-0 MLAS twin
    # the int8 bound: measured by a numpy forward with the same rounding, never under the fixed floor
    from edge_runtime.exporters.validate import INT8_ACTIVATION_TOLERANCE, INT8_FACTOR

    basis = edge.validation.tolerance_basis
    e8 = basis["int8_probe_rel_err"]
    assert basis["factor"] == INT8_FACTOR and "int8_probe_rel_err" in basis["rule"]
    assert edge.validation.tolerance == max(INT8_ACTIVATION_TOLERANCE, INT8_FACTOR * e8)
    # the graph is off by what the rounding itself costs, not more (a probe of fp32 activations is ~1e-7)
    assert 1e-4 < e8 and edge.validation.max_rel_err <= 2 * e8

    prompt = list(range(3, 40))
    a, b = load(tmp_path / "edge"), load(tmp_path / "mlas")
    la, lb = a.prefill(prompt, all_logits=True), b.prefill(prompt, all_logits=True)
    errs = [np.abs(la - lb).max() / np.abs(lb).max()]
    for tok in (5, 9, 11, 2) * 20:  # 80 decode steps: past the 64-row ring's wrap
        da, db = a.decode(tok), b.decode(tok)
        errs.append(np.abs(da - db).max() / np.abs(db).max())
    # Float sums in another order can move an activation across an int8 rounding boundary, which flips
    # one code (up to 1/254 of its block's max): rare steps differ by ~1e-2, the rest agree to float noise.
    assert max(errs) < 5e-2
    assert sum(e < 1e-5 for e in errs) >= 0.9 * len(errs)


@needs_kernels
def test_greedy_decoding_takes_the_lm_heads_fused_argmax(tiny_ckpt, tmp_path):
    from edge_runtime.engine import load
    from edge_runtime.generate import generate_step
    from edge_runtime.manifest import NEXT_TOKEN
    from edge_runtime.sampling import Sampler, SamplingParams

    manifest = _export(tiny_ckpt, tmp_path / "edge", "edge")
    assert NEXT_TOKEN in manifest.graph.outputs
    engine = load(tmp_path / "edge")
    assert engine.fused_argmax
    prompt = list(range(3, 20))
    steps = generate_step(engine, prompt, Sampler(SamplingParams(temperature=0)))
    fused = [next(steps).token for _ in range(70)]  # past the 64-row ring's wrap
    engine.reset()
    expected = [int(np.argmax(engine.prefill(prompt)))]
    for _ in range(69):
        logits = engine.decode(expected[-1])
        assert engine.decoded_argmax() == int(np.argmax(logits))
        expected.append(int(np.argmax(logits)))
    assert fused == expected

    def refuse() -> int:
        raise AssertionError("a repetition penalty needs the logits, not the fused argmax")

    engine.decoded_argmax = refuse
    penalized = generate_step(engine, prompt, Sampler(SamplingParams(temperature=0, repetition_penalty=1.3)))
    assert len([next(penalized).token for _ in range(5)]) == 5


@needs_kernels
def test_edge_kernel_keeps_per_layer_ifs_where_some_product_stays_matmulnbits(tiny_ckpt_k96, tmp_path):
    """down_proj's K = 96 runs MatMulNBits, which ran slower inside a decoder-wide If: such graphs keep
    one If per layer (and still use SiluMul)."""
    import onnx

    edge = _export(tiny_ckpt_k96, tmp_path / "edge", "edge")
    assert edge.validation.max_rel_err <= edge.validation.tolerance
    ops = [n.op_type for n in onnx.load(str(tmp_path / "edge" / "model.onnx"), load_external_data=False).graph.node]
    assert ops.count("If") == 2 and ops.count("MatMulNBits") == 2  # one per layer; the two down projections
    assert ops.count("MatMulQ4") == 2 * 3 + 1 and ops.count(kernels.SILU_MUL) == 2


@needs_kernels
def test_edge_kernel_attends_with_ring_attention_at_every_fill_where_gqa_cannot_run(tiny_ckpt_d8, tmp_path):
    """Head size 8 has no GroupQueryAttention branch: RingAttention serves every fill (dense prefills, the
    chunks that write the sinks, the wrapped ring), and a chunk is its rows as decode steps bit for bit."""
    import onnx

    from edge_runtime.engine import LoadOptions, load

    edge = _export(tiny_ckpt_d8, tmp_path / "edge", "edge")
    assert edge.validation.max_rel_err <= edge.validation.tolerance
    ops = [n.op_type for n in onnx.load(str(tmp_path / "edge" / "model.onnx"), load_external_data=False).graph.node]
    assert ops.count(kernels.RING_ATTENTION) == 2 and "If" not in ops and "TensorScatter" not in ops
    engine = load(tmp_path / "edge", LoadOptions(sinks=4, window=20, slack=8))
    width = min(9, engine.exact_rows or 9)  # as wide as this CPU's MatMulQ4 keeps exact (AVX2: 4)
    ids = list(range(3, 70))
    for start in (0, 2, 20, 22, 33, 50):  # the sinks' chunk; S + W = 24; capacity 32
        engine.reset()
        if start:
            engine.prefill(ids[:start])
        chunk = engine.prefill(ids[start : start + width], all_logits=True)
        engine.reset()
        if start:
            engine.prefill(ids[:start])
        steps = np.stack([engine.decode(t).copy() for t in ids[start : start + width]])
        assert np.array_equal(chunk, steps), f"chunk at token {start}"


def test_edge_kernel_export_is_refused_where_the_op_cannot_run(tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "unavailable_reason", lambda: "no library in this test")
    with pytest.raises(ExportError, match=r"--kernel edge cannot be used: no library in this test.*--kernel mlas"):
        _export(tiny_ckpt, tmp_path / "b", "edge")
    assert not (tmp_path / "b").exists()


def test_edge_kernel_is_refused_for_trt_and_int8_activations_off():
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod
    from edge_runtime.exporters.quant_pipeline import check_options

    with pytest.raises(ExportError, match="--flavor ort"):
        check_options(QuantConfig(QuantMethod.INT4, 64, kernel=MatMulKernel.EDGE), trt=True)
    with pytest.raises(ExportError, match="accuracy_level 4"):
        QuantConfig(QuantMethod.INT4, 32, accuracy_level=0, kernel=MatMulKernel.EDGE)
    with pytest.raises(ExportError, match="applies to quantized bundles"):
        check_options(QuantConfig(kernel=MatMulKernel.EDGE), trt=False)
    with pytest.raises(ExportError, match="must be a MatMulKernel"):
        QuantConfig(QuantMethod.INT4, 32, kernel="edge")


@needs_kernels
def test_edge_bundle_on_a_machine_without_the_kernel_says_how_to_fix_it(tiny_ckpt, tmp_path, monkeypatch):
    from edge_runtime.engine import load

    _export(tiny_ckpt, tmp_path / "edge", "edge")
    monkeypatch.setattr(kernels, "register", lambda so, check=True: False)
    monkeypatch.setattr(kernels, "available", lambda: False)
    monkeypatch.setattr(kernels, "unavailable_reason", lambda: "no AVX2 here")
    with pytest.raises(BundleError, match=r"--kernel edge.*no AVX2 here.*re-export it with --kernel mlas"):
        load(tmp_path / "edge")


@needs_kernels
@pytest.mark.parametrize("ckpt", ["tiny_ckpt", "tiny_ckpt_k96", "tiny_ckpt_d8"])
def test_edge_bundle_writes_the_pool_in_place(ckpt, tmp_path, capfd, request):
    """Both branches of the decoder-wide If (tiny_ckpt) or of each layer's (tiny_ckpt_k96), or the one
    RingAttention a layer (tiny_ckpt_d8), write the bound K/V buffers themselves: LinearAttention while the
    ring is linear, RingAttention once it is full."""
    from edge_runtime.backends.onnxruntime import OrtBackend
    from edge_runtime.engine import LoadOptions, load

    _export(request.getfixturevalue(ckpt), tmp_path / "edge", "edge")
    engine = load(tmp_path / "edge", LoadOptions(sinks=4, window=28))
    engine.backend = OrtBackend(engine.bundle.graph_file, engine.manifest, engine.pool, log_severity=1)
    copies_before = _cache_copies(), _cache_copies(kernels.RING_ATTENTION)
    keys = engine.pool.keys[1][0]  # the last layer's [Hkv, capacity, D]
    pointer = keys.ctypes.data
    engine.prefill([0, 5, 9])
    engine.decode(3)
    row = engine.geometry.slot(3)
    assert np.abs(keys[:, row]).sum() > 0 and np.abs(keys[:, row + 1]).sum() == 0
    for t in range(4, 40):  # past S + W: the full-ring branch reuses rows
        engine.decode(t % 50)
    assert engine.ring.tokens > engine.geometry.sinks + engine.geometry.window
    before = keys.copy()
    engine.decode(7)
    changed = np.flatnonzero(np.abs(keys - before).sum(axis=(0, 2)))
    assert changed.tolist() == [engine.geometry.slot(engine.ring.tokens - 1)]  # that one reused row, in place
    assert keys.ctypes.data == pointer
    assert "in-place" not in capfd.readouterr().err.lower()
    assert kernels.RING_ATTENTION in engine.backend.kernel_ops()
    # LinearAttention and RingAttention were handed the pool buffers as their outputs
    assert (_cache_copies(), _cache_copies(kernels.RING_ATTENTION)) == copies_before


def test_one_weight_name_cannot_hold_two_tensors():
    """Branches share weights by name (the decoder-wide If); a clash must not silently keep the first."""
    from edge_runtime.exporters.graph import GraphBuilder

    g = GraphBuilder("g", 21, np.float32)
    b = g.branch("b", scope="/b")
    assert b.weight("w", np.zeros((2, 3), np.float32)) == g.weight("w", np.ones((2, 3), np.float32)) == "w"
    assert len(g.initializers) == 1 and not b.initializers
    with pytest.raises(ValueError, match="already stored"):
        b.weight("w", np.zeros((3, 2), np.float32))
