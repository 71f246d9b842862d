"""Two pruning structures measured against the refitted layer and not built (docs/benchmarks/quality.md,
"Pruning with a quality budget"): attention sublayers dropped, and the vocabulary cut to its first N ids.

    python scripts/prune_alternatives.py attention --checkpoint "$(python -m tests.real_model)" --drop 2 4 6 10
    python scripts/prune_alternatives.py vocab --checkpoint "$(python -m tests.real_model)" --ids 32768 24576 16384

Both score the float64 reference on scripts/heldout_eval.py's windows (8 x 512 of python_docstrings.txt),
as scripts/prune_sweep.py does, so their rows compare with its table.

attention: each layer's attention output is replaced by its mean over the calibration text pruning fits
on (quant_pipeline.pruning_split), in the layers whose attention moves the residual stream least there
(block influence: 1 - cos(x, x + attn(x)), the first 4 tokens of each sequence left out as sinks).
vocab: a byte-level BPE tokenizer keeps every text encodable without the tokens above N, so the text is
re-encoded without them (the merges that make them go too) and scored on the first N logits;
perplexity is per token of the full tokenizer's encoding of the same characters, so the rows compare.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import fields
from pathlib import Path

import numpy as np
from heldout_eval import DEFAULT_TEXT, log_softmax, read_text, text_ids, windows
from tokenizers import Tokenizer

from edge_runtime.exporters.calibrate import load_calibration
from edge_runtime.exporters.checkpoint import load_checkpoint
from edge_runtime.exporters.quant_pipeline import pruning_split
from edge_runtime.exporters.reference import DenseKVCache, NumpyLowering, ReferenceModel
from edge_runtime.models.layer_plan import Block, Sublayer, run_layer

SINKS = 4  # tokens left out of the block-influence statistics


class AttentionProbe(ReferenceModel):
    """The reference with chosen layers' attention replaced by a constant vector (`replace`), and, while
    `record` is on, per-layer sums of the attention's block influence and output."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.replace: dict[int, np.ndarray] = {}
        self.record = False
        self.influence: dict[int, list[float]] = {}  # layer -> [sum of 1 - cos, count]
        self.out_sum: dict[int, np.ndarray] = {}

    def layer(self, i, lw, x, positions, angles, cache: DenseKVCache):
        cos, sin = angles[self.args.rope_kind(i)]
        probe = self

        def attend(i, lw, h):
            if i in probe.replace:
                if i >= len(cache.keys):  # keep the cache's per-layer lists aligned with the layer index
                    cache.keys.append(np.empty(0))
                    cache.values.append(np.empty(0))
                return np.broadcast_to(probe.replace[i], h.shape).astype(h.dtype)
            return probe._attention(i, lw, h, positions, cos, sin, cache)

        class Recording(NumpyLowering):
            def residual(self, layer: int, sub: Sublayer, x: np.ndarray, y: np.ndarray) -> np.ndarray:
                z = x + y
                if probe.record and sub.block is Block.ATTENTION:
                    c = (x * z).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(z, axis=1) + 1e-30)
                    acc = probe.influence.setdefault(layer, [0.0, 0])
                    acc[0] += float((1 - c[SINKS:]).sum())
                    acc[1] += max(0, len(c) - SINKS)
                    probe.out_sum[layer] = probe.out_sum.get(layer, 0) + y.sum(0)
                return z

        return run_layer(Recording(self.args.rms_norm_eps, attend, self._mlp), i, lw, x)


def nll(model: ReferenceModel, seqs, vocab: int | None = None) -> tuple[float, int]:
    total, count = 0.0, 0
    for ids in seqs:
        ids = np.asarray(ids)
        logits = model.forward(ids[:-1])
        logp = log_softmax(logits if vocab is None else logits[:, :vocab])
        total -= float(logp[np.arange(len(ids) - 1), ids[1:]].sum())
        count += len(ids) - 1
    return total, count


def attention(a, ck) -> None:
    ids, prefix = text_ids(a.checkpoint, read_text(a.text))
    wins = windows(ids, prefix, 512, 4088)
    model = AttentionProbe(ck.args, ck.weights)
    fit = pruning_split(load_calibration(ck))[1]
    model.record = True
    nll(model, fit.sequences)
    model.record = False
    tokens = sum(len(s) - 1 for s in fit.sequences)
    score = {i: s / n for i, (s, n) in model.influence.items()}
    order = sorted(score, key=score.get)
    print("attention block influence, least first:", ", ".join(f"{i}: {score[i]:.4f}" for i in order))
    base = math.exp(np.divide(*nll(model, wins)))
    print(f"unpruned: held-out ppl {base:.3f}")
    per_layer = ck.weights.layers[0]
    params = sum(getattr(per_layer, n).size for n in ("q", "k", "v", "o"))
    total = ck.weights.embed.size + sum(
        getattr(lw, f.name).size for lw in ck.weights.layers for f in fields(lw) if getattr(lw, f.name) is not None
    )
    for k in a.drop:
        model.replace = {i: model.out_sum[i] / tokens for i in order[:k]}
        ppl = math.exp(np.divide(*nll(model, wins)))
        print(
            f"attention of {k} layers {sorted(order[:k])} replaced by its mean ({k * params / total:.1%} of the "
            f"parameters): held-out ppl {ppl:.3f} ({100 * (ppl / base - 1):+.1f}%)",
            flush=True,
        )


def trimmed_tokenizer(spec: dict, n: int) -> Tokenizer:
    """The BPE tokenizer without ids >= n: their vocabulary entries and the merges that make them."""
    spec = json.loads(json.dumps(spec))
    model = spec["model"]
    if model["type"] != "BPE":
        raise SystemExit(f"vocab: a BPE tokenizer is needed, not {model['type']}")
    model["vocab"] = {s: i for s, i in model["vocab"].items() if i < n}

    def kept(merge) -> bool:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        return model["vocab"].get(left + right, n) < n

    model["merges"] = [m for m in model["merges"] if kept(m)]
    return Tokenizer.from_str(json.dumps(spec))


def vocab(a, ck) -> None:
    spec = json.loads((a.checkpoint / "tokenizer.json").read_text(encoding="utf-8"))
    full = Tokenizer.from_file(str(a.checkpoint / "tokenizer.json"))
    text = read_text(a.text)
    enc = full.encode(text, add_special_tokens=False)
    # The characters of the 8 windows of 512 full-tokenizer tokens, each re-encoded on its own
    spans = [text[enc.offsets[k * 512][0] : enc.offsets[(k + 1) * 512 - 1][1]] for k in range(8)]
    model = ReferenceModel(ck.args, ck.weights)
    full_total, full_count = nll(model, [full.encode(s, add_special_tokens=False).ids for s in spans])
    base = math.exp(full_total / full_count)
    print(f"full vocabulary ({ck.args.vocab_size}): held-out ppl {base:.3f} over {full_count} predicted tokens")
    total = ck.weights.embed.size + sum(
        getattr(lw, f.name).size for lw in ck.weights.layers for f in fields(lw) if getattr(lw, f.name) is not None
    )
    for n in a.ids:
        tok = trimmed_tokenizer(spec, n)
        seqs = [tok.encode(s, add_special_tokens=False).ids for s in spans]
        cut, count = nll(model, seqs, vocab=n)
        ppl = math.exp(cut / full_count)  # per token of the full encoding: the same characters
        removed = (ck.args.vocab_size - n) * ck.args.hidden_size
        print(
            f"first {n} ids ({removed / total:.1%} of the parameters in a tied table): {count} predicted tokens "
            f"({count / full_count - 1:+.1%}), held-out ppl per full token {ppl:.3f} ({100 * (ppl / base - 1):+.1f}%)",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["attention", "vocab"])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--drop", type=int, nargs="+", default=[2, 4, 6, 10], help="attention: layers to drop")
    ap.add_argument("--ids", type=int, nargs="+", default=[32768, 24576, 16384], help="vocab: ids kept")
    a = ap.parse_args()
    ck = load_checkpoint(a.checkpoint)
    (attention if a.what == "attention" else vocab)(a, ck)


if __name__ == "__main__":
    main()
