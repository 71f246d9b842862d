"""Host (x86) half of the emulated Raspberry Pi 5 check (scripts/aarch64_check.sh, tests/aarch64/).

    python scripts/aarch64_host.py requirements            # pinned aarch64 requirement lines
    python scripts/aarch64_host.py refs OUT                # bundles + float64 references in OUT

`requirements` pins every runtime dependency of pyproject.toml (and pytest) to the version installed
on the host, so the emulated side runs the same releases and a difference it finds is the platform's.

`refs` exports the demo model in `ort` flavor at fp32 and int4 (and int4's accuracy_level-0 twin) to
OUT/<variant>/ and writes OUT/refs.npz with what the aarch64 side compares against, per variant:
  - greedy: the float64 reference's greedy tokens (with the bundle's weights: int4 ones dequantized)
    and its logits at every step (prompt's last token, then each generated token);
  - streaming (fp32 and int4): random ids fed past the cache capacity with a small window (sinks 4, window 64) from
    position 10^7, and the float64 StreamingReference logits for each;
  - the host runtime's logits on both, for the record.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PROMPT = "ROMEO.\nWhat light through yonder window breaks?\n"
GREEDY_TOKENS = 48
STREAM = {"sinks": 4, "window": 64, "prompt": 150, "total": 450, "seed": 7, "position_offset": 10_000_000}
# The past-capacity run (the slow one under emulation) covers the two shipped graphs; int4-exact only
# checks the int4 weights' unpacking, which greedy decoding already exercises on every Linear.
STREAM_VARIANTS = ("fp32", "int4")
EXTRA_REQUIREMENTS = ["pytest"]  # the emulated side runs its checks with pytest


def requirements() -> list[str]:
    try:
        import tomllib  # Python >= 3.11

        deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    except ModuleNotFoundError:  # 3.10: the installed project's metadata (as of its last install)
        deps = [r for r in importlib.metadata.requires("edge-runtime") or [] if "extra ==" not in r]
    lines = []
    for spec in [*deps, *EXTRA_REQUIREMENTS]:
        name = re.match(r"[A-Za-z0-9_.-]+", spec).group(0)
        try:
            lines.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(spec.split(";")[0].strip())
    return lines


def _engine_logits(engine, prompt: np.ndarray, feed: np.ndarray) -> np.ndarray:
    """Logits [len(feed) + 1, V]: after the prompt's last token, then after each fed token."""
    out = [engine.prefill(prompt).astype(np.float64)]
    out += [engine.decode(int(t)).astype(np.float64) for t in feed]
    return np.stack(out)


def _variants():
    """name -> quantization of the `ort` fp32 bundles the Pi 5 check runs."""
    from edge_runtime.exporters.quant import QuantConfig, QuantMethod

    return {
        "fp32": QuantConfig(),
        # The shipped int4 graph: MatMulNBits block 32, accuracy_level 4 (int8 activations: the Pi 5's
        # dot-product kernels, which differ from x86's).
        "int4": QuantConfig(QuantMethod.INT4, 32),
        # Its exact twin: the same int4 codes computed in fp32 (accuracy_level 0), held to fp32 tolerance,
        # so an ARM-side error in unpacking the int4 weights cannot hide inside the int8 activation error.
        "int4-exact": QuantConfig(QuantMethod.INT4, 32, accuracy_level=0),
    }


def refs(out: Path) -> None:
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.exporters import ReferenceModel, load_checkpoint
    from edge_runtime.exporters.decoder import Flavor, Precision
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.exporters.quant_model import quantize_model
    from edge_runtime.exporters.reference import StreamingReference, greedy_generate
    from edge_runtime.models import DEMO_CHECKPOINT
    from edge_runtime.tokenizer import Tokenizer

    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    ckpt = load_checkpoint(DEMO_CHECKPOINT)
    s = STREAM
    ids = np.random.default_rng(s["seed"]).integers(0, ckpt.args.vocab_size, s["total"]).astype(np.int64)
    stream_opts = LoadOptions(sinks=s["sinks"], window=s["window"], position_offset=s["position_offset"])
    arrays: dict[str, np.ndarray] = {"prompt_text": np.array(PROMPT), "stream_ids": ids}
    records, references = {}, {}
    for name, quant in _variants().items():
        t0 = time.perf_counter()
        manifest = export(
            ExportOptions(
                checkpoint=DEMO_CHECKPOINT, out=out / name, flavor=Flavor.ORT, precision=Precision.FP32, quant=quant
            )
        )
        records[name] = {"validation_max_rel_err": manifest.validation.max_rel_err}
        t1 = time.perf_counter()
        engine = load(out / name)
        if "prompt" not in arrays:  # through the runtime's tokenizer wrapper, as on the device
            arrays["prompt"] = np.array(Tokenizer.for_engine(engine).encode(PROMPT), dtype=np.int64)
        prompt = arrays["prompt"]
        key = (quant.method, quant.block)  # accuracy_level changes the compute, not the weights
        if key not in references:
            # The float64 reference of what the bundle holds: the checkpoint's weights, or the same
            # dequantized int4 weights the exporter validated the graph against.
            weights = ckpt.weights
            if quant.enabled:
                weights = quantize_model(ckpt.args, ckpt.weights, ckpt.arch.weights, quant).weights
            ref = ReferenceModel(ckpt.args, weights)
            # Greedy: the reference's tokens, and its logits at every step from one full-sequence
            # forward (independent of the cached greedy loop).
            greedy = np.array(greedy_generate(ref, prompt.tolist(), GREEDY_TOKENS), dtype=np.int64)
            greedy_logits = ref.forward(np.concatenate([prompt, greedy[:-1]]))[len(prompt) - 1 :]
            assert (greedy_logits.argmax(-1) == greedy).all(), "full-sequence and cached reference forwards disagree"
            # Past capacity: a prompt longer than the capacity (prefilled in chunks), then decode far beyond.
            stream = StreamingReference(ref, s["sinks"], s["window"])
            references[key] = (greedy, greedy_logits, np.stack([stream.step(int(t)) for t in ids]))
        greedy, greedy_logits, stream_logits = references[key]
        arrays[f"{name}_greedy_tokens"] = greedy
        arrays[f"{name}_greedy_logits"] = greedy_logits
        arrays[f"{name}_greedy_text"] = np.array(Tokenizer.for_engine(engine).decode(greedy.tolist()))
        t2 = time.perf_counter()
        # The host runtime on the same inputs, for the record (and the int4 tolerance's justification).
        arrays[f"{name}_host_greedy_logits"] = _engine_logits(engine, prompt, greedy[:-1])
        if name in STREAM_VARIANTS:
            arrays[f"{name}_stream_logits"] = stream_logits
            engine = load(out / name, stream_opts)
            prefill = engine.prefill(ids[: s["prompt"]], all_logits=True).astype(np.float64)
            decode = [engine.decode(int(t)).astype(np.float64) for t in ids[s["prompt"] :]]
            arrays[f"{name}_host_stream_logits"] = np.concatenate([prefill, np.stack(decode)])
        timings[name] = (t1 - t0, t2 - t1, time.perf_counter() - t2)
    np.savez(out / "refs.npz", **arrays)
    meta = {
        "variants": list(records),
        "stream_variants": list(STREAM_VARIANTS),
        "export": records,
        "stream": s,
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "versions": {d: importlib.metadata.version(d) for d in ("numpy", "onnxruntime", "tokenizers")},
    }
    (out / "refs.json").write_text(json.dumps(meta, indent=1))
    for name, (e, r, h) in timings.items():
        print(f"host refs {name}: export {e:.1f}s, float64 references {r:.1f}s, host runtime {h:.1f}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("requirements")
    r = sub.add_parser("refs")
    r.add_argument("out", type=Path)
    args = ap.parse_args()
    if args.cmd == "requirements":
        print("\n".join(requirements()))
    else:
        refs(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
