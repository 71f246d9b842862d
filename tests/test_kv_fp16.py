"""An fp16 KV cache (`edge-export --kv-dtype fp16`, --kernel edge): LinearAttention and RingAttention read
fp16 rows and write the new ones rounded to fp16, computing in fp32 as with an fp32 cache.

The kernels are checked against themselves with an fp32 cache holding the same fp16-rounded rows: bit for
bit where the new rows are fp16-representable after RoPE, to the rounding of the new rows otherwise."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from edge_runtime import kernels

from .test_kernels import _attention_graph, _session, needs_kernels
from .test_ring_attention import CASES, _feeds, _ring_graph

pytestmark = needs_kernels


def _f16_cache(model: bytes, names: tuple[str, ...] = ("pk", "pv", "k", "v")) -> bytes:
    """The same one-node graph with its cache inputs and outputs typed float16."""
    m = onnx.load_from_string(model)
    for vi in [*m.graph.input, *m.graph.output]:
        if vi.name in names:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    return m.SerializeToString()


def _half(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`feeds` with the caches as float16 (the fp32 op then gets them widened back: the same values)."""
    return {**feeds, "pk": feeds["pk"].astype(np.float16), "pv": feeds["pv"].astype(np.float16)}


def _widened(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**feeds, "pk": feeds["pk"].astype(np.float32), "pv": feeds["pv"].astype(np.float32)}


def _linear_feeds(rng, hq, hkv, d, cap, past, t, half, *, identity_rope: bool) -> dict[str, np.ndarray]:
    qkv = rng.standard_normal((1, t, (hq + 2 * hkv) * d)).astype(np.float32)
    if identity_rope:  # cos 1, sin 0: the new rows are their fp16-representable inputs, so no rounding at all
        qkv = qkv.astype(np.float16).astype(np.float32)
        angles = np.zeros((cap, half))
    else:
        angles = np.arange(cap)[:, None] * (10000.0 ** (-np.arange(half) / half))[None]
    feeds = {"qkv": qkv, "seq": np.array([past + t - 1], np.int32)}
    feeds |= {n: rng.standard_normal((1, hkv, cap, d)).astype(np.float16) for n in ("pk", "pv")}
    return feeds | {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}


def _check(got: list[np.ndarray], want: list[np.ndarray], *, exact: bool) -> None:
    """got: the fp16-cache op's (out, present_key, present_value); want: the fp32 op's on the widened cache."""
    assert got[1].dtype == got[2].dtype == np.float16 and got[0].dtype == np.float32
    for a, b in zip(got[1:], want[1:], strict=True):  # every row, new ones rounded to nearest even
        assert np.array_equal(a, b.astype(np.float16))
    if exact:
        assert np.array_equal(got[0], want[0])
    else:  # only the new rows' rounding (relative 2^-11 per element) separates them
        assert np.abs(got[0] - want[0]).max() / np.abs(want[0]).max() < 2e-3


# (hq, hkv, d, capacity, past, T, rot_half): decode deep in the cache, a prefill chunk from 0, GQA, partial rotary.
LINEAR = [(9, 3, 64, 300, 200, 1, 32), (4, 2, 16, 64, 0, 7, 8), (4, 2, 32, 64, 10, 5, 8), (8, 8, 128, 90, 37, 9, 24)]


@pytest.mark.parametrize("identity_rope", [True, False])
@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "past", "t", "half"), LINEAR)
def test_linear_attention_with_an_fp16_cache_is_the_fp32_op_on_its_rows(hq, hkv, d, cap, past, t, half, identity_rope):
    rng = np.random.default_rng(past + t)
    feeds = _linear_feeds(rng, hq, hkv, d, cap, past, t, half, identity_rope=identity_rope)
    graph = _attention_graph(kernels.LINEAR_ATTENTION, hq, hkv, d)
    got = _session(_f16_cache(graph)).run(None, feeds)
    want = _session(graph).run(None, _widened(feeds))
    _check(got, want, exact=identity_rope)


@pytest.mark.parametrize("identity_rope", [True, False])
@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "sinks", "t", "half", "write"), CASES)
def test_ring_attention_with_an_fp16_cache_is_the_fp32_op_on_its_rows(
    hq, hkv, d, cap, sinks, t, half, write, identity_rope
):
    """CASES: decode and chunks, rows written mid-buffer and at its end (a wrapped ring), sinks, masks."""
    rng = np.random.default_rng(cap + t)
    feeds = _half(_feeds(rng, hq, hkv, d, cap, sinks, t, half, write))
    if identity_rope:
        feeds["qkv"] = feeds["qkv"].astype(np.float16).astype(np.float32)
        feeds |= {n: np.ones_like(feeds[n]) for n in ("cos", "cos_sink")}
        feeds |= {n: np.zeros_like(feeds[n]) for n in ("sin", "sin_sink")}
    graph = _ring_graph(hq, hkv, d)
    got = _session(_f16_cache(graph)).run(None, feeds)
    want = _session(graph).run(None, _widened(feeds))
    _check(got, want, exact=identity_rope)


def test_a_chunk_across_the_wrap_with_an_fp16_cache_is_its_decode_steps_bit_for_bit():
    """RingAttention's row-by-row exactness holds for an fp16 cache: a 5-row chunk written at the buffer's
    last rows equals five one-row calls, each reading the rows the previous one rounded."""
    hq, hkv, d, cap, sinks, t, half, write = 4, 2, 32, 40, 4, 5, 8, 35
    rng = np.random.default_rng(3)
    feeds = _half(_feeds(rng, hq, hkv, d, cap, sinks, t, half, write, hide_later_rows=True))
    session = _session(_f16_cache(_ring_graph(hq, hkv, d)))
    out, keys, values = session.run(None, feeds)
    rows, pk, pv = [], feeds["pk"], feeds["pv"]
    for i in range(t):
        step = {n: feeds[n][i : i + 1] for n in ("cos", "sin", "cos_sink", "sin_sink", "mask")}
        step |= {"qkv": feeds["qkv"][:, i : i + 1], "write_index": feeds["write_index"] + i}
        o, pk, pv = session.run(None, {**step, "pk": pk, "pv": pv, "sink_rows": feeds["sink_rows"]})
        rows.append(o)
    assert np.array_equal(np.concatenate(rows, axis=1), out)
    assert np.array_equal(pk, keys) and np.array_equal(pv, values)


# -- bundles -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_bundles(tmp_path_factory):
    """The demo model (trained: its greedy choices are not coin flips) as INT4 --kernel edge bundles with an
    fp32 and an fp16 KV cache; each export validates against the float64 reference."""
    from edge_runtime.exporters.decoder import KvDtype
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod
    from edge_runtime.models import resolve_checkpoint

    root = tmp_path_factory.mktemp("kv-fp16")
    quant = QuantConfig(QuantMethod.INT4, 32, kernel=MatMulKernel.EDGE)
    out = {}
    for kv in KvDtype:
        out[kv.value] = root / kv.value
        export(
            ExportOptions(checkpoint=resolve_checkpoint("demo"), out=out[kv.value], window=60, quant=quant, kv_dtype=kv)
        )
    return out


RING = {"sinks": 4, "window": 28}  # the ring is full from token 32 on: decode reuses rows (RingAttention)


def test_the_manifest_says_the_cache_dtype_and_the_pool_allocates_it(demo_bundles):
    from edge_runtime.bundle import open_bundle
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.pool import StaticPool

    m16, m32 = (open_bundle(demo_bundles[k]).manifest for k in ("fp16", "fp32"))
    assert m16.graph.kv["dtype"] == m16.graph.kv_dtype == "float16" and m32.graph.kv_dtype == "float32"
    assert m16.graph.activation_dtype == "float32" and m16.provenance["options"]["kv_dtype"] == "fp16"
    assert m16.graph.inputs["past_key.0"]["dtype"] == m16.graph.outputs["present_value.0"]["dtype"] == "float16"
    assert m16.validation.max_rel_err <= m16.validation.tolerance == m32.validation.tolerance
    assert "fp16" in m16.validation.tolerance_basis["reason"] and "fp16" not in m32.validation.tolerance_basis["reason"]
    e16, e32 = (load(demo_bundles[k], LoadOptions(**RING)) for k in ("fp16", "fp32"))
    assert {a.dtype for a in (*e16.pool.keys, *e16.pool.values)} == {np.dtype(np.float16)}
    assert e16.pool.decode.cos_cache.dtype == e16.pool.decode.attn_mask.dtype == np.float32  # the activations'
    assert 2 * e16.pool.kv_nbytes() == e32.pool.kv_nbytes() == 2 * StaticPool.estimate_kv_bytes(m16, e16.geometry)


def test_a_bundle_without_the_field_keeps_its_activation_dtype_and_an_unknown_one_is_refused():
    from edge_runtime.errors import BundleError
    from edge_runtime.manifest import GraphSpec

    spec = GraphSpec("m", "d", "ort", 24, "int4", "float32", {}, {}, {"update": "in_place_scatter"}, 0)
    assert spec.kv_dtype == "float32"
    with pytest.raises(BundleError, match=r"graph\.kv\.dtype 'int3'"):
        _ = GraphSpec(**{**spec.__dict__, "kv": {"dtype": "int3"}}).kv_dtype


def test_fp16_kv_decodes_as_the_fp32_kv_bundle_within_int8_activation_noise(demo_bundles):
    """Teacher-forced through a ring that wraps four times: every step's logits against the fp32-KV bundle's.
    fp16 rounds each K/V element by up to 2^-11; the MatMulQ4 products round their input activations to int8,
    which turns that into flipped codes (1/254 of a block's max each). Measured on this model: 7.8e-3 at most,
    median 1.6e-3, the greedy token the same at 149 of 150 steps."""
    from edge_runtime.engine import LoadOptions, load

    e16, e32 = (load(demo_bundles[k], LoadOptions(**RING)) for k in ("fp16", "fp32"))
    prompt = list(range(40, 60))
    l16, l32 = e16.prefill(prompt), e32.prefill(prompt)
    errs, same = [], []
    for _ in range(150):
        errs.append(np.abs(l16 - l32).max() / np.abs(l32).max())
        token = int(np.argmax(l32))
        same.append(int(np.argmax(l16)) == token)
        l16, l32 = e16.decode(token), e32.decode(token)
    assert e16.ring.tokens > 4 * (RING["sinks"] + RING["window"])
    assert max(errs) < 2e-2 and np.median(errs) < 4e-3
    assert sum(same) >= 0.95 * len(same)


def test_a_session_snapshot_of_an_fp16_cache_round_trips(demo_bundles, tmp_path):
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.session import RingOverflowWarning, Session

    opts = LoadOptions(**RING)
    session = Session(load(demo_bundles["fp16"], opts))
    with pytest.warns(RingOverflowWarning):  # past capacity: rows reused
        session.prefill(list(range(40, 90)))
    session.save(str(tmp_path / "s"))
    want = session.engine.decode(7)
    other = Session(load(demo_bundles["fp16"], opts))
    other.load(str(tmp_path / "s"))
    assert other.engine.pool.keys[0].dtype == np.float16
    assert np.array_equal(other.engine.decode(7), want)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--quant", "int4", "--kernel", "edge", "--flavor", "trt"], "--kv-dtype fp16 needs the ort flavor"),
        (["--quant", "int4", "--kernel", "mlas"], "--kv-dtype fp16 needs --kernel edge with a quantized model"),
        (["--quant", "none"], "--kv-dtype fp16 needs --kernel edge with a quantized model"),
    ],
)
def test_the_cli_refuses_fp16_kv_where_onnx_runtimes_attention_would_run(args, message, tmp_path):
    from click.testing import CliRunner

    from edge_runtime.cli.export import main

    result = CliRunner().invoke(main, ["demo", "-o", str(tmp_path / "b"), *args, "--kv-dtype", "fp16"])
    assert result.exit_code == 1 and not (tmp_path / "b").exists()
    assert result.output.count("\n") == 1 and message in result.output


def test_fp16_kv_is_refused_where_ring_attention_does_not_take_the_head_size():
    from edge_runtime.exporters.decoder import Flavor, KvDtype, kv_dtype_problem
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod

    quant = QuantConfig(QuantMethod.INT4, 32, kernel=MatMulKernel.EDGE)
    args = SimpleNamespace(head_dim=576, rotary_dim=576)  # the two dims it reads; RingAttention takes D <= 512
    assert "RingAttention does not take head size 576" in kv_dtype_problem(args, Flavor.ORT, quant, KvDtype.FP16)
    assert kv_dtype_problem(args, Flavor.ORT, quant, KvDtype.FP32) is None
