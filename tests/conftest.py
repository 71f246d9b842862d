from __future__ import annotations

import os

import pytest

# Tests run on 2-core CI machines: keep torch from oversubscribing them.
os.environ.setdefault("OMP_NUM_THREADS", "2")


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
