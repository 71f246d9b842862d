"""The export pipeline: checkpoint -> graph of one flavor -> validated -> bundle, written atomically.

manifest = export(ExportOptions(checkpoint=Path("models/checkpoints/shakespeare-llama-5m"),
                                out=Path("bundle"), flavor=Flavor.ORT, precision=Precision.FP32))
"""

from __future__ import annotations

import dataclasses
import gc
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from edge_runtime import __version__, kernels
from edge_runtime.bundle import sha256_file
from edge_runtime.errors import ExportError, ValidationError
from edge_runtime.manifest import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    TEMPLATE_ORIGIN_KEY,
    CacheSpec,
    GraphSpec,
    Manifest,
    ModelSpec,
    ValidationCase,
    ValidationRecord,
)
from edge_runtime.ring import geometry_problem
from edge_runtime.rss import peak_rss_bytes

from .bundle_writer import atomic_directory
from .checkpoint import Checkpoint, load_checkpoint
from .decoder import OPSET, BuiltGraph, Flavor, KvDtype, Precision, build_decoder, kv_dtype_problem
from .external_data import ExternalDataWriter, save_with_external_data
from .gguf_convert import is_gguf
from .gguf_quant import SourceCodes
from .lazy_layers import LazyLayers
from .memory_plan import estimate_export_memory, return_freed_memory
from .progress import Progress, as_progress
from .prune import pruned_args
from .quant import INT4_BLOCKS, TRT_INT4_BLOCKS, QuantConfig
from .quant_graph import fp32_compute_twin
from .quant_pipeline import PreparedWeights, exact_twin, prepare_weights
from .reference import ReferenceModel
from .scratch import Scratch
from .tokenizer_export import BundleTokenizer, TemplateFile, bundle_tokenizer, check_source_template, read_json
from .validate import (
    CaseResult,
    ReferenceMemo,
    Tolerance,
    fixed_tolerance,
    float32_probe,
    fp32_tolerance,
    validation_grid,
    with_kv_dtype,
)

GRAPH_FILE, DATA_FILE = "model.onnx", "model.onnx.data"
DEFAULT_SINKS = 4
DEFAULT_WINDOW_CAP = 2044  # S + W = 2048 unless the model's trained context is shorter
DEFAULT_SLACK = 63  # a 64-token prefill chunk fits past capacity


@dataclass(frozen=True)
class ExportOptions:
    checkpoint: Path
    out: Path
    flavor: Flavor = Flavor.ORT
    precision: Precision = Precision.FP32
    sinks: int = DEFAULT_SINKS
    window: int | None = None  # None: fill the model's trained context (capped at DEFAULT_WINDOW_CAP)
    overwrite: bool = False
    quant: QuantConfig = field(default_factory=QuantConfig)  # method none: float weights of `precision`
    prune: float | None = None  # fraction of attention + MLP parameters to remove, in (0, 1)
    # Instead of `prune`: the largest pruning whose calibration perplexity rises at most this many percent
    prune_budget: float | None = None
    prune_layers: int = 0  # whole decoder layers to remove besides (prune_layers.py); the budget picks its own
    calibration: Path | None = None  # None: calibration.txt beside the checkpoint, else models.GENERAL_CALIBRATION
    # A device profile's window is a memory budget, not a model property: cut it to the trained context
    # (`edge-export --target`, first-use exports) instead of refusing the export.
    fit_window: bool = False
    # Likewise a profile's INT4 block: where it does not divide a Linear's input width (SmolLM2's 576 and the
    # Jetson profiles' 128), the largest supported block that does, instead of refusing a block nobody typed.
    fit_block: bool = False
    target: str | None = None  # the target profile the options came from (provenance); None: portable
    kv_dtype: KvDtype = KvDtype.FP32  # the KV cache's element type (fp16: --kernel edge, ort flavor)
    # A GGUF source's Q4_0/Q8_0 codes kept as they are (gguf_quant.read_codes); None: quantize every weight
    source_codes: SourceCodes | None = None
    # Refuse before any work when the estimated peak RSS (memory_plan.py) is above this many bytes
    max_memory: int | None = None
    # What the user named when `checkpoint` is a conversion of it (a .gguf file): the provenance's source, so
    # the first-use cache can tell when that file is gone or changed
    source: Path | None = None
    # A chat template of the user's (`edge-export --chat-template`), read and checked before any work: the
    # bundle's template in place of the checkpoint's (or a GGUF's), or where the source has none
    chat_template: TemplateFile | None = None


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


def export(opts: ExportOptions, progress: ProgressArg | None = None) -> Manifest:
    t_start = time.perf_counter()
    progress = as_progress(progress)
    return_freed_memory()
    stages = _Stages()
    progress(f"loading {opts.checkpoint}")
    # A quantized table is read a block of rows at a time from the checkpoint (an 8B model's two float32
    # tables are 4.2 GB); a float one goes into the graph whole.
    stored_tables = opts.quant.enabled and not opts.quant.fp_embeddings
    ckpt = load_checkpoint(opts.checkpoint, stored_tables=stored_tables)
    opts = _fit_block(ckpt, opts, progress)
    tokenizer = _tokenizer(ckpt, opts, progress)
    cache = _cache_spec(ckpt, opts)
    kv_problem = kv_dtype_problem(ckpt.args, opts.flavor, opts.quant, opts.kv_dtype)  # before minutes of quantizing
    if kv_problem:
        raise ExportError(kv_problem)
    pruning = opts.prune is not None or opts.prune_budget is not None or opts.prune_layers > 0
    scratch = _scratch(opts.out) if opts.quant.enabled else None
    imported = opts.source_codes is not None and bool(opts.source_codes.tensors)
    codes_held = imported or (opts.quant.enabled and scratch is None)
    estimate = estimate_export_memory(
        ckpt, opts.quant, opts.flavor, pruning, codes_held, spilled=scratch is not None, kv_dtype=opts.kv_dtype
    )
    progress(f"estimated peak memory {estimate.total / 1e6:,.0f} MB ({estimate.describe()} MB)")
    if opts.max_memory is not None and estimate.total > opts.max_memory:
        raise ExportError(
            f"this export needs about {estimate.total / 1e6:,.0f} MB ({estimate.describe()} MB), over "
            f"--max-memory {opts.max_memory / 1e6:,.0f} MB; a smaller --quant, or a machine with more memory"
        )
    stages.done("load")
    prepared = prepare_weights(
        ckpt,
        opts.quant,
        opts.prune,
        opts.calibration,
        prune_budget=opts.prune_budget,
        prune_layers=opts.prune_layers,
        trt=opts.flavor is Flavor.TRT,
        weights_label=opts.precision.value,
        progress=progress,
        source_codes=opts.source_codes,
        scratch=scratch,
    )

    stages.done("weights")  # quantization, calibration, pruning
    # From here the export needs only what the bundle holds: letting the source's float tables go saves
    # the embedding table's float32 copy (1 GB on a 1B model with a 128k vocabulary, twice where untied).
    ckpt.weights = prepared.weights
    ckpt.args = pruned_args(ckpt.args, prepared.weights)  # whole-layer pruning leaves fewer layers

    with atomic_directory(opts.out, overwrite=opts.overwrite) as tmp:
        progress(f"building {opts.flavor.value} graph ({opts.precision.value}, {ckpt.args.num_layers} layers)")
        # Each initializer's bytes go to the data file as the builder makes it: the graph holds references only.
        writer = ExternalDataWriter(tmp / DATA_FILE)
        # a stage of one unit for its heartbeat: an 8B model's graph is minutes of packing and writing
        with writer, progress.stage("building and writing the graph", 1, "graph"):
            built = build_decoder(
                ckpt.args,
                prepared.weights,
                opts.flavor,
                opts.precision,
                prepared.quantized,
                kv_dtype=opts.kv_dtype,
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
                **_provenance(ckpt, opts, time.perf_counter() - t_start, stages, estimate.total),
                TEMPLATE_ORIGIN_KEY: dataclasses.asdict(o) if (o := tokenizer.template_origin) else None,
            },
            files=files,
        )
        (tmp / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")
    rss = manifest.provenance["peak_rss_bytes"] / 2**20
    breakdown = ", ".join(f"{k} {v:.1f}s" for k, v in stages.seconds.items())
    progress(f"wrote {opts.out} in {time.perf_counter() - t_start:.1f}s ({breakdown}; peak RSS {rss:.0f} MiB)")
    return manifest


def _tokenizer(ckpt: Checkpoint, opts: ExportOptions, progress: Progress) -> BundleTokenizer:
    """The bundle's tokenizer, with --chat-template's file in place of the source's template where given."""
    converted_from = opts.source if opts.source is not None and is_gguf(opts.source) else None
    tokenizer = bundle_tokenizer(ckpt, converted_from=converted_from)
    given = opts.chat_template
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
        tol = fixed_tolerance(precision, int8_activations=True)
        worst = _check(cases, tol.value, f"{precision} with int8 activations")
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


def _twin_session(graph: Path, ckpt: Checkpoint, built: BuiltGraph, prepared: PreparedWeights) -> ort.InferenceSession:
    """The accuracy_level 0 twin. Where the edge ops run, a graph of INT8 per-channel products is its own twin:
    the same graph over the same data file with float activations (MatMulQ8's fp32_compute, MatMulNBits' 8-bit
    products turned into it; quant_graph.fp32_compute_twin), nothing written. MatMulNBits at accuracy_level 0
    dequantizes all of an 8-bit B into a fresh float buffer on every call (24x the graph's own validation time
    at the 1B shape, page faults included), which MatMulQ8 never does.
    Otherwise the graph is rebuilt with MatMulNBits at accuracy_level 0 (its LM head in parts of rows) into a
    scratch directory beside the bundle (streamed like the bundle, then memory-mapped by ONNX Runtime) rather
    than serialized in memory: a second copy of every weight."""
    assert prepared.quantized is not None
    # The bundle's own graph carries its cache's element type; the twin is held to the fp32 tolerance with an fp32
    # cache (validate.with_kv_dtype), so an fp16 / q8 cache's bundle gets the rebuilt twin.
    if kernels.available() and built.io["kv"]["dtype"] == np.dtype(np.float32).name:
        model = onnx.load(str(graph), load_external_data=False)
        if fp32_compute_twin(model, graph.parent):
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
        return _session(str(graph), built)  # the session keeps its own map of the (then unlinked) data file


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


def _cache_spec(ckpt: Checkpoint, opts: ExportOptions) -> CacheSpec:
    args = ckpt.args
    context = args.max_position_embeddings
    sinks, window = opts.sinks, opts.window
    if args.sliding_window is not None:  # trained with a local window (Mistral): no sinks, that window
        sinks, window = 0, min(window or args.sliding_window, args.sliding_window)
    if window is not None and opts.fit_window:
        window = max(1, min(window, context - sinks))
    window = window or min(context, DEFAULT_WINDOW_CAP + sinks) - sinks
    problem = geometry_problem(sinks, window, context)
    if problem:
        raise ExportError(problem)
    return CacheSpec(sinks=sinks, window=window, slack=DEFAULT_SLACK)


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


def _fit_block(ckpt: Checkpoint, opts: ExportOptions, progress: Progress) -> ExportOptions:
    """`opts` with a profile's INT4 block cut to one that divides every decoder Linear's input width."""
    q = opts.quant
    if not opts.fit_block or q.method.linear_bits != 4:
        return opts
    shapes = [ckpt.tensors.shape(n) for n in ckpt.tensors if ".layers." in n and n.endswith("_proj.weight")]
    widths = {s[1] for s in shapes if len(s) == 2}
    blocks = TRT_INT4_BLOCKS if opts.flavor is Flavor.TRT else INT4_BLOCKS
    fits = [b for b in blocks if b <= q.block and all(w % b == 0 for w in widths)]
    if not fits or fits[-1] == q.block:
        return opts  # nothing divides (the quantizer says so, naming the tensor) or the block already fits
    progress(
        f"target {opts.target}'s INT4 block {q.block} does not divide this model's widths "
        f"({', '.join(map(str, sorted(widths)))}); using block {fits[-1]}"
    )
    return replace(opts, quant=replace(q, block=fits[-1]))


def _provenance(
    ckpt: Checkpoint, opts: ExportOptions, seconds: float, stages: _Stages, estimated_peak: int
) -> dict[str, Any]:
    return {
        "exporter": f"edge-runtime {__version__}",
        "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "export_seconds": round(seconds, 2),
        "stage_seconds": dict(stages.seconds),
        "stage_peak_rss_bytes": dict(stages.peak_rss),
        # The process's peak resident set so far (getrusage): an export's own peak when edge-export runs it.
        "peak_rss_bytes": peak_rss_bytes(),
        "estimated_peak_rss_bytes": estimated_peak,  # memory_plan.py, before any work
        "source": str((opts.source or ckpt.path).resolve()),
        "target": opts.target,
        "options": {
            "flavor": opts.flavor.value,
            "quant": opts.quant.method.value,
            "block": opts.quant.block,
            "int8_block": opts.quant.int8_block,
            "kernel": opts.quant.kernel.value,
            "table_bits": opts.quant.table_bits,
            "prune": opts.prune,
            "prune_budget": opts.prune_budget,
            "prune_layers": opts.prune_layers,
            "kv_dtype": opts.kv_dtype.value,
        },
        "source_files": {p.name: sha256_file(p) for p in ckpt.tensors.files},
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
