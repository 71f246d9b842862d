"""Held-out perplexity of pruned models, with and without reconstruction, from one calibration pass.

    python scripts/prune_sweep.py --checkpoint "$(python -m tests.real_model)" --ratios 0.1 0.15 0.25 \\
        [--methods none one-shot sequential sequential-all] [--layers 1 2 3] [--budget 10] \\
        [--budget-method sequential] [--heldout-budget 10] [--acts /tmp/acts.pkl] [--json OUT]

Each export with --prune re-runs the float64 calibration forward (minutes on SmolLM2-135M); this script
runs it once (cached in --acts) and prunes in memory with exporters/prune.py, so the rows differ only
in the pruning. Perplexity is the float64 reference's over the same windows as scripts/quality_table.py
(heldout_eval.windows of models/eval/python_docstrings.txt: 8 windows of 512 tokens, 4,088 predicted,
no BOS for SmolLM2); an fp32 bundle's ORT graph matches that reference to ~1e-5 relative, so these are the
fp32 bundles' perplexities without building them.
  --methods             the reconstructions compared at each ratio (prune.Reconstruction)
  --layers N ...        also N whole layers removed (prune_layers.py), alone and with each ratio (one-shot)
  --budget PCT          also run prune_to_budget on calibration perplexity (what `--prune-budget PCT` exports)
  --heldout-budget PCT  also the largest ratio within +PCT held-out perplexity (the same bisection on this text)
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import time
from pathlib import Path

import numpy as np

# A sibling script, importable because Python puts this script's folder first on the path.
from heldout_eval import DEFAULT_TEXT, log_softmax, machine, read_text, text_ids, windows

from edge_runtime.exporters.calibrate import calibration_perplexity, capture_linear_inputs, load_calibration
from edge_runtime.exporters.checkpoint import load_checkpoint
from edge_runtime.exporters.prune import (
    RECON_SINK_WEIGHT,
    PruneConfig,
    Reconstruction,
    prune_model,
    prune_to_budget,
    pruned_args,
)
from edge_runtime.exporters.prune_layers import BlockStats
from edge_runtime.exporters.quant_pipeline import pruning_split
from edge_runtime.exporters.reference import ReferenceModel


def heldout_ppl(args, weights, wins: list[np.ndarray]) -> float:
    ref = ReferenceModel(args, weights)
    nll, count = 0.0, 0
    for ids in wins:
        logp = log_softmax(ref.forward(ids[:-1]))
        nll -= float(logp[np.arange(len(ids) - 1), ids[1:]].sum())
        count += len(ids) - 1
    return math.exp(nll / count)


def _first_tokens(sequences: list[np.ndarray], tokens: int) -> list[np.ndarray]:
    """The leading sequences that hold at most `tokens` tokens (at least one)."""
    out, n = [], 0
    for s in sequences:
        if out and n + len(s) > tokens:
            break
        out.append(s)
        n += len(s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--tokens", type=int, default=4088)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--ratios", type=float, nargs="*", default=[0.1, 0.15, 0.25])
    ap.add_argument(
        "--methods", nargs="+", default=["none", "one-shot"], choices=[r.value for r in Reconstruction],
        help="reconstructions to compare at each ratio",
    )  # fmt: skip
    ap.add_argument(
        "--seq-tokens", type=int, default=None,
        help="calibration tokens the sequential reconstructions run through (default: all of them)",
    )  # fmt: skip
    ap.add_argument("--layers", type=int, nargs="*", default=[], help="whole layers to remove (prune_layers.py)")
    ap.add_argument("--budget-method", default="one-shot", choices=[r.value for r in Reconstruction])
    ap.add_argument("--budget", type=float, default=None)
    ap.add_argument("--heldout-budget", type=float, default=None)
    ap.add_argument("--acts", type=Path, default=None, help="cache of the calibration statistics (pickle)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    ck = load_checkpoint(a.checkpoint)
    ids, prefix = text_ids(a.checkpoint, read_text(a.text))
    wins = windows(ids, prefix, a.context, a.tokens)
    cached = None
    if a.acts is not None and a.acts.is_file():
        try:
            cached = pickle.loads(a.acts.read_bytes())
        except (ModuleNotFoundError, AttributeError) as e:  # written by an older layout of the modules
            print(f"{a.acts}: stale cache ({e}); computing the statistics again", flush=True)
        if cached is not None and len(cached) != 4:  # older: no BlockStats, or fitted on the judged text too
            print(f"{a.acts}: cache of an older layout; computing the statistics again", flush=True)
            cached = None
    if cached is not None:
        calib, acts, blocks, fit = cached
    else:
        calib = load_calibration(ck)
        t0 = time.perf_counter()
        blocks = BlockStats(RECON_SINK_WEIGHT)
        fit = pruning_split(calib)[1]  # as the exporter: statistics from the text pruning is not judged on
        acts = capture_linear_inputs(ck.args, ck.weights, fit, blocks=blocks)
        print(f"calibration forward: {fit.tokens} tokens in {time.perf_counter() - t0:.0f}s", flush=True)
        if a.acts is not None:
            a.acts.write_bytes(pickle.dumps((calib, acts, blocks, fit), protocol=5))
    seqs = pruning_split(calib)[0]  # as quant_pipeline._prune judges pruning

    seq_calib = fit.sequences
    if a.seq_tokens is not None:
        seq_calib = _first_tokens(fit.sequences, a.seq_tokens)
    rows = []

    def row(name: str, weights, record: dict | None, seconds: float = 0.0) -> None:
        t0 = time.perf_counter()
        ppl = heldout_ppl(pruned_args(ck.args, weights), weights, wins)
        cal = calibration_perplexity(pruned_args(ck.args, weights), weights, seqs)
        base = rows[0]["heldout_ppl"] if rows else ppl
        r = {
            "name": name,
            "removed": 0.0 if record is None else record["removed"],
            "heldout_ppl": ppl,
            "heldout_change_pct": 100 * (ppl / base - 1),
            "calibration_ppl": cal,
            "seconds": round(seconds + time.perf_counter() - t0, 1),
            "record": record,
        }
        rows.append(r)
        print(
            f"{name}: removed {r['removed']:.1%}, held-out ppl {ppl:.3f} ({r['heldout_change_pct']:+.1f}%), "
            f"calibration ppl {cal:.3f} [{r['seconds']:.0f}s]",
            flush=True,
        )

    row("unpruned", ck.weights, None)
    for ratio in a.ratios:
        for method in map(Reconstruction, a.methods):
            t0 = time.perf_counter()
            config = PruneConfig(ratio, 32, method)
            pruned, record = prune_model(ck.args, ck.weights, acts, config, sequences=seq_calib)
            row(f"prune {ratio:g}, {method.value}", pruned, record, time.perf_counter() - t0)
    for layers in (n for n in a.layers if n > 0):
        for ratio in [0.0, *a.ratios]:
            t0 = time.perf_counter()
            config = PruneConfig(ratio, 32, Reconstruction.ONE_SHOT, layers=layers)
            pruned, record = prune_model(ck.args, ck.weights, acts, config, blocks=blocks)
            name = f"{layers} layer{'s' if layers > 1 else ''} {record['layers_removed']}"
            row(name + (f" + prune {ratio:g}" if ratio else ""), pruned, record, time.perf_counter() - t0)
    for pct, evaluate, label in (
        (a.budget, lambda w: calibration_perplexity(ck.args, w, seqs), "calibration"),
        (a.heldout_budget, lambda w: heldout_ppl(ck.args, w, wins), "held-out"),
    ):
        if pct is None:
            continue
        t0 = time.perf_counter()
        method = Reconstruction(a.budget_method)
        pruned, record = prune_to_budget(
            ck.args, ck.weights, acts, pct, evaluate, 32, method, progress=print, sequences=seq_calib, blocks=blocks
        )
        row(f"budget +{pct:g}% on {label} perplexity, {method.value}", pruned, record, time.perf_counter() - t0)
    caption = f"{a.checkpoint.name} on {a.text.name}, {len(wins)} windows of {a.context}; {machine()}"
    print(caption)
    if a.json:
        a.json.write_text(json.dumps({"caption": caption, "rows": rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
