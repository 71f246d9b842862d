"""`--kernel edge` exports: the graphs edge-runtime's own ops give a tiny model, their validation against the
MLAS bundle, greedy decoding through the fused argmax, the pool written in place, and the refusals.

The ops themselves (MatMulQ4, SiluMul, LinearAttention) are checked in tests/test_kernels.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest

from edge_runtime import kernels
from edge_runtime.errors import BundleError, ExportError
from edge_runtime.manifest import ROW_CACHE

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
    # no If: every layer in the graph itself, each global layer's attention one RingAttention at every fill
    # (LinearAttention's computation while the ring is linear); qkv, o, gate_up, down a layer; the INT4 LM head
    assert "If" not in top and top.count("MatMulQ4") == 2 * 4 + 1 and "MatMulNBits" not in top
    assert kernels.SILU_MUL not in top and "QuickGelu" not in top  # folded into down:
    folded = [n for n in graph.node if any(a.name == "silu_mul" and a.i == 1 for a in n.attribute)]
    assert [n.name.split("/")[-2] for n in folded] == ["down_proj"] * 2
    normed = [n.name.split("/")[-2] for n in graph.node if any(a.name == "rms_norm" for a in n.attribute)]
    assert normed == ["qkv_proj", "gate_up_proj"] * 2  # the layers' norms folded into their products
    assert [n.name for n in graph.node if "LayerNorm" in n.name] == ["/model/norm/SkipLayerNorm"]  # feeds the head
    rings = [n for n in graph.node if n.op_type == kernels.RING_ATTENTION]
    assert len(rings) == 2 and kernels.LINEAR_ATTENTION not in top and "GroupQueryAttention" not in top
    for i, n in enumerate(rings):  # the ring's inputs, a batch's rows, then the linear ring's
        assert list(n.input[1:3]) == [f"past_key.{i}", f"past_value.{i}"]
        assert list(n.input[10:]) == [ROW_CACHE, "ring_full", "seqlens_k", "cos_cache", "sin_cache"]
        assert list(n.output[1:]) == [f"present_key.{i}", f"present_value.{i}"]
    assert not {"TensorScatter", "Attention", "RotaryEmbedding"} & set(top)
    assert not {"Sub", "Concat", "Shape"} & set(top)  # nor the general path's sink-term inputs
    # scripts/matmul_floor.py finds the layer products, each weight once: 2 x 4 + the LM head
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


@needs_kernels
@pytest.mark.parametrize("name", ["llama-tied", "gemma3"])
def test_one_attention_node_a_layer_decodes_as_the_if_around_the_layers_bit_for_bit(name, tmp_path, monkeypatch):
    """The graph without an If (each global layer's RingAttention switching to LinearAttention's computation while
    the ring is linear; Gemma 3's local layers RingAttention on their own ring) gives the logits of the graph with
    the If on ring_full around the layer stack, bit for bit: prompt, steps while linear and past the wrap."""
    from edge_runtime.engine import load
    from edge_runtime.exporters import decoder

    from .tiny_models import save_tiny_checkpoint

    ckpt = tmp_path / "ckpt"
    save_tiny_checkpoint(name, ckpt, intermediate_size=128)  # every K a multiple of 64: all MatMulQ4
    _export(ckpt, tmp_path / "one", "edge")
    monkeypatch.setattr(decoder, "_switch_by_fill", lambda args: False)
    _export(ckpt, tmp_path / "if", "edge")
    ops = {}
    for side in ("one", "if"):
        graph = onnx.load(str(tmp_path / side / "model.onnx"), load_external_data=False).graph
        ops[side] = [n.op_type for n in graph.node]
    assert "If" not in ops["one"] and ops["if"].count("If") == 1
    a, b = load(tmp_path / "one"), load(tmp_path / "if")
    prompt = list(range(3, 30))
    assert np.array_equal(a.prefill(prompt, all_logits=True), b.prefill(prompt, all_logits=True))
    for tok in (5, 9, 11, 2) * 20:  # 80 decode steps: past the 64-row ring's wrap
        assert np.array_equal(a.decode(tok), b.decode(tok))
