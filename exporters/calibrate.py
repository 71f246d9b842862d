"""Calibration text, the inputs of every Linear on it, and held-out perplexity.

Activations come from the reference forward itself (exporters/reference.py), run in float32: each
tapped weight is an ndarray subclass that records the left operand of `x @ w.T`, so the forward is not
duplicated here. float32 is what the runtime computes in, and the statistics are summed in float64
(input_stats.py); the float64 forward took twice as long for statistics that differ by float32 rounding.

The default calibration text is `calibration.txt` beside the checkpoint (the demo model ships one from
its own training plays), else the project's general one, technical English and Python code
(models/calibration/, never another model's file): a model is calibrated on text like what it will
read, and the manifest records which file, its checksum and token count.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Tokenizer

from edge_runtime.errors import ExportError
from edge_runtime.models import GENERAL_CALIBRATION, LayerWeights, ModelArgs, ModelWeights

from .checkpoint import Checkpoint
from .input_stats import InputStats
from .progress import Progress, Stage, as_progress
from .reference import DenseKVCache, ReferenceModel, perplexity
from .tables import RowTable

if TYPE_CHECKING:
    from .prune_layers import BlockStats

CALIBRATION_FILE = "calibration.txt"
HELDOUT_FILE = "heldout.txt"
# GPTQ's Hessian of a 1536-wide down_proj input wants many more rows than 2048. On SmolLM2-135M (int4
# GPTQ block 32, held-out ORT perplexity, fp32 15.07): 17.30 with 2048 tokens, 16.62 with 16384 (all of
# general_en_code.txt). The statistics (InputStats) do not grow with the token count.
DEFAULT_CALIBRATION_TOKENS = 16384
CALIBRATION_DTYPE = np.float32  # the calibration forward's precision (module docstring)
MIN_CALIBRATION_TOKENS = 64
CALIBRATION_SEQUENCE = 512  # tokens a calibration sequence holds at most (BOS included)
HELDOUT_TOKENS = 512  # BOS + the first 511 held-out tokens, as the demo's training script reports

ProgressArg = Progress | Callable[[str], None]


@dataclass(frozen=True)
class CalibrationSet:
    path: Path
    sha256: str
    sequences: list[np.ndarray]  # token ids, each starting with BOS where the model has one

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sequences)

    def record(self) -> dict:
        return {"file": str(self.path), "sha256": self.sha256, "tokens": self.tokens, "sequences": len(self.sequences)}


def default_calibration_file(ckpt: Checkpoint) -> Path:
    own = ckpt.path / CALIBRATION_FILE
    return own if own.is_file() else GENERAL_CALIBRATION


def load_calibration(
    ckpt: Checkpoint, path: Path | None = None, max_tokens: int = DEFAULT_CALIBRATION_TOKENS
) -> CalibrationSet:
    """Tokenize a calibration text into sequences of at most the model's context (<= CALIBRATION_SEQUENCE)."""
    path = Path(path) if path is not None else default_calibration_file(ckpt)
    if not path.is_file():
        raise ExportError(
            f"calibration file '{path}' does not exist; pass --calib FILE with a few KB of text like the model's"
        )
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ExportError(f"calibration file '{path}' cannot be read as UTF-8 text: {e}") from e
    if not text.strip():
        raise ExportError(f"calibration file '{path}' is empty; give it a few KB of text like the model's (--calib)")
    ids = _tokenizer(ckpt).encode(text, add_special_tokens=False).ids[:max_tokens]
    if len(ids) < MIN_CALIBRATION_TOKENS:
        raise ExportError(
            f"calibration file '{path}' has only {len(ids)} tokens; need at least {MIN_CALIBRATION_TOKENS} "
            f"(a few KB of text)"
        )
    bos = [] if ckpt.args.bos_token_id is None else [ckpt.args.bos_token_id]
    span = min(CALIBRATION_SEQUENCE, ckpt.args.max_position_embeddings) - len(bos)
    span = -(-len(ids) // -(-len(ids) // span))  # equal lengths: no short tail sequence
    seqs = [np.asarray(bos + ids[i : i + span], np.int64) for i in range(0, len(ids), span)]
    return CalibrationSet(path=path, sha256=hashlib.sha256(raw).hexdigest(), sequences=seqs)


def heldout_ids(ckpt: Checkpoint, tokens: int = HELDOUT_TOKENS) -> np.ndarray | None:
    """BOS + the first held-out tokens of `heldout.txt` beside the checkpoint; None without one."""
    path = ckpt.path / HELDOUT_FILE
    if not path.is_file() or ckpt.tokenizer_file is None:
        return None
    text, tok = path.read_text(encoding="utf-8"), _tokenizer(ckpt)
    # A prefix of the text is enough when it yields some tokens more than needed (the last ones, where
    # the cut may split a word, go unused); else tokenize it all.
    ids = tok.encode(text[: 8 * tokens + 1024], add_special_tokens=False).ids
    if len(ids) < tokens + 8:
        ids = tok.encode(text, add_special_tokens=False).ids
    bos = [] if ckpt.args.bos_token_id is None else [ckpt.args.bos_token_id]
    ids = bos + ids[: tokens - len(bos)]
    return np.asarray(ids, np.int64) if len(ids) >= 2 else None


def heldout_perplexity(args: ModelArgs, weights: ModelWeights, ids: np.ndarray) -> float:
    return perplexity(ReferenceModel(args, weights), ids)


def calibration_perplexity(args: ModelArgs, weights: ModelWeights, sequences: list[np.ndarray]) -> float:
    """exp(mean NLL) over all predicted tokens of the sequences (float64 reference, one forward each)."""
    ref = ReferenceModel(args, weights)
    nll = sum(np.log(perplexity(ref, s)) * (len(s) - 1) for s in sequences)
    return float(np.exp(nll / sum(len(s) - 1 for s in sequences)))


def _tokenizer(ckpt: Checkpoint) -> Tokenizer:
    if ckpt.tokenizer_file is None:
        raise ExportError(f"'{ckpt.path}' has no tokenizer.json, which calibration needs to read its text")
    return Tokenizer.from_file(str(ckpt.tokenizer_file))


# ------------------------------------------------------------------------------------------------
# Capturing the inputs of every Linear
# ------------------------------------------------------------------------------------------------

TAPPED = {"q": "attn", "o": "o", "gate": "mlp", "down": "down"}  # one tap per distinct input


class _Tap(np.ndarray):
    """A weight that reports the left operand of every `x @ w.T` it takes part in."""

    _sink: Callable[[np.ndarray], None] | None

    def __new__(cls, array: np.ndarray, sink: Callable[[np.ndarray], None]) -> _Tap:
        obj = np.asarray(array).view(cls)
        obj._sink = sink
        return obj

    def __array_finalize__(self, obj: object) -> None:  # views (w.T) keep the sink
        self._sink = getattr(obj, "_sink", None)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is np.matmul and method == "__call__" and len(inputs) == 2 and inputs[1] is self and self._sink:
            self._sink(np.asarray(inputs[0]))
        plain = [i.view(np.ndarray) if isinstance(i, _Tap) else i for i in inputs]
        return getattr(ufunc, method)(*plain, **kwargs)


GROUP_OF = {"q": "attn", "k": "attn", "v": "attn", "o": "o", "gate": "mlp", "up": "mlp", "down": "down"}


@dataclass
class LayerInputs:
    """One layer's statistics of the rows fed to each group of Linears over the calibration tokens."""

    attn: InputStats  # K = H      -> q, k, v
    o: InputStats  # K = Hq*D      -> o
    mlp: InputStats  # K = H       -> gate, up
    down: InputStats  # K = I      -> down

    def of(self, linear: str) -> InputStats:
        return getattr(self, GROUP_OF[linear])


@dataclass
class LinearInputs:
    """Per layer, the statistics of the rows fed to each group of Linears over the calibration tokens."""

    attn: list[InputStats] = field(default_factory=list)  # K = H      -> q, k, v
    o: list[InputStats] = field(default_factory=list)  # K = Hq*D      -> o
    mlp: list[InputStats] = field(default_factory=list)  # K = H       -> gate, up
    down: list[InputStats] = field(default_factory=list)  # K = I      -> down

    def of(self, layer: int, linear: str) -> InputStats:
        return getattr(self, GROUP_OF[linear])[layer]

    def layer(self, i: int) -> LayerInputs:
        return LayerInputs(self.attn[i], self.o[i], self.mlp[i], self.down[i])

    def append(self, x: LayerInputs) -> None:
        for group in ("attn", "o", "mlp", "down"):
            getattr(self, group).append(getattr(x, group))


class LayerInputStream:
    """Each layer's LayerInputs in order, computed when asked for: the reference runs with the layers
    outermost (every calibration sequence through layer i, then all through i + 1), so it holds one
    layer's weights and statistics and the sequences' residual streams, not the model. A
    consumer that quantizes layer i before asking for i + 1 (quant_model.quantize_model) holds only that.
    The statistics equal a sequence-by-sequence forward's bit for bit (each sum runs over the sequences
    in the same order). `seconds`: the time spent computing them so far."""

    def __init__(
        self,
        args: ModelArgs,
        weights: ModelWeights,
        calib: CalibrationSet,
        progress: ProgressArg | None = None,
        *,
        sample_wide: bool = False,
        blocks: BlockStats | None = None,
    ):
        """`sample_wide`: inputs wider than input_stats.SAMPLE_ROWS keep a row sample instead of X^T X
        (for consumers that only measure output errors: AWQ, the manifest's record). `blocks`: also gather
        what whole-layer pruning needs (prune_layers.BlockStats) from the same forward."""
        self._ref = ReferenceModel(args, weights, CALIBRATION_DTYPE)
        self._blocks = blocks
        self._calib, self._progress = calib, as_progress(progress)
        self._sample_rows = calib.tokens - len(calib.sequences) if sample_wide else None
        self._streams = None  # per sequence: [residual stream, positions, angles, cache], made on first use
        self._next = 0
        self.seconds = 0.0

    def __len__(self) -> int:
        return len(self._ref.layers)

    @property
    def tokens(self) -> int:
        return self._calib.tokens

    def layer(self, i: int, stage: Stage | None = None) -> LayerInputs:
        """Layer i's input statistics; `stage`: the consumer's stage, told which sequence is in flight (a layer
        of a 16k-token forward takes seconds on a small CPU), else a line once it is done."""
        if i != self._next:  # a caller bug: the streams have moved past earlier layers
            raise ValueError(f"calibration inputs are computed layer by layer: asked for {i}, next is {self._next}")
        t0 = time.perf_counter()
        ref = self._ref
        if self._streams is None:
            self._streams = []
            for seq in self._calib.sequences:
                positions = np.arange(len(seq), dtype=np.int64)
                cache = DenseKVCache(positions=positions)
                self._streams.append([ref.embed_rows(seq), positions, ref.angles(positions), cache])
        lw = ref.layers[i]
        stats = {group: InputStats.empty(getattr(lw, f).shape[1], self._sample_rows) for f, group in TAPPED.items()}
        sinks = {group: stats[group].add for group in stats}
        before, down_rows = [s[0] for s in self._streams], []
        if self._blocks is not None:
            sinks["down"] = lambda x: (stats["down"].add(x), down_rows.append(x))
        tapped = replace(lw, **{f: _Tap(getattr(lw, f), sinks[group]) for f, group in TAPPED.items()})
        for n, stream in enumerate(self._streams):
            if stage is not None:
                stage.status(f"layer {i + 1}: calibration forward, sequence {n + 1}/{len(self._streams)}")
            stream[0] = ref.layer(i, tapped, *stream)
            stream[3].forget(i)  # no later layer reads layer i's keys
        for x in stats.values():
            x.release()
        if self._blocks is not None:
            self._blocks.add_layer(i, before, [s[0] for s in self._streams], down_rows)
        self._next += 1
        if self._next == len(ref.layers):  # the last layer: the residual streams are not read again
            self._streams = []
        self.seconds += time.perf_counter() - t0
        if stage is None:
            self._progress(f"  calibration layer {i + 1}/{len(ref.layers)} ({self._calib.tokens} tokens)")
        return LayerInputs(**stats)


def capture_linear_inputs(
    args: ModelArgs,
    weights: ModelWeights,
    calib: CalibrationSet,
    progress: ProgressArg | None = None,
    blocks: BlockStats | None = None,
) -> LinearInputs:
    """Every layer's input statistics, held together (pruning and --mixed sensitivity compare layers);
    `blocks` also gathers whole-layer pruning's statistics."""
    progress = as_progress(progress)
    stream = LayerInputStream(args, weights, calib, progress, blocks=blocks)
    out = LinearInputs()
    plan = f"{calib.tokens} tokens, float32 forward"
    with progress.stage("calibrating", len(stream), "layer", plan=plan) as stage:
        for i in range(len(stream)):
            out.append(stream.layer(i, stage))
            stage.advance()
    if blocks is not None:
        blocks.finish()  # the last layer's down_proj inputs: nothing after it to absorb
    return out


def copy_layer(lw: LayerWeights, **changes: np.ndarray | None) -> LayerWeights:
    """`lw` with some arrays replaced, all float32. float32 arrays pass through as the same objects, and a
    RowTable as itself (np.asarray would strip it to its NaN placeholder values: tables.py)."""
    values = {f.name: getattr(lw, f.name) for f in fields(LayerWeights)}
    values.update(changes)

    def f32(v: np.ndarray | None) -> np.ndarray | None:
        return v if v is None or isinstance(v, RowTable) else np.asarray(v, dtype=np.float32)

    return LayerWeights(**{k: f32(v) for k, v in values.items()})
