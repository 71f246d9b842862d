"""Validate a built graph on ONNX Runtime CPU against the float64 StreamingLLM reference.

The grid (docs/architecture.md §5): prefills of 1, 7 and 64 tokens each followed by decode steps,
with a cache large enough to stay under capacity (= dense attention); and a small ring (S=4, W=16)
driven through a 64-token chunked prefill and decode past several wraps. Every logits row of every
call is compared; the figure is max |graph - reference| / max |reference| per case.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from edge_runtime.manifest import LOCAL_CAPACITY_DIM
from edge_runtime.models import ModelArgs, ModelWeights
from edge_runtime.ring import LocalLayers, RingGeometry, RingState

from .decoder import Flavor
from .lazy_layers import LazyLayers
from .progress import Progress, as_progress
from .reference import Int8Activations, ReferenceModel, Stream, forward_streams

TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2}
# MatMulNBits with accuracy_level 4 quantizes each activation block to int8 (scale = block max / 127)
# before the integer dot products, so the graph no longer computes with the reference's activations.
# Measured (ORT 1.32, x86): one MatMulNBits equals a numpy emulation of that rounding to 3e-7, and
# the whole graph of the same weights at accuracy_level 0 matches the reference to ~2e-6. With int8
# activations the validation grid gives 2.3e-2..9.1e-2 on the six random tiny test models (INT8,
# INT4 block 32) and 7e-3..2e-2 on the trained demo model (INT8; INT4 RTN/AWQ/GPTQ, blocks 32 and
# 128; pruned). Random tiny models amplify the rounding; 0.15 leaves a 1.6x margin over them. It only
# has to catch gross breakage: export.py also validates the same integer weights at accuracy_level 0
# against the fp32 tolerance.
INT8_ACTIVATION_TOLERANCE = 0.15
# A real model can round further than the tiny ones: on Gemma 3 270M (plain --quant int4) a numpy float32 forward
# with the same int8 rounding of every product's input (int8_probe) is 0.145 off float64 on the grid's dense
# cases, where MatMulQ4 is 0.156 and MatMulNBits 0.169 off: the arithmetic is right and the fixed bound too tight. So
# the bound is max(INT8_ACTIVATION_TOLERANCE, INT8_FACTOR * the probe's worst error on the dense cases), measured
# per export as the fp32 bound is (docs/decisions/int8-activation-bound.md).
INT8_FACTOR = 1.5


def tolerance_for(precision: str, *, int8_activations: bool) -> float:
    return max(TOLERANCE[precision], INT8_ACTIVATION_TOLERANCE) if int8_activations else TOLERANCE[precision]


# An fp32 graph cannot be closer to float64 than float32 arithmetic on its weights allows, and some
# weights amplify rounding far more than others (a pruned SmolLM2-135M: a numpy float32 forward is
# already ~1e-4 off float64). So the fp32 bound is measured per export: a float32 copy of the reference
# (the probe) scores the very tokens of the grid's dense cases, and its worst error against float64,
# e32, sets the bound max(1e-4, FP32_FACTOR * e32). The graph rounds as often as numpy but in another
# order (MLAS's blocked, fused sums; GroupQueryAttention's softmax), so its error is of e32's size, not
# equal to it. Measured (ORT 1.32, x86), graph / e32 over the whole grid: 0.86..2.44 on the six tiny
# test models and the demo model, both flavors; 0.32..1.72 on the tiny model with q and k scaled by
# 4..32 (e32 up to 3e-4, where a probe on other random tokens than the grid's was off by up to 10x:
# hence the same tokens); on SmolLM2-135M 0.86..0.88 (fp32, e32 4.0e-6, both flavors) and 2.42 pruned
# by 25% (graph 1.9e-4, e32 8.0e-5; refused by the old fixed 1e-4). FP32_FACTOR leaves over 3x margin;
# the grid still refuses a graph whose logits are 1e-3 off where e32 is the tiny models' ~1e-6. Past
# FP32_CAP the weights are too ill-conditioned for a float32 graph to be validated at all.
FP32_FACTOR = 8.0
FP32_CAP = 5e-3


@dataclass(frozen=True)
class Tolerance:
    value: float
    basis: dict[str, Any]  # how `value` was set, for the manifest's validation record


def fixed_tolerance(precision: str, *, int8_activations: bool) -> Tolerance:
    if int8_activations:
        return Tolerance(
            tolerance_for(precision, int8_activations=True),
            {"rule": "fixed", "reason": "MatMulNBits accuracy_level 4 rounds activations to int8 (validate.py)"},
        )
    return Tolerance(TOLERANCE[precision], {"rule": "fixed", "reason": f"{precision} compute"})


# An fp16 KV cache (--kv-dtype fp16) rounds each K/V element to 2^-11 relative, a q8 one (int8 codes, one
# scale max/127 a row) to 1/254 of its row's max: the int8 activations' own step. Both exist only in
# --kernel edge graphs, whose int8 activations already set the tolerance (INT8_ACTIVATION_TOLERANCE).
# Measured (INT4 block 32, --kernel edge), the grid's cases with an fp32 / fp16 / q8 cache: demo model
# 3.6e-3..1.2e-2 / 3.6e-3..8.1e-3 / 4.0e-3..1.1e-2; SmolLM2-135M 3.4e-2..7.7e-2 / 3.5e-2..7.7e-2 /
# 3.5e-2..9.9e-2 (q8 the closest to the 0.15, 1.5x under it). The demo bundles' logits differ from the
# fp32-KV one's per decode step by at most 7.8e-3 (fp16) and 9.0e-3 (q8) (tests/test_kv_fp16.py,
# test_kv_q8.py). The tolerance stays; the record says the cache's type and that the accuracy_level 0
# twin ran an fp32 one.
def with_kv_dtype(tol: Tolerance, kv_dtype: str) -> Tolerance:
    """`tol` recorded for a graph whose cache is `kv_dtype` ("float16" or "q8", a manifest KV_DTYPES name)."""
    base = str(tol.basis.get("reason", "")).removesuffix(" (validate.py)")
    rounding = {"float16": "fp16, rounding 2^-11 per element", "q8": "q8 rows, rounding 1/254 of each row's max"}
    reason = (
        f"{base}; K/V cached as {rounding[kv_dtype]}, at most the int8 activations' own step; the accuracy_level 0 "
        "twin ran an fp32 cache (validate.py)"
    )
    return Tolerance(tol.value, {**tol.basis, "reason": reason, "kv_dtype": kv_dtype})


def float32_probe(args: ModelArgs, weights: ModelWeights, reference: ReferenceModel) -> ReferenceModel | None:
    """The float32 twin of `reference` for fp32_tolerance; None where the reference is float32 itself."""
    return ReferenceModel(args, weights, np.float32) if reference.dtype == np.float64 else None


def int8_probe(args: ModelArgs, weights: ModelWeights, rounding: Int8Activations) -> ReferenceModel:
    """A float32 forward of the same weights whose Linears round their inputs as the graph's integer products
    do (int8_tolerance)."""
    return ReferenceModel(args, weights, np.float32, int8_activations=rounding)


def int8_tolerance(probe_error: float) -> Tolerance:
    """The bound of a graph with int8 activations, given int8_probe's worst error on the dense cases."""
    return Tolerance(
        max(INT8_ACTIVATION_TOLERANCE, INT8_FACTOR * probe_error),
        {
            "rule": f"max({INT8_ACTIVATION_TOLERANCE:g}, factor * int8_probe_rel_err)",
            "int8_probe_rel_err": probe_error,
            "factor": INT8_FACTOR,
            "reason": "MatMulNBits accuracy_level 4 / MatMulQ4 / MatMulQ8 round activations to int8; a numpy float32 "
            "forward with the same rounding, on the tokens of the dense cases, against the reference (validate.py)",
        },
    )


def fp32_tolerance(cases: Sequence[CaseResult]) -> Tolerance:
    """The fp32 bound for a grid run with a float32 probe (see FP32_FACTOR); the floor without one."""
    floor = TOLERANCE["fp32"]
    probed = [c.float32_rel_err for c in cases if c.float32_rel_err is not None]
    if not probed:
        reason = "the reference computes in float32 itself (no float64 copy of a model this large): nothing to measure"
        return Tolerance(floor, {"rule": "fixed", "reason": reason})
    e32 = max(probed)
    return Tolerance(
        min(max(floor, FP32_FACTOR * e32), FP32_CAP),
        {
            "rule": f"min(max({floor:g}, factor * float32_rel_err), {FP32_CAP:g})",
            "float32_rel_err": e32,
            "factor": FP32_FACTOR,
            "reason": "a numpy float32 forward of the exported weights, on the tokens of the dense cases, against "
            "the float64 reference: the graph computes in float32 too, summing in another order (validate.py)",
        },
    )


def local_layers(reference: ReferenceModel) -> LocalLayers | None:
    """The runtime's view of the model's local layers (what the manifest records), None without any."""
    a = reference.args
    if not a.local_layers or a.local_window is None:
        return None
    return LocalLayers(window=a.local_window, inv_freq=reference.local_inv_freq)


class NumpyGraphRunner:
    """Drives a decoder graph with plain `session.run` and numpy cache buffers (no IOBinding): the
    simplest correct host loop, used to validate graphs."""

    def __init__(
        self,
        session: ort.InferenceSession,
        *,
        flavor: Flavor,
        dtype: np.dtype,
        kv_heads: Sequence[int],
        head_dim: int,
        inv_freq: np.ndarray,
        geometry: RingGeometry,
        position_offset: int = 0,
        local: LocalLayers | None = None,
    ):
        """`local`: the model's local layers (Gemma 3), whose inputs the graph then takes too."""
        self.session, self.flavor, self.dtype = session, flavor, np.dtype(dtype)
        self.state = RingState(geometry, inv_freq, position_offset, local=local)
        c = geometry.capacity
        # The cache's dtype is the graph's past_key.0 type: fp16 or q8 rows (uint8, 4 + D wide, a static dim)
        # under fp32 activations with --kv-dtype.
        kv = next(i for i in session.get_inputs() if i.name == "past_key.0")
        kv_dtype = {"tensor(float16)": np.float16, "tensor(uint8)": np.uint8}.get(kv.type, self.dtype)
        row = kv.shape[3] if isinstance(kv.shape[3], int) else head_dim
        # A local layer's buffer is the local ring's (its rows dimension says so: manifest.LOCAL_CAPACITY_DIM).
        rows = {i.name: i.shape[2] for i in session.get_inputs() if i.name.startswith("past_key.")}
        self.local_layers = {i for i in range(len(kv_heads)) if rows[f"past_key.{i}"] == LOCAL_CAPACITY_DIM}
        if self.local_layers and self.state.local_ring is None:
            raise ValueError("a graph with local-ring layers validated without the model's local layers")  # a bug
        caps = [
            self.state.local_ring.geometry.capacity if i in self.local_layers and self.state.local_ring else c
            for i in range(len(kv_heads))
        ]
        self.keys = [np.zeros((1, h, cap, row), kv_dtype) for h, cap in zip(kv_heads, caps, strict=True)]
        self.values = [np.zeros((1, h, cap, row), kv_dtype) for h, cap in zip(kv_heads, caps, strict=True)]
        self.inputs = {i.name for i in session.get_inputs()}
        self.rotary_cache = dict(zip(("cos_cache", "sin_cache"), self.state.rotary_cache(self.dtype), strict=True))

    def feed(self, tokens: Sequence[int], max_chunk: int | None = None) -> np.ndarray:
        """Run `tokens` through the graph in ring-legal chunks; logits [n, V] of every token."""
        out, pos = [], 0
        for n in self.state.chunks(len(tokens), max_chunk):
            out.append(self._call(np.asarray(tokens[pos : pos + n], dtype=np.int64)))
            pos += n
        return np.concatenate(out)

    def _call(self, ids: np.ndarray) -> np.ndarray:
        n = ids.shape[0]
        trt = self.flavor is Flavor.TRT
        plan = self.state.plan(n, new_rows_as_columns=trt, dtype=self.dtype)
        feeds = {k: v for k, v in (plan.feeds(ids, n) | self.rotary_cache).items() if k in self.inputs}
        if trt:
            feeds |= {f"past_{kind}.{i}": buf[i] for kind, buf in (("key", self.keys), ("value", self.values))
                      for i in range(len(self.keys))}  # fmt: skip
            names = [o.name for o in self.session.get_outputs()]
            result = dict(zip(names, self.session.run(names, feeds), strict=True))
            rows = {False: int(plan.write_index[0])}
            if plan.write_index_local is not None:
                rows[True] = int(plan.write_index_local[0])
            for i in range(len(self.keys)):  # the host places the new rows: contiguous, by the chunking
                row = rows[i in self.local_layers]
                self.keys[i][:, :, row : row + n] = result[f"new_key.{i}"]
                self.values[i][:, :, row : row + n] = result[f"new_value.{i}"]
            return result["logits"][0]
        # `ort`: the buffers are bound as both past_* and present_*, as the runtime binds them; the
        # graph writes its new rows in place (GroupQueryAttention and TensorScatter alike).
        io = self.session.io_binding()
        io.bind_output("logits")  # first: copy_outputs_to_cpu returns outputs in binding order
        for name, arr in feeds.items():
            io.bind_cpu_input(name, np.ascontiguousarray(arr))
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            for kind, buf in (("key", k), ("value", v)):
                value = ort.OrtValue.ortvalue_from_numpy(buf)
                io.bind_ortvalue_input(f"past_{kind}.{i}", value)
                io.bind_ortvalue_output(f"present_{kind}.{i}", value)
        self.session.run_with_iobinding(io)
        return io.copy_outputs_to_cpu()[0][0]


@dataclass
class CaseResult:
    name: str
    tokens: int
    max_rel_err: float
    float32_rel_err: float | None = None  # the probe's error on the same tokens (dense cases, with a probe)
    stream: Stream | None = None  # the tokens the graph was fed, for another grid to follow (validation_grid)


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours.astype(np.float64) - ref).max() / np.abs(ref).max())


def run_case(
    session: ort.InferenceSession,
    reference: ReferenceModel,
    *,
    flavor: Flavor,
    dtype: np.dtype,
    kv_heads: Sequence[int],
    geometry: RingGeometry,
    prompt: Sequence[int],
    decode: int,
    max_chunk: int | None = None,
    position_offset: int = 0,
) -> float:
    """Prefill `prompt`, then greedy-decode `decode` tokens; the max relative error over every logits row."""
    stream, outs = _graph_case(
        session, reference, flavor=flavor, dtype=dtype, kv_heads=kv_heads, geometry=geometry, prompt=prompt,
        decode=decode, max_chunk=max_chunk, position_offset=position_offset,
    )  # fmt: skip
    return rel_err(outs, forward_streams(reference, [stream])[0])


def _graph_case(
    session: ort.InferenceSession,
    reference: ReferenceModel,
    *,
    flavor: Flavor,
    dtype: np.dtype,
    kv_heads: Sequence[int],
    geometry: RingGeometry,
    prompt: Sequence[int],
    decode: int,
    max_chunk: int | None = None,
    position_offset: int = 0,
    follow: Sequence[int] | None = None,
) -> tuple[Stream, np.ndarray]:
    """The graph's logits [T, V] for `prompt` and `decode` greedy tokens it picks itself (as the runtime would),
    and the stream the reference must score: dense attention while nothing is evicted, else the ring's.
    `follow`: the whole token stream (`prompt` and `decode` more) to feed instead of the graph's own picks."""
    if follow is not None and (len(follow) != len(prompt) + decode or list(follow[: len(prompt)]) != list(prompt)):
        raise ValueError("a followed stream must start with the case's prompt and have its length")  # a caller bug
    runner = NumpyGraphRunner(
        session,
        flavor=flavor,
        dtype=dtype,
        kv_heads=kv_heads,
        head_dim=reference.args.head_dim,
        inv_freq=reference.inv_freq,
        geometry=geometry,
        position_offset=position_offset,
        local=local_layers(reference),
    )
    outs = [runner.feed(prompt, max_chunk)]
    tokens = [int(t) for t in prompt]
    for _ in range(decode):
        tokens.append(int(np.argmax(outs[-1][-1])) if follow is None else int(follow[len(tokens)]))
        outs.append(runner.feed(tokens[-1:]))
    # Nothing evicted: StreamingLLM is dense attention, which the reference scores in one forward.
    dense = len(prompt) + decode <= geometry.sinks + geometry.window
    return Stream(tuple(tokens), None if dense else (geometry.sinks, geometry.window)), np.concatenate(outs)


class ReferenceMemo:
    """The reference's logits per stream, kept across the grids of one export (the accuracy_level 0 twin
    and the bundle's graph pick the same tokens but for a near tie): each stream is scored once, and all
    the grid's streams in one pass over the layers (forward_streams)."""

    def __init__(self, reference: ReferenceModel, probe: ReferenceModel | None = None):
        self.reference, self.probe = reference, probe
        self._logits: dict[Stream, np.ndarray] = {}
        self._probed: dict[Stream, float] = {}

    def score(self, streams: Sequence[Stream], *, probed: bool = True, progress: Progress | None = None) -> int:
        """Score the streams not scored before, and with `probed` (and a probe) have the probe score the dense
        ones not probed before; a stage over the passes' layers on `progress`. The number of passes run."""
        todo = list(dict.fromkeys(s for s in streams if s not in self._logits))
        dense = []
        if probed and self.probe is not None:
            dense = list(dict.fromkeys(s for s in streams if s.ring is None and s not in self._probed))
        passes = [(m, ss) for m, ss in ((self.reference, todo), (self.probe, dense)) if ss]
        if not passes:
            return 0
        progress = as_progress(progress)
        tokens = sum(len(s.tokens) for s in todo)
        plan = f"{len(todo)} streams, {tokens} tokens in {self.reference.dtype.name}" + (
            f", then {len(dense)} dense ones in float32 for the fp32 bound" if dense else ""
        )
        layers = len(self.reference.layers)
        with progress.stage("reference forward", layers * len(passes), "layer", plan=plan) as stage:
            for model, ss in passes:
                stage.status(f"{model.dtype.name} pass, layer 1/{layers}")

                def done(i: int, model: ReferenceModel = model) -> None:
                    stage.advance()
                    stage.status(f"{model.dtype.name} pass, layer {min(i + 2, layers)}/{layers}")

                for s, logits in zip(ss, forward_streams(model, ss, on_layer=done), strict=True):
                    if model is self.reference:
                        self._logits[s] = logits
                    else:
                        self._probed[s] = rel_err(logits, self._logits[s])
        return len(passes)

    def logits(self, stream: Stream) -> np.ndarray:
        return self._logits[stream]

    def probe_error(self, model: ReferenceModel, streams: Sequence[Stream], progress: Progress | None = None) -> float:
        """`model`'s worst rel_err against the reference's logits on the dense ones of `streams` (scored
        already): one pass over its layers."""
        dense = list(dict.fromkeys(s for s in streams if s.ring is None))
        layers = len(model.layers)
        plan = f"{len(dense)} dense streams in float32 with int8-rounded Linear inputs, for the int8 bound"
        with as_progress(progress).stage("int8 probe", layers, "layer", plan=plan) as stage:
            logits = forward_streams(model, dense, on_layer=lambda i: stage.advance())
        return max((rel_err(x, self._logits[s]) for s, x in zip(dense, logits, strict=True)), default=0.0)

    def probed(self, stream: Stream) -> float | None:
        return self._probed.get(stream)


def validation_grid(
    session: ort.InferenceSession | Callable[[], ort.InferenceSession],
    reference: ReferenceModel,
    *,
    flavor: Flavor,
    dtype: np.dtype,
    kv_heads: Sequence[int],
    sliding_window: int | None = None,
    seed: int = 0,
    progress: Progress | Callable[[str], None] | None = None,
    probe: ReferenceModel | None = None,
    memo: ReferenceMemo | None = None,
    follow: Sequence[CaseResult] | None = None,
) -> list[CaseResult]:
    """The grid's cases; with `probe` (a float32 ReferenceModel of the same weights), each dense case also
    gives the probe's error against `reference` on the same tokens (fp32_tolerance). The graph runs every
    case first, then the reference scores them all in one pass over its layers; `memo` keeps those scores
    for another grid of the same export. `session` may be a function that opens it: it is then closed before
    the reference runs, so the exporter never holds ONNX Runtime's copy of the weights and the reference's
    layers at once.

    `follow`: an earlier grid's results (same seed) whose token streams this graph is fed instead of picking its
    decode tokens itself, so the memo's reference logits serve both grids and the reference runs once per case.
    Every logits row is still compared: whose argmax chose the next token does not change what is checked, and
    a graph with int8 activations picked other tokens than its twin at near ties, which cost a second float64
    pass over the whole model."""
    progress = as_progress(progress)
    if memo is None:
        memo = ReferenceMemo(reference, probe)
    elif probe is not None and memo.probe is not probe:
        raise ValueError("validation_grid: `probe` must be the memo's own")  # a caller bug
    vocab = reference.args.vocab_size
    rng = np.random.default_rng(seed)
    # A model trained with a local window (Mistral) is validated under that window, without sinks.
    dense = RingGeometry(sinks=4, window=128) if sliding_window is None else RingGeometry(0, min(sliding_window, 128))
    ring = RingGeometry(sinks=4, window=16, slack=7)
    cases = [(f"prefill {n} + decode 8 (under capacity)", dense, rng.integers(0, vocab, n), 8) for n in (1, 7, 64)]
    cases.append(("prefill 64 + decode 40 past capacity (S=4, W=16, >=3 wraps)", ring, rng.integers(0, vocab, 64), 40))
    if follow is not None and [c.name for c in follow] != [c[0] for c in cases]:
        raise ValueError("validation_grid: `follow` must be a grid of the same cases")  # a caller bug
    ran = []
    steps = sum(1 + decode for *_, decode in cases)  # a prefill and the decode steps: the graph's calls, roughly
    with progress.stage("running the graph", len(cases), "case", plan=f"{steps} prefill and decode steps") as st:
        st.status("opening the ONNX Runtime session")
        live = session() if callable(session) else session
        for k, (name, geometry, prompt, decode) in enumerate(cases):
            st.status(name)
            t0 = time.perf_counter()
            stream, outs = _graph_case(
                live, reference, flavor=flavor, dtype=dtype, kv_heads=kv_heads, geometry=geometry,
                prompt=prompt.tolist(), decode=decode, follow=None if follow is None else follow[k].stream.tokens,
            )  # fmt: skip
            ran.append((name, stream, outs, time.perf_counter() - t0))
            st.advance()
        del live  # the last reference to a session this function opened: its weights go before the reference runs
    gc.collect()
    if not memo.score([stream for _, stream, _, _ in ran], probed=probe is not None, progress=progress):
        progress(f"  the reference's logits of all {len(ran)} streams reused from the earlier grid")
    LazyLayers.release_all()  # the reference's last layer is not needed by the next grid's session
    results = []
    for name, stream, outs, seconds in ran:
        err = rel_err(outs, memo.logits(stream))
        probed = memo.probed(stream) if probe is not None else None
        results.append(CaseResult(name, len(stream.tokens), err, probed, stream))
        also = "" if probed is None else f" (numpy float32: {probed:.2e})"
        progress(f"  validate {name}: max rel err {err:.2e}{also} (graph {seconds:.1f}s)")
    return results
