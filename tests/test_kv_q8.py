"""A q8 KV cache (`edge-export --kv-dtype q8`): each row of K and V is its fp32 scale (max |x| / 127)
followed by its D int8 codes, stored as uint8 [1, Hkv, C, 4 + D] (csrc/simd.h); value = code * scale.

LinearAttention and RingAttention are checked against themselves with an fp32 cache holding the rows'
values: bit for bit where the new rows are exactly representable, to the rounding of the new rows
otherwise; the new rows' bytes against a numpy transcription of the quantization."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from edge_runtime import kernels

from .test_kernels import _attention_graph, _session, needs_kernels
from .test_ring_attention import CASES, _feeds, _ring_graph

pytestmark = needs_kernels


def quantize(x: np.ndarray) -> np.ndarray:
    """Rows x [..., D] float32 as q8 rows [..., 4 + D] uint8: the kernels' arithmetic, in float32."""
    amax = np.abs(x).max(axis=-1, keepdims=True).astype(np.float32)
    scale = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    codes = np.clip(np.rint(x * inv), -127, 127).astype(np.int8)
    return np.concatenate([scale.view(np.uint8), codes.view(np.uint8)], axis=-1)


def dequantize(rows: np.ndarray) -> np.ndarray:
    scale = np.ascontiguousarray(rows[..., :4]).view(np.float32)
    return rows[..., 4:].view(np.int8).astype(np.float32) * scale


def _q8_cache(model: bytes, d: int) -> bytes:
    """The same one-node graph with its caches typed uint8 q8 rows [1, Hkv, C, 4 + D]."""
    m = onnx.load_from_string(model)
    for vi in [*m.graph.input, *m.graph.output]:
        if vi.name in ("pk", "pv", "k", "v"):
            vi.type.tensor_type.elem_type = TensorProto.UINT8
            if vi.type.tensor_type.HasField("shape"):
                vi.type.tensor_type.shape.dim[3].Clear()
                vi.type.tensor_type.shape.dim[3].dim_value = d + 4
    return m.SerializeToString()


def _exact_rows(rng, shape: tuple[int, ...]) -> np.ndarray:
    """Rows the quantization keeps exactly: codes times a power of two, one code of each row at 127."""
    codes = rng.integers(-127, 128, shape).astype(np.float32)
    codes[..., 0] = 127
    return codes * np.float32(2.0) ** rng.integers(-4, 2, (*shape[:-1], 1)).astype(np.float32)


def _check(got: list[np.ndarray], want: list[np.ndarray], *, exact: bool) -> None:
    """got: the q8-cache op's (out, present_key, present_value); want: the fp32 op's on the dequantized cache."""
    assert got[1].dtype == got[2].dtype == np.uint8 and got[0].dtype == np.float32
    for a, b in zip(got[1:], want[1:], strict=True):  # every row: the old ones kept, the new ones quantized
        assert np.array_equal(a, quantize(b))
    if exact:
        assert np.array_equal(got[0], want[0])
    else:  # only the new rows' rounding (up to 1/254 of each row's max per element) separates them
        assert np.abs(got[0] - want[0]).max() / np.abs(want[0]).max() < 2e-2


def _cache(rng, hkv: int, cap: int, d: int) -> dict[str, np.ndarray]:
    return {n: quantize(rng.standard_normal((1, hkv, cap, d)).astype(np.float32)) for n in ("pk", "pv")}


def _fp32(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**feeds, "pk": dequantize(feeds["pk"]), "pv": dequantize(feeds["pv"])}


LINEAR = [(9, 3, 64, 300, 200, 1, 32), (4, 2, 16, 64, 0, 7, 8), (4, 2, 32, 64, 10, 5, 8), (8, 8, 128, 90, 37, 9, 24)]


@pytest.mark.parametrize("identity_rope", [True, False])
@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "past", "t", "half"), LINEAR)
def test_linear_attention_with_a_q8_cache_is_the_fp32_op_on_its_rows(hq, hkv, d, cap, past, t, half, identity_rope):
    rng = np.random.default_rng(past + t)
    width = (hq + 2 * hkv) * d
    qkv = rng.standard_normal((1, t, width)).astype(np.float32)
    if identity_rope:  # cos 1, sin 0 and rows q8 keeps exactly: no rounding at all
        qkv[..., hq * d :] = _exact_rows(rng, (1, t, 2 * hkv, d)).reshape(1, t, -1)
        angles = np.zeros((cap, half))
    else:
        angles = np.arange(cap)[:, None] * (10000.0 ** (-np.arange(half) / half))[None]
    feeds = {"qkv": qkv, "seq": np.array([past + t - 1], np.int32), **_cache(rng, hkv, cap, d)}
    feeds |= {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    graph = _attention_graph(kernels.LINEAR_ATTENTION, hq, hkv, d)
    got = _session(_q8_cache(graph, d)).run(None, feeds)
    want = _session(graph).run(None, _fp32(feeds))
    _check(got, want, exact=identity_rope)


@pytest.mark.parametrize("identity_rope", [True, False])
@pytest.mark.parametrize(("hq", "hkv", "d", "cap", "sinks", "t", "half", "write"), CASES)
def test_ring_attention_with_a_q8_cache_is_the_fp32_op_on_its_rows(
    hq, hkv, d, cap, sinks, t, half, write, identity_rope
):
    """CASES: decode and chunks, rows written mid-buffer and at its end (a wrapped ring), sinks, masks."""
    rng = np.random.default_rng(cap + t)
    feeds = {**_feeds(rng, hq, hkv, d, cap, sinks, t, half, write), **_cache(rng, hkv, cap, d)}
    if identity_rope:
        feeds["qkv"][..., hq * d :] = _exact_rows(rng, (1, t, 2 * hkv, d)).reshape(1, t, -1)
        feeds |= {n: np.ones_like(feeds[n]) for n in ("cos", "cos_sink")}
        feeds |= {n: np.zeros_like(feeds[n]) for n in ("sin", "sin_sink")}
    graph = _ring_graph(hq, hkv, d)
    got = _session(_q8_cache(graph, d)).run(None, feeds)
    want = _session(graph).run(None, _fp32(feeds))
    _check(got, want, exact=identity_rope)


# -- bundles -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_bundles(tmp_path_factory):
    """The demo model as INT4 --kernel edge bundles with an fp32 and a q8 KV cache (each export validates)."""
    from edge_runtime.exporters.decoder import KvDtype
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod
    from edge_runtime.models import resolve_checkpoint

    root = tmp_path_factory.mktemp("kv-q8")
    quant = QuantConfig(QuantMethod.INT4, 32, kernel=MatMulKernel.EDGE)
    for kv in (KvDtype.FP32, KvDtype.Q8):
        export(
            ExportOptions(
                checkpoint=resolve_checkpoint("demo"), out=root / kv.value, window=60, quant=quant, kv_dtype=kv
            )
        )
    return {"fp32": root / "fp32", "q8": root / "q8"}


RING = {"sinks": 4, "window": 28}  # the ring is full from token 32 on: decode reuses rows (RingAttention)


def test_the_manifest_says_q8_and_the_pool_allocates_its_rows(demo_bundles):
    from edge_runtime.bundle import open_bundle
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.pool import StaticPool

    m8 = open_bundle(demo_bundles["q8"]).manifest
    d = m8.model.head_dim
    assert m8.graph.kv_dtype == "q8" and m8.graph.kv_storage == "uint8" and m8.provenance["options"]["kv_dtype"] == "q8"
    assert m8.graph.inputs["past_key.0"] == {
        "dtype": "uint8",
        "shape": ["caches", m8.model.num_kv_heads[0], "capacity", d + 4],  # a batch of caches (row_cache)
    }
    assert m8.validation.max_rel_err <= m8.validation.tolerance and "q8" in m8.validation.tolerance_basis["reason"]
    e8, e32 = (load(demo_bundles[k], LoadOptions(**RING)) for k in ("q8", "fp32"))
    assert e8.pool.keys[0].dtype == np.uint8 and e8.pool.keys[0].shape[3] == d + 4
    assert e8.pool.kv_nbytes() == StaticPool.estimate_kv_bytes(m8, e8.geometry)
    assert e8.pool.kv_nbytes() * 4 * d == e32.pool.kv_nbytes() * (d + 4)  # 4 + D bytes a row against 4 D


def test_q8_kv_decodes_as_the_fp32_kv_bundle_within_int8_activation_noise(demo_bundles):
    """Teacher-forced through a ring that wraps four times, every step's logits against the fp32-KV bundle's.
    Measured on this model: 9.0e-3 at most, median 2.1e-3, the greedy token the same at 149 of 150 steps
    (fp16 KV: 7.8e-3, 1.6e-3, 149: tests/test_kv_fp16.py)."""
    from edge_runtime.engine import LoadOptions, load

    e8, e32 = (load(demo_bundles[k], LoadOptions(**RING)) for k in ("q8", "fp32"))
    prompt = list(range(40, 60))
    l8, l32 = e8.prefill(prompt), e32.prefill(prompt)
    errs, same = [], []
    for _ in range(150):
        errs.append(np.abs(l8 - l32).max() / np.abs(l32).max())
        token = int(np.argmax(l32))
        same.append(int(np.argmax(l8)) == token)
        l8, l32 = e8.decode(token), e32.decode(token)
    assert e8.ring.tokens > 4 * (RING["sinks"] + RING["window"])
    assert max(errs) < 2e-2 and np.median(errs) < 5e-3
    assert sum(same) >= 0.95 * len(same)


def test_a_session_snapshot_of_a_q8_cache_round_trips(demo_bundles, tmp_path):
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.session import RingOverflowWarning, Session

    opts = LoadOptions(**RING)
    session = Session(load(demo_bundles["q8"], opts))
    with pytest.warns(RingOverflowWarning):  # past capacity: rows reused
        session.prefill(list(range(40, 90)))
    session.save(str(tmp_path / "s"))
    want = session.engine.decode(7)
    other = Session(load(demo_bundles["q8"], opts))
    other.load(str(tmp_path / "s"))
    assert other.engine.pool.keys[0].dtype == np.uint8
    assert np.array_equal(other.engine.decode(7), want)


def test_the_cli_refuses_q8_kv_without_the_edge_kernels(tmp_path):
    from click.testing import CliRunner

    from edge_runtime.cli.export import main

    result = CliRunner().invoke(main, ["demo", "-o", str(tmp_path / "b"), "--quant", "int8", "--kv-dtype", "q8"])
    assert result.exit_code == 1 and not (tmp_path / "b").exists()
    assert result.output.count("\n") == 1 and "--kv-dtype q8 needs --kernel edge" in result.output
