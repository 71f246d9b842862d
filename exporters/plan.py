"""The export plan: flags + target profile + source (a Hugging Face directory or a .gguf file) -> one validated,
frozen `ExportPlan`. Every export option's default and every refusal of options lives here; `edge-export`, the
first-use exports of `edge-run`/`edge-serve`/`edge-bench --model` (first_use.py, from_source.py), the export
pipeline (export.py) and its memory estimate (memory_plan.py) all take the plan.

    plan = plan_export(Path("model.gguf"), Path("bundle"), ExportFlags(quant=QuantMethod.INT4), load_target("rpi5"))
    manifest = export_source(plan)

What the plan decides, in this order (each step refuses in one typed line, an ExportError unless named):

    plan_export (flags, profile, source), before any work:
      1. flags that exclude each other: --prune with --prune-budget, --prune-layers with --prune-budget
         (prune_conflict; edge-export turns it into a usage error)
      2. the base settings: PORTABLE without a profile, else the profile's (targets/export_settings.py: its
         kernel only where edge-runtime's kernel library runs here, with a note where it does not); a --flavor
         other than the profile's drops its block, kernel, INT4 table and mixed-precision plan, a --quant
         other than the profile's drops its plan; explicit flags win; --quant none takes --kernel or mlas,
         --table-bits or 8
      3. --window below 1; a --block that sizes no quantized block (not int4*, int8 or an INT4 table)
      4. the QuantConfig: the INT4 block (--block, the profile's, else default_block: 32 ort, 128 trt),
         INT8 blocks only from --block; QuantConfig refuses what no flavor takes (quant.py: a block outside
         32/64/128, --mixed without INT4, ...)
      5. a .gguf source whose profile plan (not --mixed) would re-round the file's codes: the plan is held
         back (deferred_mixed) unless --gguf-codes requantize; export_source applies it where the file keeps
         no Linear codes
      6. the ExportPlan itself (ExportPlan.__post_init__, also for plans made directly):
           prune_conflict again; --prune-budget a positive percentage; window >= 1;
           kv_dtype_problem without the model (fp16/q8 cache: ort flavor, --kernel edge, a quantized model);
           check_options (the trt flavor's INT4 blocks 64/128, no --kernel edge, INT8 blocks, asymmetric or
           INT4 table; --kernel edge only quantized and only where the kernel library runs; EDGE_KERNELS_ISA)
      7. --gguf-codes: only for a .gguf source; an explicit keep that cannot be honoured (gguf_declined)
      8. --chat-template read and rendered (tokenizer_export.read_template_file)
      9. the output: not the checkpoint nor a folder holding it; --overwrite rules (bundle_writer.check_target)
    with the model read (export.py, in this order):
     10. fitted: a profile's INT4 block (not a typed --block) cut to the largest that divides every decoder
         Linear's input width; the default fp16 cache (not a typed --kv-dtype) fp32 where the model's heads keep
         RingAttention out
     11. cache_spec: a sliding-window model keeps no sinks and its trained window; a profile's window (not a
         typed --window) is cut to the trained context; the default window fills the context up to
         DEFAULT_WINDOW_CAP; ring.geometry_problem refuses the rest; slack DEFAULT_SLACK
     12. check_model: kv_dtype_problem with the head size (RingAttention's limits)
     13. check_memory: the estimate (memory_plan.estimate_plan_memory) against --max-memory

Left where the data is (they need the weights or the file, not the options): calibration text (calibrate.py),
a block that does not divide a Linear (quant_model.check_blocks), whole-layer pruning against the model
(prune_layers.py), the GGUF's codes against the bundle's format (gguf_quant.read_codes, quant_model).
`--build-engine` is checked by edge-export itself: the TensorRT engine is the runtime's, not the bundle's.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import numpy as np

from edge_runtime.errors import ExportError
from edge_runtime.manifest import CacheSpec
from edge_runtime.ring import geometry_problem
from edge_runtime.targets.export_settings import DEFAULT_INT4_BLOCK, PORTABLE, settings_for

from .bundle_writer import check_target
from .gguf_convert import is_gguf
from .gguf_quant import GGUFCodes, SourceCodes, plan_import
from .quant import INT4_BLOCKS, TRT_INT4_BLOCKS, MatMulKernel, MixedPlan, QuantConfig, QuantMethod
from .tokenizer_export import TemplateFile, read_template_file

if TYPE_CHECKING:
    from edge_runtime.models import ModelArgs
    from edge_runtime.targets import TargetProfile

    from .checkpoint import Checkpoint
    from .memory_plan import MemoryEstimate
    from .progress import Progress

_T = TypeVar("_T")

DEFAULT_SINKS = PORTABLE.sinks
DEFAULT_WINDOW_CAP = 2044  # S + W = 2048 unless the model's trained context is shorter
DEFAULT_SLACK = 63  # a 64-token prefill chunk fits past capacity


class Flavor(enum.Enum):
    ORT = "ort"
    TRT = "trt"


class Precision(enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float16 if self is Precision.FP16 else np.float32)


class KvDtype(enum.Enum):
    """The KV cache's element type (`edge-export --kv-dtype`). fp16 halves the bytes attention reads per token
    at a full ring, q8 (int8 codes and an fp32 scale a row, llama.cpp's q8_0 with one block a row) nearly
    quarters them; only edge-runtime's LinearAttention/RingAttention take them under fp32 activations.

    One spelling, the value (the CLI's and the manifest's provenance.options.kv_dtype); the manifest's
    graph.kv.dtype names the buffers' element type as bundles always have (`manifest_dtype`: float16), which the
    CLI takes as an alias."""

    FP32 = "fp32"
    FP16 = "fp16"
    Q8 = "q8"

    @classmethod
    def parse(cls, text: str) -> KvDtype:
        for kv in cls:
            if text in (kv.value, kv.manifest_dtype):
                return kv
        known = ", ".join(kv.value for kv in cls)
        raise ExportError(f"unknown KV cache type {text!r}; choose one of: {known}")

    @property
    def dtype(self) -> np.dtype:
        """The cache buffers' storage dtype (q8 rows are uint8 bytes: blocks_ort.Q8_ROW_EXTRA)."""
        return np.dtype({KvDtype.FP16: np.float16, KvDtype.Q8: np.uint8}.get(self, np.float32))

    @property
    def manifest_dtype(self) -> str:
        """The manifest's graph.kv.dtype of an ort graph's cache (a manifest.KV_DTYPES name)."""
        return "q8" if self is KvDtype.Q8 else self.dtype.name


def default_block(flavor: Flavor) -> int:
    """The INT4 block where neither --block nor a profile gives one: 32 for ort (MatMulQ4, llama.cpp's Q4_0),
    128 for trt (TensorRT's INT4 blocks are 64 and 128)."""
    return DEFAULT_INT4_BLOCK[flavor.value]


@dataclass(frozen=True)
class ExportFlags:
    """What the user asked for; None (or the default) where a flag was not given, so a profile's value applies."""

    flavor: Flavor | None = None
    precision: Precision = Precision.FP32
    quant: QuantMethod | None = None
    block: int | None = None
    kernel: MatMulKernel | None = None
    table_bits: Literal[4, 8] | None = None
    mixed: MixedPlan | None = None
    fp_embeddings: bool = False
    gguf_codes: GGUFCodes | None = None
    kv_dtype: KvDtype | None = None  # None: default_kv_dtype (fp16 where edge-runtime's attention ops run, else fp32)
    sinks: int | None = None
    window: int | None = None
    prune: float | None = None
    prune_budget: float | None = None
    prune_layers: int = 0
    calibration: Path | None = None
    max_memory: int | None = None
    chat_template: Path | None = None
    overwrite: bool = False


@dataclass(frozen=True)
class ExportPlan:
    """One export, decided: what export.export() builds. Made by plan_export from flags, or directly (tests,
    scripts: `ExportOptions` is its older name); either way __post_init__ refuses options that cannot go
    together."""

    checkpoint: Path  # what the export reads: the user's source, then the .gguf's float32 conversion
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
    # Likewise the default fp16 cache (default_kv_dtype): fp32 where the model's heads keep RingAttention out, instead
    # of refusing a cache type nobody typed.
    fit_kv_dtype: bool = False
    target: str | None = None  # the target profile the options came from (provenance); None: portable
    kv_dtype: KvDtype = KvDtype.FP32  # the KV cache's element type (fp16/q8: --kernel edge, ort flavor)
    # A GGUF source's Q4_0/Q8_0 codes kept as they are (gguf_quant.read_codes): filled by export_source once the
    # file is read; None: quantize every weight
    source_codes: SourceCodes | None = None
    # Refuse before any work when the estimated peak RSS (memory_plan.py) is above this many bytes
    max_memory: int | None = None
    # What the user named when `checkpoint` is a conversion of it (a .gguf file): the provenance's source, so
    # the first-use cache can tell when that file is gone or changed
    source: Path | None = None
    # A chat template of the user's (`edge-export --chat-template`), read and checked before any work: the
    # bundle's template in place of the checkpoint's (or a GGUF's), or where the source has none
    chat_template: TemplateFile | None = None
    gguf_codes: GGUFCodes | None = None  # a .gguf's codes: None keeps them where the bundle's format holds them
    # A profile's mixed-precision plan held back from a .gguf's codes (plan step 5); export_source applies it
    # where the file has no Linear codes to keep
    deferred_mixed: MixedPlan | None = None
    # A .gguf exported with no --quant of the user's where the edge kernels run: its Linears of a type MatMulGGUF
    # executes are kept in their GGUF blocks as stored, and the rest quantized by round to nearest
    # (export_source decides once the file is open: a file with none keeps the profile's method)
    gguf_blocks: bool = False
    notes: tuple[str, ...] = ()  # what the user should hear about the plan (edge-export prints them)

    def __post_init__(self) -> None:
        problem = (
            prune_conflict(self.prune, self.prune_budget, self.prune_layers)
            or _budget_problem(self.prune_budget)
            or _window_problem(self.window)
            or kv_dtype_problem(None, self.flavor, self.quant, self.kv_dtype)
        )
        if problem:
            raise ExportError(problem)
        check_options(self.quant, trt=self.flavor is Flavor.TRT)

    @property
    def pruning(self) -> bool:
        return self.prune is not None or self.prune_budget is not None or self.prune_layers > 0

    def gguf_declined(self) -> str | None:
        """Why this export keeps none of a .gguf's codes (None: it keeps those the bundle's format holds). Raises
        for --gguf-codes with another source, or an explicit keep that cannot be honoured."""
        return plan_import(
            self.gguf_codes,
            self.quant,
            gguf_source=is_gguf(self.source or self.checkpoint),
            trt=self.flavor is Flavor.TRT,
            prune=self.pruning,
            blocks=self.gguf_blocks,
        )

    def fitted(self, ckpt: Checkpoint, progress: Progress) -> ExportPlan:
        """This plan with a profile's INT4 block cut to one that divides every decoder Linear's input width, and a
        default fp16 cache fp32 where the model's heads cannot have it."""
        plan = self._fitted_block(ckpt, progress)
        if plan.fit_kv_dtype and kv_dtype_problem(ckpt.args, plan.flavor, plan.quant, plan.kv_dtype):
            progress(f"RingAttention does not take head size {ckpt.args.head_dim}: caching K/V in fp32")
            plan = dataclasses.replace(plan, kv_dtype=KvDtype.FP32, fit_kv_dtype=False)
        return plan

    def _fitted_block(self, ckpt: Checkpoint, progress: Progress) -> ExportPlan:
        q = self.quant
        if not self.fit_block or q.method.linear_bits != 4:
            return self
        shapes = [ckpt.tensors.shape(n) for n in ckpt.tensors if ".layers." in n and n.endswith("_proj.weight")]
        widths = {s[1] for s in shapes if len(s) == 2}
        blocks = TRT_INT4_BLOCKS if self.flavor is Flavor.TRT else INT4_BLOCKS
        fits = [b for b in blocks if b <= q.block and all(w % b == 0 for w in widths)]
        if not fits or fits[-1] == q.block:
            return self  # nothing divides (the quantizer says so, naming the tensor) or the block already fits
        progress(
            f"target {self.target}'s INT4 block {q.block} does not divide this model's widths "
            f"({', '.join(map(str, sorted(widths)))}); using block {fits[-1]}"
        )
        return dataclasses.replace(self, quant=dataclasses.replace(q, block=fits[-1]))

    def cache_spec(self, args: ModelArgs) -> CacheSpec:
        """The bundle's cache geometry for this model."""
        context = args.max_position_embeddings
        sinks, window = self.sinks, self.window
        if args.sliding_window is not None:  # trained with a local window (Mistral): no sinks, that window
            sinks, window = 0, min(window or args.sliding_window, args.sliding_window)
        if window is not None and self.fit_window:
            window = max(1, min(window, context - sinks))
        window = window or min(context, DEFAULT_WINDOW_CAP + sinks) - sinks
        problem = geometry_problem(sinks, window, context)
        if problem:
            raise ExportError(problem)
        return CacheSpec(sinks=sinks, window=window, slack=DEFAULT_SLACK)

    def check_model(self, args: ModelArgs) -> None:
        """What only the model's shapes can refuse, before minutes of quantizing."""
        problem = kv_dtype_problem(args, self.flavor, self.quant, self.kv_dtype)
        if problem:
            raise ExportError(problem)

    def check_memory(self, estimate: MemoryEstimate, *, conversion: bool = False) -> None:
        """`conversion`: the estimate is a GGUF's conversion to float32, which no export option makes smaller."""
        if self.max_memory is not None and estimate.total > self.max_memory:
            what, remedy = "this export", "a smaller --quant, or a machine with more memory"
            if conversion:
                what, remedy = "converting this GGUF to float32", "a machine with more memory"
            raise ExportError(
                f"{what} needs about {estimate.total / 1e6:,.0f} MB ({estimate.describe()} MB), over "
                f"--max-memory {self.max_memory / 1e6:,.0f} MB; {remedy}"
            )


def prune_conflict(prune: float | None, prune_budget: float | None, prune_layers: int) -> str | None:
    """Pruning flags that exclude each other (edge-export: a usage error)."""
    if prune is not None and prune_budget is not None:
        return "--prune and --prune-budget are mutually exclusive: give a ratio or a perplexity budget"
    if prune_layers and prune_budget is not None:
        return "--prune-layers and --prune-budget are mutually exclusive: the budget picks layers itself"
    return None


def _budget_problem(prune_budget: float | None) -> str | None:
    if prune_budget is not None and not (isinstance(prune_budget, (int, float)) and 0 < prune_budget < 1e6):
        return f"prune budget {prune_budget!r} must be a positive percentage (e.g. --prune-budget 10)"
    return None


def _window_problem(window: int | None) -> str | None:
    """--window 0 once meant "the default": refused rather than silently ignored."""
    if window is not None and window < 1:
        return f"--window {window} is out of range; use 1 or more, or leave it out for the model's context"
    return None


def default_kv_dtype(flavor: Flavor, quant: QuantConfig) -> KvDtype:
    """The cache where --kv-dtype is not given: fp16 where edge-runtime's attention ops run (a quantized ort bundle
    on the edge kernels; ExportPlan.fitted falls back to fp32 for heads RingAttention does not take), as llama.cpp
    caches; else fp32, which ONNX Runtime's own attention ops need. Decode is memory-bound and every step reads the
    filled cache beside the weights (each stream's own in a batched step): half the bytes, for a rounding (2^-11 per
    element) within the int8 activations' own (validate.with_kv_dtype; docs/decisions/kv-fp16-default.md)."""
    return KvDtype.FP16 if kv_dtype_problem(None, flavor, quant, KvDtype.FP16) is None else KvDtype.FP32


def kv_dtype_problem(args: ModelArgs | None, flavor: Flavor, quant: QuantConfig | None, kv: KvDtype) -> str | None:
    """Why the graph cannot hold a `kv` cache (None: it can; `args` None: the options alone, before a model is
    read). FP32 is every graph's default (`trt` keeps its cache in its activation dtype). GroupQueryAttention,
    ONNX Attention and TensorScatter need the cache in the activation dtype, so an fp16 cache needs
    edge-runtime's attention ops at every fill; so does a q8 one."""
    if kv is KvDtype.FP32:
        return None
    if flavor is Flavor.TRT:
        return f"--kv-dtype {kv.value} needs the ort flavor (the trt graph keeps its cache in its activation dtype)"
    if quant is None or not quant.enabled or quant.kernel is not MatMulKernel.EDGE:
        return (
            f"--kv-dtype {kv.value} needs --kernel edge with a quantized model (--quant int8/int4*): ONNX Runtime's "
            "GroupQueryAttention and Attention need the cache in the activation dtype (fp32)"
        )
    from .blocks_ort import ring_attention_can_run  # onnx: not imported where first use finds its bundle cached

    if args is not None and not ring_attention_can_run(args.head_dim, args.rotary_dim):
        return (
            f"--kv-dtype {kv.value}: RingAttention does not take head size {args.head_dim} (rotary {args.rotary_dim}), "
            "and ONNX Attention, used instead, needs the cache in the activation dtype (fp32)"
        )
    return None


def check_options(quant: QuantConfig, trt: bool) -> None:
    """What the graph flavor and this machine refuse of a QuantConfig (its own invariants: quant.py)."""
    if trt and quant.method.linear_bits == 4 and quant.block not in TRT_INT4_BLOCKS:
        raise ExportError(
            f"INT4 block size {quant.block} is not supported by TensorRT (blocks {TRT_INT4_BLOCKS}); "
            f"use --block 64 or --block 128 with --flavor trt"
        )
    if trt and quant.kernel is MatMulKernel.EDGE:
        raise ExportError("--kernel edge needs --flavor ort: TensorRT runs its own kernels")
    if quant.kernel is MatMulKernel.EDGE and not quant.enabled:
        raise ExportError("--kernel edge applies to quantized bundles; add --quant int4 (or int8) or drop --kernel")
    if quant.kernel is MatMulKernel.EDGE:
        from edge_runtime import kernels  # onnxruntime: not loaded by `edge-export --help` (KvDtype's metavar)

        reason = kernels.unavailable_reason()
        if reason is not None:  # the export validates the graph here, so the op must run here
            raise ExportError(f"--kernel edge cannot be used: {reason}; export with --kernel mlas")
        kernels.check_pin()
    if trt and quant.int8_block is not None:
        raise ExportError("INT8 blocks need --flavor ort: the trt flavor stores INT8 weights per channel")
    if trt and quant.asymmetric:
        raise ExportError("asymmetric INT4 blocks need --flavor ort: TensorRT 10.3 takes symmetric Q/DQ only")
    if trt and quant.enabled and quant.table_bits == 4 and not quant.fp_embeddings:
        raise ExportError("--table-bits 4 needs --flavor ort: the trt flavor stores the table as INT8 per row")


@dataclass(frozen=True)
class _Settings:
    """The typed form of a profile's (or the portable) export settings, flags merged in (plan step 2)."""

    flavor: Flavor
    quant: QuantMethod
    block: int | None  # None: default_block(flavor)
    kernel: MatMulKernel
    table_bits: int
    mixed: MixedPlan
    sinks: int
    window: int | None
    target: str | None


def _settings(flags: ExportFlags, profile: TargetProfile | None) -> tuple[_Settings, tuple[str, ...]]:
    """The portable defaults, or the profile's, with every explicit flag in its place. A profile value the
    explicit flags make meaningless (its kernel or INT4 table under --flavor trt or --quant none; its
    mixed-precision plan, chosen for its own flavor and method, under another) is dropped rather than refused:
    only what the user typed can be wrong."""
    from edge_runtime import kernels

    s = settings_for(profile, edge_kernels_here=kernels.available()) if profile is not None else PORTABLE
    base = _Settings(
        Flavor(s.flavor),
        QuantMethod.parse(s.quant),
        s.block,
        MatMulKernel(s.kernel),
        s.table_bits,
        MixedPlan.parse(s.mixed),
        s.sinks,
        s.window,
        s.target,
    )
    notes: tuple[str, ...] = ()
    quant = _given(flags.quant, base.quant)
    if profile is not None and profile.matmul_kernel == "edge" and base.kernel is not MatMulKernel.EDGE:
        if quant is not QuantMethod.NONE:
            notes = (
                f"target {profile.name} uses edge-runtime's kernels, which do not run on this machine; exporting "
                "with ONNX Runtime's (--kernel mlas)",
            )
    if flags.flavor is not None and flags.flavor is not base.flavor:
        base = dataclasses.replace(base, block=None, kernel=MatMulKernel.MLAS, table_bits=8, mixed=MixedPlan.NONE)
    if flags.quant is not None and flags.quant is not base.quant:  # the profile's plan was chosen for its method
        base = dataclasses.replace(base, mixed=MixedPlan.NONE)
    unquantized = quant is QuantMethod.NONE  # no kernel or table of the profile's applies
    merged = _Settings(
        flavor=_given(flags.flavor, base.flavor),
        quant=quant,
        block=_given(flags.block, base.block),
        kernel=_given(flags.kernel, MatMulKernel.MLAS if unquantized else base.kernel),
        table_bits=_given(flags.table_bits, 8 if unquantized else base.table_bits),
        mixed=_given(flags.mixed, base.mixed),  # a typed --mixed is checked against the quantization by QuantConfig
        sinks=_given(flags.sinks, base.sinks),
        window=_given(flags.window, base.window),
        target=base.target,
    )
    return merged, notes


def _given(flag: _T | None, default: _T) -> _T:
    return default if flag is None else flag


def plan_export(source: Path, out: Path, flags: ExportFlags, profile: TargetProfile | None = None) -> ExportPlan:
    """The plan for exporting `source` (a Hugging Face directory or a .gguf file) into `out` as `flags` and
    `profile` say (plan steps 1-9)."""
    conflict = prune_conflict(flags.prune, flags.prune_budget, flags.prune_layers)
    if conflict:
        raise ExportError(conflict)
    s, notes = _settings(flags, profile)
    problem = _window_problem(flags.window)  # (the plan refuses it too: here it comes before --block's)
    # what --block sizes: INT4 blocks, the INT4 table's, or INT8 Linears' (only when given: per channel
    # otherwise); every quantization has one of them, a float export none
    if not problem and flags.block is not None and s.quant is QuantMethod.NONE:
        problem = (
            f"--block {flags.block} sizes quantized blocks (--quant int4*, int8, or --table-bits 4), which this "
            "export has none of; drop --block or add --quant"
        )
    if problem:
        raise ExportError(problem)
    quant = QuantConfig(
        s.quant,
        block=s.block if s.block is not None else default_block(s.flavor),
        fp_embeddings=flags.fp_embeddings,
        table_bits=s.table_bits,
        kernel=s.kernel,
        mixed=s.mixed,
        # the flag only, not a profile's block_size (which sizes INT4): INT8 stays per channel unless asked
        int8_block=flags.block if s.quant is QuantMethod.INT8 else None,
    )
    deferred = None
    gguf_blocks = (
        is_gguf(source)
        and flags.quant is None
        and flags.gguf_codes is not GGUFCodes.REQUANTIZE
        and s.flavor is Flavor.ORT
        and quant.kernel is MatMulKernel.EDGE
        and quant.enabled
        and flags.prune is None
        and flags.prune_budget is None
        and not flags.prune_layers
    )
    if is_gguf(source) and flags.mixed is None and quant.mixed is not MixedPlan.NONE:
        if flags.gguf_codes is not GGUFCodes.REQUANTIZE:  # llama.cpp's exact weights beat any requantization
            deferred, quant = quant.mixed, dataclasses.replace(quant, mixed=MixedPlan.NONE)
    plan = ExportPlan(
        checkpoint=source,
        out=out,
        flavor=s.flavor,
        precision=flags.precision,
        sinks=s.sinks,
        window=s.window,
        overwrite=flags.overwrite,
        quant=quant,
        prune=flags.prune,
        prune_budget=flags.prune_budget,
        prune_layers=flags.prune_layers,
        calibration=flags.calibration,
        fit_window=profile is not None and flags.window is None,
        fit_block=profile is not None and flags.block is None,
        target=s.target,
        kv_dtype=flags.kv_dtype or default_kv_dtype(s.flavor, quant),
        fit_kv_dtype=flags.kv_dtype is None,
        max_memory=flags.max_memory,
        gguf_codes=flags.gguf_codes,
        deferred_mixed=deferred,
        gguf_blocks=gguf_blocks,
        notes=notes,
    )
    plan.gguf_declined()  # an impossible explicit --gguf-codes keep fails here, before any work
    if flags.chat_template is not None:
        plan = dataclasses.replace(plan, chat_template=read_template_file(flags.chat_template))
    _check_output(source, out, overwrite=flags.overwrite)
    return plan


def _check_output(checkpoint: Path, out: Path, *, overwrite: bool) -> None:
    """Refuse a bad -o before minutes of work, not after (the writer checks again at the rename): the
    checkpoint itself or a folder holding it, or anything --overwrite may not replace."""
    src, dst = checkpoint.resolve(), out.resolve()
    if src == dst or src.is_relative_to(dst):
        what = "is the checkpoint" if src == dst else "holds the checkpoint"
        raise ExportError(f"output '{out}' {what} '{checkpoint}'; choose another -o")
    check_target(out, overwrite=overwrite)
