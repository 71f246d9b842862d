"""The runtime on an (emulated) Raspberry Pi 5 against references computed on the x86 host.

Run by scripts/aarch64_check.sh inside qemu-aarch64 (QEMU_CPU=cortex-a76) with EDGE_RUNTIME_AARCH64_REFS
pointing at the folder written by `scripts/aarch64_host.py refs` (bundles exported on the host +
refs.npz). Without that variable the module is skipped: the host suite does not run it.

ONNX Runtime's aarch64 wheel runs other kernels than the x86 one, and numpy and tokenizers are other
builds, so nothing is compared bitwise with x86: the runtime's logits are held to the float64 reference
(run with the bundle's own weights), and the distance to the host runtime's logits is printed.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import numpy as np
import pytest

REFS = os.environ.get("EDGE_RUNTIME_AARCH64_REFS")
if not REFS:
    pytest.skip(
        "emulated Raspberry Pi 5 check: run scripts/aarch64_check.sh (sets EDGE_RUNTIME_AARCH64_REFS)",
        allow_module_level=True,
    )

from edge_runtime.engine import LoadOptions, load  # noqa: E402

REFS_DIR = Path(REFS)
META = json.loads((REFS_DIR / "refs.json").read_text())
# One ONNX Runtime intra-op thread: under qemu on a 2-core CI machine it halves the time per decode
# step (fp32 demo model: 0.075 s vs 0.163 s with the default), and every error below came out the
# same with 1 thread and the default (measured).
THREADS = int(os.environ.get("EDGE_RUNTIME_AARCH64_THREADS", "1"))

# Max |runtime - float64 reference| / max |reference| per step (logits row).
TOLERANCE = {
    "fp32": 1e-4,  # as tests/test_runtime.py and the exporter's fp32 validation
    "int4-exact": 1e-4,  # the int4 codes computed in fp32 (MatMulNBits accuracy_level 0): fp32 tolerance
    # The shipped int4 graph (accuracy_level 4) quantizes activations to int8 per block before the dot
    # products, in kernels that differ between x86 and the Pi 5 (NEON asimddp): the two runtimes differ
    # from each other by up to 0.27 in absolute logits (which reach about 14). Measured error vs the
    # float64 reference (ORT 1.32.0, this demo model, these inputs), greedy / past capacity:
    #   x86_64 host                      9.5e-3 / 1.43e-2
    #   aarch64, qemu cortex-a76         1.31e-2 / 1.42e-2
    # while the exact twin stays below 8e-7 on both (greedy; 1.3e-6 past capacity, measured once), so
    # the int4 weights themselves are reproduced and all of this is the int8 activations. 3e-2 is about
    # twice the worst measured on either platform: room for release noise, but a kernel twice as wrong
    # as today's fails. (At 1e-2, between the two platforms' greedy errors, x86 passes and aarch64 fails.)
    "int4": 3e-2,
}


@pytest.fixture(scope="module")
def refs():
    with np.load(REFS_DIR / "refs.npz") as z:
        return {k: z[k] for k in z.files}


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def rel_errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.array([rel(g, w) for g, w in zip(got, want, strict=True)])


def top2_margin(logits: np.ndarray) -> float:
    top = np.sort(logits, axis=-1)[:, -2:]
    return float((top[:, 1] - top[:, 0]).min())


def test_running_on_an_emulated_pi5_with_the_installed_wheel():
    import onnxruntime as ort

    import edge_runtime

    assert platform.machine() == "aarch64"
    cpuinfo = Path("/proc/cpuinfo").read_text()
    assert "Raspberry Pi 5" in cpuinfo and " asimddp" in cpuinfo  # the Cortex-A76 dot-product kernels
    assert "CPUExecutionProvider" in ort.get_available_providers()
    # The installed layout (exporters/ mapped to edge_runtime.exporters), not the repo's source folders.
    assert not Path(edge_runtime.__file__).is_relative_to(Path(__file__).parents[2])
    print(
        f"python {platform.python_version()} {platform.machine()}, onnxruntime {ort.__version__}, numpy "
        f"{np.__version__}, {THREADS} thread(s); host refs from {META['host']['machine']} with {META['versions']}"
    )


def test_tokenizer_build_matches_the_host(refs):
    from edge_runtime.tokenizer import Tokenizer

    tok = Tokenizer.for_engine(load(REFS_DIR / META["variants"][0], LoadOptions(threads=THREADS)))
    assert tok.encode(str(refs["prompt_text"])) == refs["prompt"].tolist()
    for variant in META["variants"]:
        assert tok.decode(refs[f"{variant}_greedy_tokens"].tolist()) == str(refs[f"{variant}_greedy_text"])


@pytest.mark.parametrize("variant", META["variants"])
def test_greedy_generation_and_logits_match_the_float64_reference(refs, variant):
    engine = load(REFS_DIR / variant, LoadOptions(threads=THREADS))
    want, tokens = refs[f"{variant}_greedy_logits"], refs[f"{variant}_greedy_tokens"]
    got = [engine.prefill(refs["prompt"]).astype(np.float64)]
    for t in tokens[:-1]:  # along the reference's path: while they agree, this is greedy generation
        got.append(engine.decode(int(t)).astype(np.float64))
    got = np.stack(got)
    errs = rel_errors(got, want)
    host = refs[f"{variant}_host_greedy_logits"]
    agree = got.argmax(-1) == tokens
    print(
        f"{variant}: {len(tokens)} greedy steps, max rel err vs float64 {errs.max():.2e} (step {errs.argmax()}, "
        f"max abs err {np.abs(got - want).max():.3f}, reference's smallest top-2 margin {top2_margin(want):.3f}); "
        f"host runtime {rel_errors(host, want).max():.2e}; aarch64 vs host runtime max abs diff "
        f"{np.abs(got - host).max():.2e}; greedy tokens equal to the reference's: {agree.sum()}/{len(tokens)}"
    )
    assert errs.max() <= TOLERANCE[variant], f"step {errs.argmax()}: {errs.max():.2e}"
    if variant != "int4":
        # Exact greedy parity, as on x86. Not for int4 with int8 activations: its logits move by up to
        # 0.093 (x86) / 0.107 (aarch64) while the reference's top-2 margin on this path falls to 0.024, so
        # an exact-token assertion would test luck (both agree 48/48 today); the logits bound is the check.
        assert agree.all(), f"greedy token differs from the reference first at step {np.flatnonzero(~agree)[0]}"


@pytest.mark.parametrize("variant", META["stream_variants"])
def test_static_pool_streamingllm_past_capacity(refs, variant):
    s = META["stream"]
    opts = LoadOptions(sinks=s["sinks"], window=s["window"], position_offset=s["position_offset"], threads=THREADS)
    engine = load(REFS_DIR / variant, opts)
    ids, want = refs["stream_ids"], refs[f"{variant}_stream_logits"]
    g = engine.geometry
    assert s["prompt"] > g.capacity and len(ids) - g.capacity >= 300  # prompt past capacity, decode far past it
    assert len(engine.ring.chunks(s["prompt"])) > 1  # the prompt really goes in several chunks
    buffers = [*engine.pool.keys, *engine.pool.values, engine.pool.logits, engine.pool.decode.attn_mask]
    pointers = [b.ctypes.data for b in buffers]

    got = [*engine.prefill(ids[: s["prompt"]], all_logits=True).astype(np.float64)]
    got += [engine.decode(int(t)).astype(np.float64) for t in ids[s["prompt"] :]]
    got = np.stack(got)
    errs = rel_errors(got, want)
    host = refs[f"{variant}_host_stream_logits"]
    print(
        f"{variant}: {len(ids)} tokens, capacity {g.capacity} (sinks {g.sinks}, window {g.window}, slack "
        f"{g.slack}), positions from {s['position_offset']}: max rel err vs float64 StreamingLLM {errs.max():.2e} "
        f"(step {errs.argmax()}); host runtime {rel_errors(host, want).max():.2e}; aarch64 vs host runtime max "
        f"abs diff {np.abs(got - host).max():.2e}"
    )
    assert [b.ctypes.data for b in buffers] == pointers  # the static pool never moved
    assert engine.tokens == len(ids)
    assert errs.max() <= TOLERANCE[variant], f"step {errs.argmax()}: {errs.max():.2e}"
