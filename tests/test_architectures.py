"""Every registered architecture end to end, against `transformers` itself: a tiny random checkpoint of each
`model_type` is exported in both flavors, and the runtime's greedy tokens equal `generate`'s for 64 tokens;
past the ring's capacity each step's logits stay within the export tolerance of the StreamingLLM reference;
an int4 export (both kernels) passes the exporter's own validation and decodes.

The meta-test in test_models.py makes sure each architecture has a tiny config; this makes sure each one runs.
"""

from __future__ import annotations

import numpy as np
import pytest

from edge_runtime.engine import LoadOptions, load
from edge_runtime.exporters import ReferenceModel, load_checkpoint
from edge_runtime.exporters.decoder import Flavor
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.quant import MatMulKernel, QuantConfig, QuantMethod
from edge_runtime.exporters.reference import StreamingReference
from edge_runtime.exporters.validate import TOLERANCE
from edge_runtime.models import ALIASES, ARCHITECTURES

from .tiny_models import TINY_CONFIGS, save_tiny_checkpoint

torch = pytest.importorskip("torch")

# One tiny config per model_type: the first registered, so a new architecture is covered by adding its config;
# and the configs whose layers run another path of an existing type (Qwen2/Qwen3's sliding-window layers).
BY_TYPE = {}
for _name, _cfg in TINY_CONFIGS.items():
    BY_TYPE.setdefault(_cfg["model_type"], _name)
VARIANTS = ["qwen2-sliding", "qwen3-sliding"]
NEW_TOKENS = 64


def test_every_model_type_is_run_end_to_end():
    assert set(BY_TYPE) >= set(ARCHITECTURES) | set(ALIASES)


@pytest.fixture(scope="module", params=sorted(BY_TYPE.values()) + VARIANTS)
def tiny(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    hf = save_tiny_checkpoint(request.param, d)
    return request.param, d, hf


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        ids = torch.tensor([prompt])
        # An explicit mask: with pad_token_id = BOS = 0, generate would mask the prompt's BOS out.
        mask = torch.ones_like(ids)
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=2)
    return out[0, len(prompt) :].tolist()


def engine_greedy(engine, prompt: list[int], n: int) -> list[int]:
    logits, out = engine.prefill(prompt), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = engine.decode(out[-1])
    return out


@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
def test_greedy_equals_transformers_generate(tiny, flavor, tmp_path):
    name, ckpt_dir, hf = tiny
    export(ExportOptions(checkpoint=ckpt_dir, out=tmp_path / "b", flavor=flavor, window=200))
    prompt = [0, 17, 33, 99, 250, 7]
    assert engine_greedy(load(tmp_path / "b"), prompt, NEW_TOKENS) == hf_greedy(hf, prompt, NEW_TOKENS), name


@pytest.mark.parametrize("flavor", list(Flavor), ids=lambda f: f.value)
def test_past_capacity_within_export_tolerance(tiny, flavor, tmp_path):
    """Capacity 4 + 16 rows, 70 tokens: the ring wraps three times; every step against StreamingLLM's semantics."""
    name, ckpt_dir, _ = tiny
    export(ExportOptions(checkpoint=ckpt_dir, out=tmp_path / "b", flavor=flavor, sinks=4, window=16))
    engine = load(tmp_path / "b", LoadOptions(spin=False))
    ckpt = load_checkpoint(ckpt_dir)
    geo = engine.geometry  # a model trained with a local window (Mistral) is exported with no sinks, that window
    stream = StreamingReference(ReferenceModel(ckpt.args, ckpt.weights), geo.sinks, geo.window)
    ids = np.random.default_rng(4).integers(0, ckpt.args.vocab_size, 70)
    got = engine.prefill(ids[:5].tolist(), all_logits=True)
    errs = [_rel(got[i], stream.step(int(t))) for i, t in enumerate(ids[:5])]
    errs += [_rel(engine.decode(int(t)), stream.step(int(t))) for t in ids[5:]]
    assert max(errs) <= TOLERANCE["fp32"], f"{name}: worst step {int(np.argmax(errs))}: {max(errs):.2e}"


@pytest.mark.parametrize("kernel", list(MatMulKernel), ids=lambda k: k.value)
def test_int4_export_validates_and_decodes(tiny, kernel, tmp_path):
    name, ckpt_dir, _ = tiny
    quant = QuantConfig(method=QuantMethod.INT4, block=32, kernel=kernel)
    manifest = export(ExportOptions(checkpoint=ckpt_dir, out=tmp_path / "b", window=64, quant=quant))
    assert manifest.validation.max_rel_err <= manifest.validation.tolerance, name  # export raises otherwise
    out = engine_greedy(load(tmp_path / "b", LoadOptions(spin=False)), [0, 5, 9], 8)
    assert len(out) == 8


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())
