"""Decode speed of this tree against another (an earlier commit), measured alternately in one run, and whether
both give the same tokens, logprobs, speculation and session snapshots.

    git archive BASE | tar -x -C /tmp/base && cp edge_runtime/_edge_kernels*.so /tmp/base/edge_runtime/
    python scripts/decode_ratio.py --old /tmp/base BUNDLE [BUNDLE ...] [--rounds 12] [--tokens 512]

One worker process per tree (each imports its own `edge_runtime`, through PYTHONPATH) loads every bundle
once. Each round asks the two workers in turn, the order swapped every round so a shared machine's drift hits
both alike, for one greedy `stream_generate` of `--tokens` tokens (the product path: the decode loop,
detokenizer, stop matcher, timings) and takes its decode tokens/s. Prints per bundle the medians, the ratio
new/old of the medians, the median of the per-round ratios and the ratio of the best runs. Before timing,
each worker runs the same requests untimed (greedy tokens through stream_generate; a Session's reply with
logprobs; lookup speculation on an Engine and on a Session, tokens and counts; a session snapshot's bytes)
and the two answers must match.
The folders mapped into the namespace (exporters/, models/, targets/) come from this tree's install in both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROMPT = "ROMEO.\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun."


def _worker(bundles: list[str], threads: int, tokens: int) -> None:
    """Serve `time I` / `check I` requests on stdin, one JSON line each on stdout."""
    import edge_runtime
    from edge_runtime.engine import LoadOptions, load
    from edge_runtime.generate import GenerationConfig, stream_generate
    from edge_runtime.proposers import PromptLookup
    from edge_runtime.session import Session
    from edge_runtime.speculative import SpeculativeDecoder
    from edge_runtime.tokenizer import Tokenizer

    engines = [load(b, LoadOptions(threads=threads)) for b in bundles]
    toks = [Tokenizer.for_engine(e) for e in engines]
    print(json.dumps({"edge_runtime": edge_runtime.__file__}), flush=True)

    def greedy(engine, tok, ids, n, **kw):
        config = GenerationConfig(max_tokens=n, stop_on_eos=False)
        events = list(stream_generate(engine, tok, ids, config, **kw))
        return [e.token_id for e in events], events[-1].stats

    def check(engine, tok) -> dict:
        ids = tok.encode(PROMPT)
        out: dict = {"greedy": greedy(engine, tok, ids, 64)[0]}
        steps = list(Session(engine).send(ids, logprobs=3, max_tokens=32, stop_ids=()))
        out["logprobs"] = [[s.token, s.logprob, [list(t) for t in s.top_logprobs]] for s in steps]
        repetitive = ids * 3
        spec = SpeculativeDecoder(PromptLookup(), k=4, adaptive=False, exact=False)
        out["speculative_engine"] = greedy(engine, tok, repetitive, 64, speculative=spec)[0]
        out["speculative_engine_stats"] = spec.stats.to_dict()
        spec = SpeculativeDecoder(PromptLookup(), k=4, adaptive=False, exact=False)
        session = Session(engine)
        turn = [s.token for s in session.send(repetitive, max_tokens=48, stop_ids=(), speculative=spec)]
        out["speculative_session"] = turn
        out["speculative_session_stats"] = spec.stats.to_dict()
        session.send(tok.encode(" JULIET.", add_special_tokens=False), max_tokens=16, stop_ids=())
        snap = session.snapshot()
        h = hashlib.sha256()
        for a in (snap.row_pos, snap.row_ids, snap.rows, *snap.keys, *snap.values):
            h.update(a.tobytes())
        out["snapshot"] = [h.hexdigest(), snap.tokens, snap.written, snap.pending, list(snap.evicted[2])]
        return out

    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "quit":
            return
        i = int(arg)
        if cmd == "check":
            print(json.dumps(check(engines[i], toks[i])), flush=True)
        else:
            _, stats = greedy(engines[i], toks[i], toks[i].encode(PROMPT), tokens)
            print(json.dumps({"decode_tps": stats.decode_tps}), flush=True)


class Worker:
    def __init__(self, tree: Path, bundles: list[str], threads: int, tokens: int):
        cmd = [sys.executable, __file__, "--worker", "--threads", str(threads), "--tokens", str(tokens), *bundles]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.module = self._read()["edge_runtime"]
        if not self.module.startswith(str(tree)):
            raise SystemExit(f"the worker for {tree} imported {self.module}")

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, request: str) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--old", type=Path, help="the other tree (an extracted earlier commit)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        _worker(a.bundles, a.threads, a.tokens)
        return 0
    if a.old is None:
        ap.error("--old is required")
    from edge_runtime.cpuinfo import cpu_model

    new_tree = Path(__file__).resolve().parent.parent
    workers = {"old": Worker(a.old.resolve(), a.bundles, a.threads, a.tokens)}
    workers["new"] = Worker(new_tree, a.bundles, a.threads, a.tokens)
    differ = 0
    for i, b in enumerate(a.bundles):
        answers = {name: w.ask(f"check {i}") for name, w in workers.items()}
        keys = [k for k in answers["new"] if answers["new"][k] != answers["old"][k]]
        for k in keys:
            print(f"{b}: {k} differs:\n  old {answers['old'][k]}\n  new {answers['new'][k]}")
        print(f"{b}: greedy tokens, logprobs, speculation and snapshot {'DIFFER' if keys else 'identical'}")
        differ += len(keys)
    tps: dict[str, dict[str, list[float]]] = {b: {"old": [], "new": []} for b in a.bundles}
    for r in range(a.rounds):
        for i, b in enumerate(a.bundles):
            for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                tps[b][name].append(workers[name].ask(f"time {i}")["decode_tps"])
    for w in workers.values():
        w.close()
    print(f"cpu: {cpu_model()}; {a.threads} threads; {a.rounds} rounds of {a.tokens} greedy tokens, order alternating")
    print(f"old: {workers['old'].module}\nnew: {workers['new'].module}")
    for b, t in tps.items():
        old, new = statistics.median(t["old"]), statistics.median(t["new"])
        per_round = [n / o for n, o in zip(t["new"], t["old"], strict=True)]
        # The best run of each is the least disturbed by other processes: on a shared machine the steadiest figure.
        best = max(t["new"]) / max(t["old"])
        print(
            f"{b}: decode tok/s median old {old:.1f}, new {new:.1f}: new/old {new / old:.4f}; median of per-round "
            f"ratios {statistics.median(per_round):.4f} (range {min(per_round):.3f}..{max(per_round):.3f}); "
            f"best new/old {best:.4f}"
        )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
