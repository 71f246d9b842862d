"""The export streams each initializer into the data file as the graph builder makes it, reads
checkpoint layers one at a time and validates layer by layer. The bundle must be the one the in-memory
path (build the whole graph, then save it) writes, byte for byte, and `--max-memory` refuses up front."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime.cli.export import main as export_cli
from edge_runtime.errors import ExportError
from edge_runtime.exporters.checkpoint import load_checkpoint
from edge_runtime.exporters.decoder import Flavor, Precision, build_decoder
from edge_runtime.exporters.export import DATA_FILE, GRAPH_FILE, ExportOptions, export
from edge_runtime.exporters.external_data import save_with_external_data
from edge_runtime.exporters.lazy_layers import LazyLayers
from edge_runtime.exporters.memory_plan import estimate_export_memory
from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantizedMatrix, QuantMethod
from edge_runtime.exporters.quant_pipeline import prepare_weights
from edge_runtime.exporters.scratch import Scratch
from edge_runtime.models import DEMO_CHECKPOINT

from .tiny_models import save_tiny_checkpoint

_INT4 = QuantConfig(method=QuantMethod.INT4)
CASES = {
    "demo-fp32": ("demo", Flavor.ORT, Precision.FP32, QuantConfig()),
    "demo-int4": ("demo", Flavor.ORT, Precision.FP32, _INT4),
    "demo-int8-edge": ("demo", Flavor.ORT, Precision.FP32, QuantConfig(QuantMethod.INT8, kernel=MatMulKernel.EDGE)),
    "untied-int4-table4": ("llama-untied", Flavor.ORT, Precision.FP32, QuantConfig(QuantMethod.INT4, table_bits=4)),
    "qwen3-trt-fp16-int8": ("qwen3-tied", Flavor.TRT, Precision.FP16, QuantConfig(QuantMethod.INT8)),
    "gemma3-fp32": ("gemma3", Flavor.ORT, Precision.FP32, QuantConfig()),
}


def _checkpoint(name: str, tmp_path_factory) -> object:
    if name == "demo":
        return DEMO_CHECKPOINT
    d = tmp_path_factory.mktemp(name)
    save_tiny_checkpoint(name, d)
    return d


@pytest.mark.parametrize("case", list(CASES))
def test_the_streamed_bundle_is_the_in_memory_one_byte_for_byte(case, tmp_path, tmp_path_factory):
    model, flavor, precision, quant = CASES[case]
    if quant.kernel is MatMulKernel.EDGE:
        from edge_runtime import kernels

        if kernels.unavailable_reason() is not None:
            pytest.skip(f"edge kernels: {kernels.unavailable_reason()}")
    ckpt_dir = _checkpoint(model, tmp_path_factory)
    out = tmp_path / "streamed"
    export(ExportOptions(checkpoint=ckpt_dir, out=out, flavor=flavor, precision=precision, quant=quant, window=60))

    ckpt = load_checkpoint(ckpt_dir)
    prepared = prepare_weights(
        ckpt, quant, None, None, trt=flavor is Flavor.TRT, weights_label=precision.value, progress=lambda _m: None
    )
    built = build_decoder(ckpt.args, prepared.weights, flavor, precision, prepared.quantized)  # no sink
    whole = tmp_path / "in-memory"
    whole.mkdir()
    save_with_external_data(built.model, whole / GRAPH_FILE, DATA_FILE)
    for name in (GRAPH_FILE, DATA_FILE):
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name


def test_a_bf16_checkpoints_layers_are_read_on_demand_and_equal_the_eager_load(tmp_path):
    save_tiny_checkpoint("llama-untied", tmp_path, dtype="bfloat16")
    ckpt = load_checkpoint(tmp_path)
    assert isinstance(ckpt.weights.layers, LazyLayers)
    first = ckpt.weights.layers[0]
    assert ckpt.weights.layers[0] is first  # the latest layer is kept: fields read twice are the same arrays
    raw = ckpt.tensors.read("model.layers.1.mlp.down_proj.weight")
    assert raw.dtype == np.uint16  # bf16 as stored
    np.testing.assert_array_equal(ckpt.weights.layers[1].down, (raw.astype(np.uint32) << 16).view(np.float32))


def test_stored_tables_read_the_rows_the_float_tables_hold_and_quantize_alike(tmp_path, monkeypatch):
    """A quantized export reads the embedding table and LM head from the checkpoint a block of rows
    at a time (an 8B model's float32 tables are 4.2 GB). Rows, codes and the reference's logits are the
    float tables' exactly, with blocks small enough that every pass takes many."""
    from edge_runtime.exporters import quant, tables
    from edge_runtime.exporters.reference import ReferenceModel
    from edge_runtime.exporters.tables import StoredTable

    save_tiny_checkpoint("llama-untied", tmp_path, dtype="bfloat16")
    eager, stored = load_checkpoint(tmp_path), load_checkpoint(tmp_path, stored_tables=True)
    e, s = eager.weights, stored.weights
    assert isinstance(s.embed, StoredTable) and isinstance(s.lm_head, StoredTable) and s.lm_head is not s.embed
    assert not isinstance(e.embed, StoredTable) and s.embed.shape == e.embed.shape and s.embed.dtype == np.float32
    ids = np.array([[5, 0, 5], [e.embed.shape[0] - 1, 2, 3]])
    np.testing.assert_array_equal(s.embed[ids], e.embed[ids])
    np.testing.assert_array_equal(s.lm_head[3:11], e.lm_head[3:11])
    np.testing.assert_array_equal(s.embed[7], e.embed[7])
    for use in (lambda t: t @ np.ones(t.shape[1], np.float32), lambda t: t.T[0], lambda t: t[::2], lambda t: t + 1):
        with pytest.raises(TypeError):
            use(s.embed)
    assert np.isnan(np.asarray(s.embed)).all()  # no hook refuses np.asarray: NaN, never zeros that pass for weights

    k = e.lm_head.shape[1]
    whole = [quant.quantize_rtn(e.lm_head, 8), quant.quantize_rtn(e.lm_head, 4, 32)]
    monkeypatch.setattr(quant, "RTN_CHUNK_ELEMENTS", 7 * k)  # 7 rows a part
    monkeypatch.setattr(tables, "PART_ELEMENTS", 5 * k)
    for qm, got in zip(whole, [quant.quantize_rtn(s.lm_head, 8), quant.quantize_rtn(s.lm_head, 4, 32)], strict=True):
        assert np.array_equal(got.codes, qm.codes) and np.array_equal(got.scales, qm.scales) and got.block == qm.block
        assert quant.table_error(qm, s.lm_head) == quant.table_error(qm, e.lm_head)
    tokens = [1, 7, 3, 9, 2]
    np.testing.assert_allclose(
        ReferenceModel(stored.args, s).forward(tokens),
        ReferenceModel(eager.args, e).forward(tokens),
        rtol=1e-12,
        atol=1e-12,
    )


def test_the_graph_builder_never_dequantizes_a_quantized_weight(monkeypatch):
    """A quantized model's Linears and tables are QuantizedTable placeholders (their shape over one
    NaN, the integer form in .qm): the builder packs codes and never widens a layer to float32, which at
    8B was 0.9 GB a layer, several alive at once. The reference still sees the dequantized values."""
    from edge_runtime.exporters.quant import QuantizedTable
    from edge_runtime.exporters.reference import ReferenceModel

    ckpt = load_checkpoint(DEMO_CHECKPOINT)
    prepared = prepare_weights(ckpt, _INT4, None, None, trt=False, weights_label="fp32", progress=lambda _m: None)
    lw = prepared.weights.layers[1]
    assert isinstance(lw.q, QuantizedTable) and prepared.quantized.lookup(lw.q) is lw.q.qm
    with pytest.raises(TypeError):
        lw.o.T[0]  # a view (the transpose of a square matrix has its shape) is not the matrix's rows
    assert not isinstance(lw.attn_norm, QuantizedTable)  # norms stay float
    widened = []
    real = QuantizedMatrix.dequantize_rows
    monkeypatch.setattr(QuantizedMatrix, "dequantize_rows", lambda self, rows: widened.append(rows) or real(self, rows))
    build_decoder(ckpt.args, prepared.weights, Flavor.ORT, Precision.FP32, prepared.quantized)
    assert widened == []
    ref = ReferenceModel(ckpt.args, prepared.weights)
    np.testing.assert_array_equal(ref.layers[1].down, lw.down.qm.dequantize().astype(ref.dtype))
    assert widened  # the reference dequantized the layer it was asked for


def test_int4_codes_are_held_two_to_a_byte_and_read_back_exactly():
    rng = np.random.default_rng(0)
    codes = rng.integers(-8, 8, (6, 64)).astype(np.int8)
    qm = QuantizedMatrix(codes, np.ones((6, 2), np.float32), 4, 32)
    assert qm.held_bytes() == 6 * 32 + 6 * 2 * 4
    assert qm.codes.dtype == np.int8 and np.array_equal(qm.codes, codes) and qm.shape == (6, 64)
    # GGUF's sign-flipped blocks: a code of 8 fits no nibble, so they stay int8
    flipped = QuantizedMatrix(-codes, -np.ones((6, 2), np.float32), 4, 32)
    assert np.array_equal(flipped.codes, -codes) and flipped.held_bytes() == 6 * 64 + 6 * 2 * 4


@pytest.mark.parametrize("positional_io", [True, False], ids=["pread-pwrite", "seek"])
def test_spilled_codes_scales_and_zero_points_read_back_exactly_and_leave_memory(tmp_path, monkeypatch, positional_io):
    """Quantized Linears wait in an unlinked scratch file between uses (export() spills them;
    the byte-for-byte test above compares its bundle with one built from codes held in memory). Where
    the OS has no pwrite/preadv (Windows), seek + write/readinto does the same."""
    if not positional_io:
        import os

        monkeypatch.delattr(os, "pwrite", raising=False)
        monkeypatch.delattr(os, "preadv", raising=False)
    rng = np.random.default_rng(1)
    scratch = Scratch(tmp_path)
    forms = [
        QuantizedMatrix(rng.integers(-8, 8, (6, 64)).astype(np.int8), rng.random((6, 2), np.float32), 4, 32),
        QuantizedMatrix(
            rng.integers(-8, 8, (4, 64)).astype(np.int8),
            rng.random((4, 2), np.float32),
            4,
            32,
            zeros=rng.integers(-8, 8, (4, 2)).astype(np.int8),
        ),
        QuantizedMatrix(rng.integers(-128, 128, (5, 48)).astype(np.int8), rng.random((5, 1), np.float32), 8, 48),
    ]
    before = [(qm.codes, qm.scales, qm.zeros, qm.dequantize(), qm.storage_bytes()) for qm in forms]
    for qm in forms:
        qm.spill(scratch)
        qm.spill(scratch)  # a second spill writes nothing more
    assert list(tmp_path.iterdir()) == []  # unlinked: nothing left behind, whatever happens to the process
    for qm, (codes, scales, zeros, deq, size) in zip(forms, before, strict=True):
        assert qm.held_bytes() == 0 and qm.storage_bytes() == size
        assert np.array_equal(qm.codes, codes) and np.array_equal(qm.scales, scales)
        assert (qm.zeros is None) == (zeros is None) and (zeros is None or np.array_equal(qm.zeros, zeros))
        assert np.array_equal(qm.dequantize(), deq) and np.array_equal(qm.dequantize_rows([2, 0]), deq[[2, 0]])
        # a block of rows, or a few (repeated, from the end) read alone from the file (load_rows)
        assert np.array_equal(qm.dequantize_rows(slice(1, 3)), deq[1:3]) and np.array_equal(
            qm.codes_rows(slice(2, 9)), codes[2:]
        )
        assert np.array_equal(qm.dequantize_rows(np.array([3, 3, -1])), deq[[3, 3, -1]])


def test_tables_pack_a_part_at_a_time_as_they_pack_whole(monkeypatch, tmp_path):
    from edge_runtime.exporters import quant_graph

    rng = np.random.default_rng(2)
    qm = QuantizedMatrix(rng.integers(-8, 8, (37, 64)).astype(np.int8), rng.random((37, 2), np.float32), 4, 32)
    whole = quant_graph.pack_nbits(qm, "t")
    monkeypatch.setattr(quant_graph, "PACK_PART_ELEMENTS", 5 * 64)  # 8 parts, the last of 2 rows
    qm.spill(Scratch(tmp_path))
    for got, want in zip(quant_graph.pack_nbits(qm, "t"), whole, strict=True):
        assert np.array_equal(got, want)


def test_an_export_spills_its_codes_and_counts_them_only_where_held(monkeypatch, tmp_path):
    from edge_runtime.exporters import scratch

    written = []
    put = scratch.Scratch.put
    monkeypatch.setattr(scratch.Scratch, "put", lambda self, a: written.append(a.nbytes) or put(self, a))
    export(ExportOptions(checkpoint=DEMO_CHECKPOINT, out=tmp_path / "b", quant=_INT4, window=60))
    args = load_checkpoint(DEMO_CHECKPOINT).args
    assert len(written) >= 2 * 7 * args.num_layers  # every Linear's codes and scales
    ckpt = load_checkpoint(DEMO_CHECKPOINT)
    spilled = estimate_export_memory(ckpt, _INT4, Flavor.ORT)
    held = estimate_export_memory(ckpt, _INT4, Flavor.ORT, codes_held=True)  # a GGUF's codes, or no scratch file
    assert "codes" not in spilled.parts and held.parts["codes"] > 0 and held.total > spilled.total


def test_the_sensitivity_plan_is_estimated_a_layer_at_a_time():
    """--mixed sensitivity scores each layer as it is quantized: its estimate is GPTQ's own (it once counted every
    layer's statistics and the model whole); AWQ under the plan adds its scaled Linears in float32."""
    from edge_runtime.exporters.quant import MixedPlan

    ckpt = load_checkpoint(DEMO_CHECKPOINT)

    def calib(method, mixed=MixedPlan.NONE):
        estimate = estimate_export_memory(ckpt, QuantConfig(method, mixed=mixed), Flavor.ORT)
        return estimate.phases["prepare"].get("calibration")

    assert calib(QuantMethod.INT4_GPTQ, MixedPlan.SENSITIVITY) == calib(QuantMethod.INT4_GPTQ) > 0
    a = ckpt.args
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    linear = a.num_layers * (a.hidden_size * (q + 2 * kv) + q * a.hidden_size + 3 * a.hidden_size * a.intermediate_size)
    assert calib(QuantMethod.INT4_AWQ, MixedPlan.SENSITIVITY) == calib(QuantMethod.INT4_AWQ) + 4 * linear


def test_the_manifest_records_each_phase_of_the_estimate_and_the_peak_is_under_it(tmp_path):
    """The estimate is the largest of its phases, each recorded beside the stages' peaks; a quantized export
    validates its graph and its reference one after the other, so its validate phase is the larger of the two,
    not their sum (the peak itself is measured by scripts/export_memory.py, one process per export: this test's
    process holds the whole suite)."""
    ckpt = load_checkpoint(DEMO_CHECKPOINT, stored_tables=True)
    estimate = estimate_export_memory(ckpt, _INT4, Flavor.ORT)
    assert set(estimate.phases) == {"prepare", "graph", "validate"}
    assert estimate.total == max(estimate.phase_totals().values())
    validate = estimate.phases["validate"]
    assert ("runtime" in validate) != ("layer" in validate)  # the session's side or the reference's, not both
    manifest = export(ExportOptions(checkpoint=DEMO_CHECKPOINT, out=tmp_path / "b", quant=_INT4))
    provenance = manifest.provenance
    assert provenance["estimated_phase_bytes"] == estimate.phase_totals()
    assert provenance["estimated_peak_rss_bytes"] == estimate.total
    assert set(provenance["stage_peak_rss_bytes"]) >= {"weights", "write", "validate"}


def test_max_memory_refuses_up_front_with_the_estimate(tmp_path):
    out = tmp_path / "b"
    estimate = estimate_export_memory(load_checkpoint(DEMO_CHECKPOINT), _INT4, Flavor.ORT)
    # the peak phase's parts: the demo's is running the twin (its float head, quant_graph.FP32_HEAD_MAX_BYTES)
    assert estimate.total > 0 and set(estimate.parts) >= {"baseline", "tables", "runtime"}
    with pytest.raises(ExportError, match=r"needs about .* MB .* --max-memory"):
        export(ExportOptions(checkpoint=DEMO_CHECKPOINT, out=out, quant=_INT4, max_memory=estimate.total // 2))
    assert not out.exists() and list(tmp_path.iterdir()) == []
    r = CliRunner().invoke(
        export_cli, [str(DEMO_CHECKPOINT), "-o", str(out), "--quant", "int4", "--max-memory", "1000000"]
    )
    assert r.exit_code != 0 and "Traceback" not in r.output
    (line,) = [x for x in r.output.splitlines() if "needs about" in x]  # one line, with the estimate's parts
    assert "--max-memory 1 MB" in line and "baseline" in line and not out.exists()


def test_the_fp32_twins_lm_head_runs_in_parts_and_still_matches_the_reference(tmp_path, monkeypatch):
    """MatMulNBits at accuracy_level 0 dequantizes its whole B per call (1 GB for a 1B model's head): the twin
    runs the head a part of the rows at a time, and its logits still equal the reference to fp32 tolerance."""
    from edge_runtime.exporters import quant_graph
    from edge_runtime.exporters.quant_pipeline import exact_twin

    monkeypatch.setattr(quant_graph, "FP32_TABLE_PART_ROWS", 100)  # the demo's 4096-token vocabulary: 41 parts
    monkeypatch.setattr(quant_graph, "FP32_HEAD_MAX_BYTES", 0)  # the demo's head is small enough for a float Gemm
    ckpt = load_checkpoint(DEMO_CHECKPOINT)
    prepared = prepare_weights(ckpt, _INT4, None, None, trt=False, weights_label="fp32", progress=lambda _m: None)
    twin = build_decoder(ckpt.args, prepared.weights, Flavor.ORT, Precision.FP32, exact_twin(prepared.quantized))
    heads = [n for n in twin.model.graph.node if n.name.startswith("/lm_head/rows_") and n.op_type == "MatMulNBits"]
    assert len(heads) == -(-ckpt.args.vocab_size // 100)
    assert sum(next(a.i for a in n.attribute if a.name == "N") for n in heads) == ckpt.args.vocab_size
    plain = build_decoder(ckpt.args, prepared.weights, Flavor.ORT, Precision.FP32, prepared.quantized)
    assert not any(n.name.startswith("/lm_head/rows_") for n in plain.model.graph.node)  # the bundle's head: whole

    m = export(ExportOptions(checkpoint=DEMO_CHECKPOINT, out=tmp_path / "b", quant=_INT4, window=60))
    parity = m.quantization["exact_parity"]
    assert parity["max_rel_err"] <= parity["tolerance"] <= 1e-4
