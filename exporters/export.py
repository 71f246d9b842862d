"""The export pipeline: an ExportPlan (plan.py) -> graph of one flavor -> validated -> bundle, written atomically.

manifest = export(ExportPlan(checkpoint=Path("models/checkpoints/shakespeare-llama-5m"),
                             out=Path("bundle"), flavor=Flavor.ORT, precision=Precision.FP32))

`ExportOptions` is the plan's older name, kept for the callers that build one directly.
"""

from __future__ import annotations

import dataclasses
import gc
import platform
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from edge_runtime import __version__, kernels
from edge_runtime.bundle import sha256_file
from edge_runtime.errors import ValidationError
from edge_runtime.manifest import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    TEMPLATE_ORIGIN_KEY,
    GraphSpec,
    Manifest,
    ModelSpec,
    ValidationCase,
    ValidationRecord,
)
from edge_runtime.models import ModelWeights
from edge_runtime.rss import peak_rss_bytes

from .bundle_writer import atomic_directory
from .checkpoint import Checkpoint, load_checkpoint
from .decoder import OPSET, BuiltGraph, Flavor, Precision, build_decoder
from .external_data import ExternalDataWriter, save_with_external_data
from .gguf_blocks import GGUFMatrix
from .gguf_convert import is_gguf
from .lazy_layers import LazyLayers
from .memory_plan import MemoryEstimate, estimate_plan_memory, return_freed_memory
from .plan import ExportPlan
from .progress import Progress, as_progress
from .prune import pruned_args
from .quant import MatMulKernel, QuantConfig, QuantizedTable
from .quant_graph import edge_matmul, float32_cache, fp32_compute_int8, fp32_compute_twin, nbits_block
from .quant_model import LINEARS
from .quant_pipeline import PreparedWeights, exact_twin, prepare_weights
from .reference import Int8Activations, LlamaRounding, ReferenceModel, Rounding
from .scratch import Scratch
from .tokenizer_export import BundleTokenizer, bundle_tokenizer, check_source_template, read_json
from .validate import (
    CaseResult,
    ReferenceMemo,
    Tolerance,
    fixed_tolerance,
    float32_probe,
    fp32_tolerance,
    int8_probe,
    int8_tolerance,
    validation_grid,
    with_kv_dtype,
)

GRAPH_FILE, DATA_FILE = "model.onnx", "model.onnx.data"
ExportOptions = ExportPlan  # the older name: tests and scripts build one directly


ProgressArg = Progress | Callable[[str], None]  # a plain callable gets plain lines (progress.as_progress)


class _Stages:
    """Seconds per export stage, for the manifest and the closing progress line (where the time goes)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.peak_rss: dict[str, int] = {}  # the process's peak RSS when each stage ended: which stage raised it
        self._t = time.perf_counter()

    def done(self, name: str) -> None:
        # Each stage leaves garbage in reference cycles (graph builders, lazily built layers): hundreds of MB
        # on a 1B model until the collector happens to run, and the next stage's peak would sit on top of it.
        LazyLayers.release_all()
        gc.collect()
        now = time.perf_counter()
        self.seconds[name] = round(now - self._t, 2)
        self.peak_rss[name] = peak_rss_bytes()
        self._t = now


def export(plan: ExportPlan, progress: ProgressArg | None = None) -> Manifest:
    t_start = time.perf_counter()
    progress = as_progress(progress)
    return_freed_memory()
    stages = _Stages()
    progress(f"loading {plan.checkpoint}")
    # A quantized table is read a block of rows at a time from the checkpoint (an 8B model's two float32
    # tables are 4.2 GB); a float one goes into the graph whole.
    stored_tables = plan.quant.enabled and not plan.quant.fp_embeddings
    ckpt = load_checkpoint(plan.checkpoint, stored_tables=stored_tables)
    plan = plan.fitted(ckpt, progress)
    tokenizer = _tokenizer(ckpt, plan, progress)
    cache = plan.cache_spec(ckpt.args)
    plan.check_model(ckpt.args)  # before minutes of quantizing
    scratch = _scratch(plan.out) if plan.quant.enabled else None
    imported = plan.source_codes is not None and bool(plan.source_codes.tensors)
    codes_held = imported or (plan.quant.enabled and scratch is None)
    estimate = estimate_plan_memory(ckpt, plan, codes_held=codes_held, spilled=scratch is not None)
    progress(f"estimated peak memory {estimate.total / 1e6:,.0f} MB ({estimate.describe()} MB)")
    plan.check_memory(estimate)
    stages.done("load")
    prepared = prepare_weights(
        ckpt,
        plan.quant,
        plan.prune,
        plan.calibration,
        prune_budget=plan.prune_budget,
        prune_layers=plan.prune_layers,
        trt=plan.flavor is Flavor.TRT,
        weights_label=plan.precision.value,
        progress=progress,
        source_codes=plan.source_codes,
        scratch=scratch,
    )

    stages.done("weights")  # quantization, calibration, pruning
    # From here the export needs only what the bundle holds: letting the source's float tables go saves
    # the embedding table's float32 copy (1 GB on a 1B model with a 128k vocabulary, twice where untied).
    ckpt.weights = prepared.weights
    ckpt.args = pruned_args(ckpt.args, prepared.weights)  # whole-layer pruning leaves fewer layers

    with atomic_directory(plan.out, overwrite=plan.overwrite) as tmp:
        progress(f"building {plan.flavor.value} graph ({plan.precision.value}, {ckpt.args.num_layers} layers)")
        # Each initializer's bytes go to the data file as the builder makes it: the graph holds references only.
        writer = ExternalDataWriter(tmp / DATA_FILE)
        # a stage of one unit for its heartbeat: an 8B model's graph is minutes of packing and writing
        with writer, progress.stage("building and writing the graph", 1, "graph"):
            built = build_decoder(
                ckpt.args,
                prepared.weights,
                plan.flavor,
                plan.precision,
                prepared.quantized,
                kv_dtype=plan.kv_dtype,
                sink=writer,
            )
            stages.done("graph")
            progress("writing graph and tokenizer")
            save_with_external_data(built.model, tmp / GRAPH_FILE, DATA_FILE, writer=writer)
        tokenizer.write(tmp)
        stages.done("write")
        validation = _validate(tmp / GRAPH_FILE, ckpt, built, prepared, progress)
        stages.done("validate")
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        stages.done("checksums")
        manifest = Manifest(
            format_version=FORMAT_VERSION,
            model=_model_spec(ckpt, prepared),
            graph=_graph_spec(built, tmp, tied=prepared.weights.lm_head is prepared.weights.embed),
            cache=cache,
            tokenizer=tokenizer.spec,
            generation=_generation_defaults(ckpt.path),
            quantization=prepared.record,
            validation=validation,
            provenance={
                **_provenance(ckpt, plan, time.perf_counter() - t_start, stages, estimate),
                TEMPLATE_ORIGIN_KEY: dataclasses.asdict(o) if (o := tokenizer.template_origin) else None,
            },
            files=files,
        )
        (tmp / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")
    rss = manifest.provenance["peak_rss_bytes"] / 2**20
    breakdown = ", ".join(f"{k} {v:.1f}s" for k, v in stages.seconds.items())
    progress(f"wrote {plan.out} in {time.perf_counter() - t_start:.1f}s ({breakdown}; peak RSS {rss:.0f} MiB)")
    return manifest


def _tokenizer(ckpt: Checkpoint, plan: ExportPlan, progress: Progress) -> BundleTokenizer:
    """The bundle's tokenizer, with --chat-template's file in place of the source's template where given."""
    converted_from = plan.source if plan.source is not None and is_gguf(plan.source) else None
    tokenizer = bundle_tokenizer(ckpt, converted_from=converted_from)
    given = plan.chat_template
    if given is None:
        check_source_template(tokenizer)  # the runtime's bounds, before the export's work
        return tokenizer
    replaced = tokenizer.template_origin
    progress(
        f"chat template from --chat-template '{given.path}'"
        + (f", replacing the one from {replaced.describe()}" if replaced else "")
        + ("" if given.takes_system else " (it refuses a system message)")
    )
    return tokenizer.with_template(given)


def _scratch(out: Path) -> Scratch | None:
    """A scratch file in the output's nearest existing directory (not /tmp, which may be RAM on a device);
    None where it cannot be made there: the codes are then held in memory, and atomic_directory reports
    the unwritable directory in its own words."""
    where = out.parent
    while not where.is_dir() and where != where.parent:
        where = where.parent
    try:
        return Scratch(where)
    except OSError:
        return None


def _session(model: str | bytes, built: BuiltGraph, data_dir: Path | None = None) -> ort.InferenceSession:
    """`data_dir`: where a `model` given as bytes finds its external data file."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if data_dir is not None:
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(data_dir))
    if built.flavor is Flavor.TRT:
        # ORT fuses DequantizeLinear -> MatMul into MatMulNBits with int8 activations by default;
        # TensorRT dequantizes and multiplies in fp16/fp32, which accuracy level 0 reproduces.
        so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    kernels.register(so)  # graphs exported with --kernel edge hold MatMulQ4/MatMulQ8 nodes
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _validate(
    graph: Path, ckpt: Checkpoint, built: BuiltGraph, prepared: PreparedWeights, progress: Progress
) -> ValidationRecord:
    t0 = time.perf_counter()
    # The reference runs the very weights the graph holds (pruned, dequantized): any difference
    # is the graph's, not quantization's.
    reference = ReferenceModel(ckpt.args, prepared.weights)
    kv_heads = [lw.num_kv_heads(ckpt.args.head_dim) for lw in prepared.weights.layers]
    q = prepared.quantized
    int8_act = q is not None and built.flavor is Flavor.ORT and q.config.accuracy_level == 4
    precision = built.precision.value
    fp32 = built.precision is Precision.FP32
    probe = float32_probe(ckpt.args, prepared.weights, reference) if fp32 else None
    memo = ReferenceMemo(reference, probe)  # each stream scored once: the bundle's graph follows the twin's tokens

    def grid(
        session: Callable[[], ort.InferenceSession],
        probe: ReferenceModel | None = None,
        follow: list[CaseResult] | None = None,
    ) -> list[CaseResult]:
        return validation_grid(
            session,
            reference,
            flavor=built.flavor,
            dtype=built.activation_dtype,
            kv_heads=kv_heads,
            sliding_window=ckpt.args.sliding_window,
            progress=progress,
            probe=probe,
            memo=memo,
            follow=follow,
        )

    if int8_act:
        progress("validating the same integer weights at accuracy_level 0 (fp32 compute) against the reference")
        twin_cases = grid(lambda: _twin_session(graph, ckpt, built, prepared), probe)
        exact = fp32_tolerance(twin_cases) if fp32 else fixed_tolerance(precision, int8_activations=False)
        _check(twin_cases, exact.value, _label(precision, exact) + ", accuracy_level 0 twin,")
        prepared.record["exact_parity"] = {  # into the manifest's `quantization` record
            "accuracy_level": 0,
            "tolerance": exact.value,
            "tolerance_basis": exact.basis,
            "max_rel_err": max(c.max_rel_err for c in twin_cases),
        }
    reference_dtype = reference.dtype.name
    progress(f"validating against the {reference_dtype} reference (ONNX Runtime {ort.__version__} CPU)")
    if int8_act:
        # fed the twin's tokens: the reference's logits of the twin's grid serve this one (validation_grid)
        cases = grid(lambda: _session(str(graph), built), follow=twin_cases)
        # the dense streams the twin was scored on, each product's inputs rounded as its op rounds them
        probe8 = int8_probe(ckpt.args, prepared.weights, _activation_rounding(prepared.weights, q.config))
        streams = [c.stream for c in twin_cases if c.stream is not None]
        tol = int8_tolerance(memo.probe_error(probe8, streams, progress))
        del probe8
        worst = _check(
            cases,
            tol.value,
            f"{precision} with int8 activations (a numpy float32 forward with their "
            f"rounding: {tol.basis['int8_probe_rel_err']:.2e} off float64)",
        )
    else:
        cases = grid(lambda: _session(str(graph), built), probe)
        tol = fp32_tolerance(cases) if fp32 else fixed_tolerance(precision, int8_activations=False)
        worst = _check(cases, tol.value, _label(precision, tol))
    if built.io["kv"]["dtype"] != np.dtype(built.activation_dtype).name:  # --kv-dtype fp16 / q8
        tol = with_kv_dtype(tol, built.io["kv"]["dtype"])
    what = "" if q is None and not prepared.pruned else " run with the exported (pruned/dequantized) weights"
    return ValidationRecord(
        reference=f"{reference_dtype} numpy StreamingLLM transcription (exporters/reference.py){what}",
        tolerance=tol.value,
        max_rel_err=worst,
        cases=[ValidationCase(c.name, c.tokens, c.max_rel_err, c.float32_rel_err) for c in cases],
        seconds=round(time.perf_counter() - t0, 2),
        tolerance_basis=tol.basis,
    )


def _activation_rounding(weights: ModelWeights, config: QuantConfig) -> Int8Activations:
    """How each integer product of the graph built from `weights` rounds its inputs (validate.int8_probe): blocks
    of 32 where an edge op computes it (quant_graph.edge_matmul; under a legacy GGUF type with llama.cpp's fp16
    scales), MatMulNBits' own block otherwise (nbits_block: a per-channel INT8 product's is the largest
    of 128..16 dividing K), None for a product left in float."""
    edge = config.kernel is MatMulKernel.EDGE

    def block(w: np.ndarray, name: str) -> Rounding:
        if not isinstance(w, QuantizedTable):
            return None
        qm = w.qm
        if isinstance(qm, GGUFMatrix):  # a non-edge graph multiplies a GGUF Linear in float
            return (32 if qm.block == 256 else LlamaRounding()) if edge else None
        if edge and qm.zeros is None and edge_matmul(qm.bits, qm.per_channel, qm.block, qm.shape[1]) is not None:
            return 32
        return nbits_block(qm, name)

    layers = tuple({f: block(getattr(lw, f), f"layer {i} {f}") for f in LINEARS} for i, lw in enumerate(weights.layers))
    return Int8Activations(layers, block(weights.lm_head, "lm_head"))


def _twin_session(graph: Path, ckpt: Checkpoint, built: BuiltGraph, prepared: PreparedWeights) -> ort.InferenceSession:
    """The accuracy_level 0 twin. Where the edge ops run, a graph of INT8 per-channel products is its own twin:
    the same graph over the same data file with float activations (MatMulQ8's fp32_compute, MatMulNBits' 8-bit
    products turned into it; quant_graph.fp32_compute_twin), nothing written. MatMulNBits at accuracy_level 0
    dequantizes all of an 8-bit B into a fresh float buffer on every call (24x the graph's own validation time
    at the 1B shape, page faults included), which MatMulQ8 never does.
    Otherwise the graph is rebuilt with MatMulNBits at accuracy_level 0 (its LM head in parts of rows) into a
    scratch directory beside the bundle (streamed like the bundle, then memory-mapped by ONNX Runtime) rather
    than serialized in memory: a second copy of every weight. Where the edge ops run, its INT8 per-channel
    products become MatMulQ8 with fp32_compute too (quant_graph.fp32_compute_int8)."""
    assert prepared.quantized is not None
    # The bundle's own graph carries its cache's element type; the twin is held to the fp32 tolerance with an fp32
    # cache (validate.with_kv_dtype): an fp16 / q8 cache's graph becomes one of an fp32 cache (float32_cache).
    if kernels.available():
        model = onnx.load(str(graph), load_external_data=False)
        if fp32_compute_twin(model, graph.parent):
            float32_cache(model)
            return _session(model.SerializeToString(), built, data_dir=graph.parent)
        del model
    with tempfile.TemporaryDirectory(prefix=".edge-export-twin-", dir=graph.parent.parent) as scratch:
        graph = Path(scratch) / GRAPH_FILE
        with ExternalDataWriter(graph.parent / DATA_FILE) as writer:
            twin = build_decoder(
                ckpt.args, prepared.weights, built.flavor, built.precision, exact_twin(prepared.quantized), sink=writer
            )
            save_with_external_data(twin.model, graph, DATA_FILE, writer=writer)
        del twin  # a GB of the builder's garbage (a float layer, packing temporaries) sits in cycles until
        LazyLayers.release_all()  # collected, and the session's 1.1 GB would come on top of it
        gc.collect()
        # the session keeps its own map of the (then unlinked) data file
        if kernels.available():  # its INT8 per-channel products (the LM head, --mixed's groups) read as stored
            model = onnx.load(str(graph), load_external_data=False)
            if fp32_compute_int8(model, graph.parent):
                return _session(model.SerializeToString(), built, data_dir=graph.parent)
            del model
        return _session(str(graph), built)


def _label(precision: str, tol: Tolerance) -> str:
    e32 = tol.basis.get("float32_rel_err")
    return precision if e32 is None else f"{precision} (numpy float32 of these weights: {e32:.2e} off float64)"


def _check(cases: list, tol: float, label: str) -> float:
    worst = max(c.max_rel_err for c in cases)
    if not worst <= tol:  # also catches NaN
        raise ValidationError(
            f"exported graph differs from the float64 reference by {worst:.3e} (max relative error), above the "
            f"{label} tolerance {tol:g}; no bundle written. Worst case: "
            f"{max(cases, key=lambda c: c.max_rel_err).name}"
        )
    return worst


def _generation_defaults(path: Path) -> dict[str, Any]:
    gen = read_json(path / "generation_config.json")
    keys = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens")
    return {k: gen[k] for k in keys if k in gen}


def _model_spec(ckpt: Checkpoint, prepared: PreparedWeights) -> ModelSpec:
    a, w = ckpt.args, prepared.weights
    if prepared.pruned:
        tied = w.lm_head is w.embed
        arrays = [w.embed, w.final_norm, *([] if tied else [w.lm_head])]
        arrays += [t for lw in w.layers for t in vars(lw).values() if t is not None]
        parameters = int(sum(t.size for t in arrays))
    else:
        parameters = int(sum(int(np.prod(ckpt.tensors.shape(n))) for n in ckpt.tensors))
    return ModelSpec(
        source_model_type=a.model_type,
        arch=a.arch,
        num_layers=a.num_layers,
        hidden_size=a.hidden_size,
        vocab_size=a.vocab_size,
        head_dim=a.head_dim,
        num_heads=[lw.num_heads(a.head_dim) for lw in w.layers],
        num_kv_heads=[lw.num_kv_heads(a.head_dim) for lw in w.layers],
        intermediate_size=[lw.gate.shape[0] for lw in w.layers],
        rotary_dim=a.rotary_dim,
        rope_inv_freq=[float(x) for x in a.rope.inv_freq(a.head_dim)],
        max_position_embeddings=a.max_position_embeddings,
        parameters=parameters,
        tied_embeddings=w.lm_head is w.embed,
        local_window=a.local_window if a.local_layers else None,
        local_rope_inv_freq=[float(x) for x in a.local_rope.inv_freq(a.head_dim)]
        if a.local_layers and a.local_rope is not None
        else None,
    )


def _graph_spec(built: BuiltGraph, bundle_dir: Path, *, tied: bool) -> GraphSpec:
    inits = built.model.graph.initializer
    total = sum(_tensor_bytes(t) for t in inits)
    embed = sum(_tensor_bytes(t) for t in inits if t.name.startswith("/model/embed_tokens/"))
    # Per token every weight is read once, except an untied embedding table (one row is gathered).
    per_token = total if tied else total - embed
    return GraphSpec(
        file=GRAPH_FILE,
        data_file=DATA_FILE,
        flavor=built.flavor.value,
        opset=OPSET[built.flavor],
        weight_dtype=built.weight_dtype,
        activation_dtype=np.dtype(built.activation_dtype).name,
        inputs=built.io["inputs"],
        outputs=built.io["outputs"],
        kv=built.io["kv"],
        weight_bytes=per_token,
    )


def _tensor_bytes(t: onnx.TensorProto) -> int:
    n = int(np.prod(t.dims))
    if t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return (n + 1) // 2
    return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def _provenance(
    ckpt: Checkpoint, plan: ExportPlan, seconds: float, stages: _Stages, estimated_peak: MemoryEstimate
) -> dict[str, Any]:
    return {
        "exporter": f"edge-runtime {__version__}",
        "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "export_seconds": round(seconds, 2),
        "stage_seconds": dict(stages.seconds),
        "stage_peak_rss_bytes": dict(stages.peak_rss),
        # The process's peak resident set so far (getrusage): an export's own peak when edge-export runs it.
        "peak_rss_bytes": peak_rss_bytes(),
        "estimated_peak_rss_bytes": estimated_peak.total,  # memory_plan.py, before any work
        "estimated_phase_bytes": estimated_peak.phase_totals(),  # each phase's: prepare, graph, validate
        "source": str((plan.source or ckpt.path).resolve()),
        "target": plan.target,
        "options": {
            "flavor": plan.flavor.value,
            "quant": plan.quant.method.value,
            "block": plan.quant.block,
            "int8_block": plan.quant.int8_block,
            "kernel": plan.quant.kernel.value,
            "table_bits": plan.quant.table_bits,
            "prune": plan.prune,
            "prune_budget": plan.prune_budget,
            "prune_layers": plan.prune_layers,
            "kv_dtype": plan.kv_dtype.value,
        },
        "source_files": {p.name: sha256_file(p) for p in ckpt.tensors.files},
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
