"""Side-by-side speed against onnxruntime-genai on random-weight checkpoints of real shapes.

    python scripts/bench_vs_ortgenai.py [--shape smollm2-135m] [--skip-1b] [--precision fp32 ...]
                                        [--our-kernel edge|mlas] [--rounds 3] [--work /tmp/edge-vs-genai]
                                        [--json out.json]

For each shape (default: smollm2-135m and llama-3.2-1b; `--skip-1b` drops the 1B one) and precision
(fp32, int8, int4 block 32) it
  1. writes the checkpoint if missing (scripts/make_shape_checkpoints.py, under --shapes-dir),
  2. builds it with our exporter (`edge-export build`, validated against the float64 reference) and with
     onnxruntime-genai's model builder (`python -m onnxruntime_genai.models.builder -e cpu`) at the same
     precision, each in its own process, timing both (bundles are reused on later runs; --rebuild),
  3. runs both alternately, `--rounds` times, each run a fresh process (so peak RSS is its own): load,
     `--warmup` untimed generations, then `--trials` timed ones with the same prompt ids (default 128),
     `--gen-tokens` greedy tokens (128, EOS ignored), `--threads` intra-op threads (2). Ours goes through
     `stream_generate` (the product path, detokenizer included); theirs through `og.Generator` with a
     `TokenizerStream`, one `generate_next_token` per token.
  4. reports medians per side, ratios ours / theirs, weight bytes read per token computed the same way
     from each ONNX graph (every initializer a node reads, except tables that are only gathered: the
     embedding table, and GroupQueryAttention's cos/sin caches; a tied LM head counts in full), and the
     achieved weight bandwidth as a fraction of the memory read bandwidth measured in the same run
     (best of a 2-thread numpy sum and a 2-thread ONNX Runtime fp32 GEMV over arrays far above cache
     size, measured before and after the runs), and against each round's own bound ("% of round's BW":
     a numpy-sum probe just before the round, or the round's faster decode where it read more; median
     and per round), which cancels most of this shared machine's drift between rounds.

`--prompt-tokens` may be repeated: each value is a row at that context depth (decode runs after the
whole prompt; 2000 is the long-context row). `--kv-dtype fp16|q8` (repeatable) builds our bundles
with that KV cache (`edge-export --kv-dtype`, edge kernels and int8/int4 only; the script's default is fp32, named
on every build, where edge-export's own default on the edge kernels is fp16); onnxruntime-genai keeps its
own (fp32 on CPU). The KV cache column is ours measured (the pool's K/V arrays) and theirs computed from
its graph's past_key_values dtype and max_length.

Every figure is measured in this run; nothing is carried over. A machine busy with other work skews all
absolute figures: the load average is printed with the tables. `--our-window match` (default) sizes our
ring to the request (prompt + generated tokens, as onnxruntime-genai sizes its cache to max_length);
`--our-window bundle` keeps the bundle's default geometry.

The 1B shape needs ~2.5 GB for the bf16 checkpoint plus ~5 GB per fp32 build on disk. Our exporter
holds the fp32 weights, the ONNX model, an ONNX Runtime session and a float64 reference at once while
validating: ~25 bytes per parameter at peak on the 135M shape (3.4 GB), so ~30 GB for the 1B shape, more
than a 24 GB machine has (an fp32 1B export had reached 16 GB RSS while still building the graph, 83 s
in). Use `--skip-1b` there; build times and peak RSS of both builders are in the last table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
WORKER = HERE / "bench_worker.py"  # the measured child processes
PRECISIONS = ("fp32", "int8", "int4")
KV_DTYPES = ("fp32", "fp16", "q8")  # edge-export --kv-dtype
DEFAULT_SHAPES = ("smollm2-135m", "llama-3.2-1b")
ONE_B = "llama-3.2-1b"
MB = 1e6


# --------------------------------------------------------------------------------------------------
# Driver helpers.


# Spawns the command from a small interpreter and reports its peak RSS: a child's ru_maxrss starts at
# the RSS of the process it was forked from, so it must not be forked from this (larger) driver.
_LAUNCHER = (
    "import os, sys, json\n"
    "pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024]), file=sys.stderr)\n"
)


def run_child(cmd: list[str], log: Path | None = None, stderr: list[str] | None = None) -> tuple[int, float, int, str]:
    """Run `cmd`; (exit code, wall seconds, the command's peak RSS in bytes, its stdout). Its stderr goes
    to `log`, and its lines into `stderr` where given."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, *cmd], stdout=out, stderr=err, check=False)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, lines = out.read().decode(errors="replace"), err.read().decode(errors="replace").splitlines()
    rc, rss = json.loads(lines.pop()) if lines and lines[-1].startswith("[") else (-1, 0)
    if log:
        with log.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
    if stderr is not None:
        stderr.extend(lines)
    return rc, wall, rss, stdout


def read_bandwidth(threads: int, log: Path, sums_only: bool = False) -> dict[str, float]:
    cmd = [sys.executable, str(WORKER), "bandwidth", str(threads), *(["--sums"] if sums_only else [])]
    rc, _, _, out = run_child(cmd, log)
    if rc != 0:
        raise SystemExit(f"the bandwidth measurement failed (exit {rc}); see {log}")
    return json.loads(out)


def round_probe(threads: int, log: Path) -> float:
    """The read bandwidth just before a round (numpy sums in a fresh process)."""
    return read_bandwidth(threads, log, sums_only=True)["numpy_sum"]


def round_shares(probes: list[float], rates: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each side's decode read rate (bytes/s, one per round) over its own round's bound: the probe taken
    just before the round, or the round's faster decode where one beat it. This machine's bandwidth
    drifts over minutes (28-51 GB/s between runs), so a bound measured in the same round cancels most of
    the drift that a bound from other rounds or other precisions carries."""
    bounds = [max([probe, *(side_rates[r] for side_rates in rates.values())]) for r, probe in enumerate(probes)]
    return {side: [rate / bound for rate, bound in zip(side_rates, bounds, strict=True)]
            for side, side_rates in rates.items()}  # fmt: skip


def between_bandwidth_reads(
    threads: int, log: Path, measure: Callable[[], list[dict[str, Any]]]
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Run `measure` between two read-bandwidth measurements: (its rows, {"<how> (before|after)": B/s})."""
    say("measuring read bandwidth")
    before = read_bandwidth(threads, log)
    rows = measure()
    say("measuring read bandwidth again")
    after = read_bandwidth(threads, log)
    return rows, {f"{k} (before)": v for k, v in before.items()} | {f"{k} (after)": v for k, v in after.items()}


def report(
    render: Callable[[list[dict[str, Any]], float, dict[str, Any]], str],
    rows: list[dict[str, Any]],
    env: dict[str, Any],
    json_path: Path | None,
) -> None:
    """Print the tables against the best bandwidth measured; with `json_path`, every figure as JSON too.

    The probes run before and after the rounds, and this shared machine's bandwidth moves between them:
    a decode that read faster than every probe proves the probes low, so that decode's own rate is the
    bound then (and says so), and no row reads above 100%."""
    bandwidth = max(env["bandwidth_detail"].values())
    fastest = max(
        ((s["weight_bytes_read"] * s["decode_tps"], f"{r['shape']} {r['precision']} {side}")
         for r in rows for side, s in r["sides"].items() if s and s.get("decode_tps")),
        default=(0.0, ""),
    )  # fmt: skip
    if fastest[0] > bandwidth:
        env["bandwidth_note"] = (
            f"A decode read faster than every probe ({fastest[1]}: {fastest[0] / 1e9:.1f} GB/s against "
            f"{bandwidth / 1e9:.1f}); the % of read BW columns are against that rate."
        )
        bandwidth = fastest[0]
    print(render(rows, bandwidth, env))
    if json_path:
        json_path.write_text(json.dumps({"env": env, "bandwidth": bandwidth, "rows": rows}, indent=2) + "\n")


# (op, input index) pairs whose initializer is only gathered by row: an embedding table with its block
# scales / zero points, GroupQueryAttention's cos/sin caches.
_GATHERED = {
    ("Gather", 0),
    ("GatherBlockQuantized", 0),
    ("GatherBlockQuantized", 2),
    ("GatherBlockQuantized", 3),
    ("GroupQueryAttention", 7),
    ("GroupQueryAttention", 8),
}
_LAYOUT_OPS = {"Transpose", "Reshape", "Cast", "Identity", "Squeeze", "Unsqueeze"}


def weight_bytes_per_token(onnx_path: Path) -> dict[str, int]:
    """Initializer bytes one decode step reads, the same rule for any graph.

    An initializer counts in full when any node reads it as a whole; one that only reaches row gathers
    (directly or through layout ops such as onnxruntime-genai's Transpose of a tied LM head) is not
    read per token: the embedding table, GroupQueryAttention's cos/sin caches.
    """
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            consumers[name].append((node, i))

    def only_gathered(name: str) -> bool:
        for node, i in consumers[name]:
            if (node.op_type, i) in _GATHERED:
                continue
            if node.op_type in _LAYOUT_OPS and i == 0 and all(only_gathered(o) for o in node.output):
                continue
            return False
        return bool(consumers[name])

    read = gathered = 0
    for t in model.graph.initializer:
        n = int(np.prod(t.dims))
        if t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
            size = (n + 1) // 2
        else:
            size = n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        if only_gathered(t.name):
            gathered += size
        else:
            read += size
    return {"read": read, "gathered": gathered}


def default_kernel() -> str:
    """Our kernels for quantized bundles: edge-runtime's ops where their library runs here, else MLAS's."""
    from edge_runtime import kernels

    return "edge" if kernels.available() else "mlas"


def ours_dir(work: Path, precision: str, kernel: str, kv: str = "fp32") -> Path:
    name = f"ours-{precision}" + ("-edge" if kernel == "edge" and precision != "fp32" else "")
    return work / (name + ("" if kv == "fp32" else f"-kv{kv}"))


def kv_problem(precision: str, kernel: str, kv: str) -> str | None:
    """Why our bundle cannot keep its KV cache as `kv` (edge-export's own rule), or None."""
    if kv != "fp32" and (precision == "fp32" or kernel != "edge"):
        return f"--kv-dtype {kv} needs --kernel edge with a quantized model: skipping {precision} ({kernel})"
    return None


def ours_build_cmd(
    ckpt: Path, out: Path, precision: str, block: int, kernel: str = "mlas", kv: str = "fp32"
) -> list[str]:
    cli = Path(sys.executable).with_name("edge-export")
    cmd = [str(cli), "build", str(ckpt), "-o", str(out), "--overwrite"]
    if precision != "fp32":  # int8 with --kernel edge: MatMulQ8 products, SiluMul and LinearAttention
        cmd += ["--quant", precision, "--kernel", kernel]
    if precision == "int4":  # the builder stores the tied embedding / LM head in INT4 blocks too
        cmd += ["--block", str(block), "--table-bits", "4"]
    # the cache named on every build: edge-export's own default is fp16 on the edge kernels, fp32 elsewhere, so an
    # unnamed one would run fp16 under this script's fp32 label
    cmd += ["--kv-dtype", kv]
    return cmd


def theirs_build_cmd(ckpt: Path, out: Path, precision: str, block: int, cache: Path) -> list[str]:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ckpt), "-o", str(out)]
    cmd += ["-p", precision, "-e", "cpu", "-c", str(cache)]
    if precision != "fp32":  # both are the builder's CPU defaults, spelled out
        cmd += ["--extra_options", f"block_size={block}", "accuracy_level=4"]
    return cmd


def build(side: str, cmd: list[str], out: Path, marker: str, rebuild: bool, log: Path) -> dict[str, Any]:
    """Build into `out` unless a finished build is there; its record (time, peak RSS) is kept beside it."""
    record = out.with_name(out.name + ".build.json")
    if (out / marker).is_file() and record.is_file() and not rebuild:
        return {**json.loads(record.read_text()), "cached": True}
    if side == "theirs" and out.exists():
        shutil.rmtree(out)
    with log.open("a") as f:
        f.write(f"\n$ {shlex.join(cmd)}\n")
    rc, wall, rss, _ = run_child(cmd, log)
    result = {"ok": rc == 0 and (out / marker).is_file(), "seconds": wall, "peak_rss": rss, "rc": rc}
    if result["ok"]:
        record.write_text(json.dumps(result) + "\n")
    return {**result, "cached": False}


def make_prompt(ckpt: Path, n: int) -> list[int]:
    """Exactly n ids: edge-bench's fixed passage, cycled (BOS first, EOS never)."""
    from edge_runtime.bench.runner import deterministic_prompt
    from edge_runtime.manifest import TokenizerSpec
    from edge_runtime.tokenizer import Tokenizer

    cfg = json.loads((ckpt / "config.json").read_text())
    spec = TokenizerSpec(
        file="tokenizer.json",
        bos_token_id=cfg["bos_token_id"],
        eos_token_ids=[cfg["eos_token_id"]],
        pad_token_id=cfg.get("pad_token_id"),
        adds_bos=False,
    )
    return deterministic_prompt(Tokenizer(ckpt / "tokenizer.json", spec), n, [cfg["eos_token_id"]])


def ensure_checkpoint(shapes_dir: Path, shape: str) -> Path:
    path = shapes_dir / shape
    if not (path / "model.safetensors").is_file():
        script = HERE / "make_shape_checkpoints.py"  # a sibling script: run it, no sys.path games
        rc = subprocess.call([sys.executable, str(script), "--out", str(shapes_dir), "--shape", shape])
        if rc != 0:
            raise SystemExit(f"writing the {shape} checkpoint failed (exit {rc})")
    return path


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# Driver.


def bench_pair(
    args: argparse.Namespace, shape: str, precision: str, kv: str, ckpt: Path, prompt_file: Path, log: Path
) -> dict[str, Any]:
    work = args.work / shape
    dirs = {"ours": ours_dir(work, precision, args.our_kernel, kv), "theirs": work / f"genai-{precision}"}
    cmds = {
        "ours": ours_build_cmd(ckpt, dirs["ours"], precision, args.block, args.our_kernel, kv),
        "theirs": theirs_build_cmd(ckpt, dirs["theirs"], precision, args.block, args.work / ".genai-cache"),
    }
    depth = len(json.loads(prompt_file.read_text()))  # decode runs after the whole prompt: its context depth
    row: dict[str, Any] = {"shape": shape, "precision": precision, "kv": kv, "depth": depth, "builds": {},
                           "sides": {}}  # fmt: skip
    for side, marker in (("ours", "manifest.json"), ("theirs", "genai_config.json")):
        say(f"{shape} {precision} (our KV {kv}, depth {depth}): building {side}")
        row["builds"][side] = build(side, cmds[side], dirs[side], marker, args.rebuild, log)
        if not row["builds"][side]["ok"]:
            say(f"  {side} build failed (exit {row['builds'][side].get('rc')}); see {log}")
    if not all(b["ok"] for b in row["builds"].values()):
        return row
    bytes_ = {side: weight_bytes_per_token(d / "model.onnx") for side, d in dirs.items()}
    manifest = json.loads((dirs["ours"] / "manifest.json").read_text())
    row["manifest_weight_bytes"] = manifest["graph"]["weight_bytes"]
    row["export_seconds_manifest"] = manifest["provenance"].get("export_seconds")
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "theirs": []}
    probes = []
    for r in range(args.rounds):
        probes.append(round_probe(args.threads, log))
        order = ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")
        for side in order:
            cmd = [sys.executable, str(WORKER), "worker", side, str(dirs[side])]
            cmd += ["--prompt-file", str(prompt_file), "--gen-tokens", str(args.gen_tokens)]
            cmd += ["--threads", str(args.threads), "--warmup", str(args.warmup), "--trials", str(args.trials)]
            cmd += ["--window", args.our_window]
            rc, _, rss, out = run_child(cmd, log)
            if rc != 0:
                raise SystemExit(f"{side} worker failed (exit {rc}) on {dirs[side]}; see {log}")
            result = json.loads(out.strip().splitlines()[-1])
            result["peak_rss"] = rss
            if any(t["generated"] != args.gen_tokens for t in result["trials"]):
                raise SystemExit(f"{side} generated {[t['generated'] for t in result['trials']]} tokens, not all "
                                 f"{args.gen_tokens}; the figures would not compare")  # fmt: skip
            runs[side].append(result)
            tps = [t["decode_tps"] for t in result["trials"]]
            say(f"  round {r + 1}/{args.rounds} {side}: decode {', '.join(f'{x:.1f}' for x in tps)} tok/s, "
                f"peak RSS {rss / MB:.0f} MB (probe {probes[-1] / 1e9:.1f} GB/s)")  # fmt: skip
    rates = {side: [bytes_[side]["read"] * median([t["decode_tps"] for t in res["trials"]]) for res in results]
             for side, results in runs.items()}  # fmt: skip
    shares = round_shares(probes, rates)
    row["round_probes"] = probes
    for side, results in runs.items():
        trials = [t for res in results for t in res["trials"]]
        ttft = median([t["ttft_s"] for t in trials])
        row["sides"][side] = {
            "ttft_ms": ttft * 1e3 if ttft is not None else None,
            "prefill_tps": len(json.loads(prompt_file.read_text())) / ttft if ttft else None,
            "decode_tps": median([t["decode_tps"] for t in trials]),
            "decode_tps_all": [round(t["decode_tps"], 2) for t in trials],
            "peak_rss": median([res["peak_rss"] for res in results]),
            "load_s": median([res["load_s"] for res in results]),
            "outside_run_share": median([t["outside_run_share"] for t in trials]),
            "weight_bytes_read": bytes_[side]["read"],
            "weight_bytes_gathered": bytes_[side]["gathered"],
            "capacity": results[0]["capacity"],
            "kv_bytes": results[0].get("kv_bytes"),
            "samples": len(trials),
            "round_bw_shares": shares[side],
        }
    return row


def round_share_cell(shares: list[float] | None) -> str:
    """'median% (each round's %)' of round_shares' figures."""
    if not shares:
        return "n/a"
    return f"{100 * median(shares):.0f}% ({', '.join(f'{100 * x:.0f}' for x in shares)})"


def tables(rows: list[dict[str, Any]], bandwidth: float, env: dict[str, Any]) -> str:
    out = [
        f"Machine: {env['cpu']} ({env['cores']} cores; {env['cpu_features']}; edge kernels {env['edge_kernels']}), "
        f"load average {env['load_before']} before / "
        f"{env['load_after']} after; onnxruntime {env['onnxruntime']}, onnxruntime-genai {env['onnxruntime_genai']}; "
        f"prompt (the context depth decode runs at) {env['prompt_tokens']} tokens, {env['gen_tokens']} generated, "
        f"greedy, {env['threads']} threads; our ring capacity: {env['our_window']}. KV cache: ours the pool's K/V "
        "arrays; theirs computed from its graph (past_key_values dtype x max_length, as genai allocates it).",
        f"Measured read bandwidth ({env['threads']} threads, best case): {bandwidth / 1e9:.1f} GB/s "
        f"({'; '.join(f'{k} {v / 1e9:.1f}' for k, v in env['bandwidth_detail'].items())} GB/s)."
        + (f" {env['bandwidth_note']}" if "bandwidth_note" in env else ""),
        "",
        "| shape | precision | depth | our KV | ours / theirs: TTFT | decode tok/s | peak RSS | KV cache "
        "| weights read per token |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        head = f"| {r['shape']} | {r['precision']} | {r['depth']} | {r['kv']} |"
        if len(r["sides"]) < 2:
            failed = ", ".join(s for s, b in r["builds"].items() if not b["ok"])
            out.append(f"{head} build failed: {failed} | | | | |")
            continue
        o, t = r["sides"]["ours"], r["sides"]["theirs"]
        out.append(
            f"{head} {_ratio(o['ttft_ms'], t['ttft_ms'])} | "
            f"{_ratio(o['decode_tps'], t['decode_tps'])} | {_ratio(o['peak_rss'], t['peak_rss'])} | "
            f"{_ratio(o.get('kv_bytes'), t.get('kv_bytes'))} | "
            f"{_ratio(o['weight_bytes_read'], t['weight_bytes_read'])} |"
        )
    out += [
        "",
        "| shape | precision | depth | side | TTFT ms | prefill tok/s | decode tok/s | peak RSS MB | KV cache MB "
        "| weights read/token MB | achieved GB/s | % of read BW | % of round's BW | decode time outside run | load s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        for side, label in (("ours", f"edge-runtime (KV {r['kv']})"), ("theirs", "onnxruntime-genai")):
            s = r["sides"].get(side)
            if s is None:
                continue
            tps, share = s["decode_tps"], s["outside_run_share"]
            achieved = s["weight_bytes_read"] * tps if tps else None
            kv_bytes = s.get("kv_bytes")
            cells = [
                r["shape"],
                r["precision"],
                str(r["depth"]),
                label,
                _fmt(s["ttft_ms"], ".0f"),
                _fmt(s["prefill_tps"], ".0f"),
                _fmt(tps, ".1f"),
                f"{s['peak_rss'] / MB:.0f}",
                _fmt(None if kv_bytes is None else kv_bytes / MB, ".1f"),
                f"{s['weight_bytes_read'] / MB:.1f}",
                _fmt(None if achieved is None else achieved / 1e9, ".2f"),
                _fmt(None if achieved is None else 100 * achieved / bandwidth, ".0f") + "%",
                round_share_cell(s.get("round_bw_shares")),
                "n/a" if share is None else f"{100 * share:.1f}%",
                _fmt(s["load_s"], ".2f"),
            ]
            out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        "| shape | precision | side | build s | build peak RSS MB | note |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    listed = set()
    for r in rows:
        for side, b in r["builds"].items():
            label = f"ours (KV {r['kv']})" if side == "ours" else side
            if (r["shape"], r["precision"], label) in listed:  # the same bundle at another depth
                continue
            listed.add((r["shape"], r["precision"], label))
            note = "built by an earlier run" if b["cached"] else ("" if b["ok"] else f"failed (exit {b.get('rc')})")
            if side == "ours" and r.get("export_seconds_manifest") is not None:
                note = (note + "; " if note else "") + f"manifest export_seconds {r['export_seconds_manifest']}"
            rss = b["peak_rss"]
            out.append(
                f"| {r['shape']} | {r['precision']} | {label} | {_fmt(b['seconds'], '.1f')} | "
                f"{_fmt(rss and rss / MB, '.0f')} | {note} |"
            )
    return "\n".join(out)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def machine_env() -> dict[str, Any]:
    """What every table's header says about the machine (the load average again at the end)."""
    from edge_runtime import kernels
    from edge_runtime.bench.environment import cpu_features

    return {
        "cpu": cpu_name(),
        "cpu_features": ", ".join(cpu_features()) or "unknown",
        "edge_kernels": kernels.isa() or "not available",
        "cores": os.cpu_count(),
        "load_before": load_average(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", choices=(*DEFAULT_SHAPES, "tiny"), help="[both real shapes]")
    ap.add_argument("--skip-1b", action="store_true", help=f"drop {ONE_B} (slow to export, needs GBs of disk/RAM)")
    ap.add_argument("--precision", action="append", choices=PRECISIONS, help="[fp32, int8, int4]")
    ap.add_argument("--block", type=int, default=32, help="int4 block size on both sides [32]")
    ap.add_argument("--our-kernel", choices=("edge", "mlas"), help="our kernels [edge where they run here]")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds, one process per side each [3]")
    ap.add_argument("--warmup", type=int, default=1, help="untimed generations per process [1]")
    ap.add_argument("--trials", type=int, default=2, help="timed generations per process [2]")
    ap.add_argument("--prompt-tokens", type=int, action="append",
                    help="prompt length, so the context depth decode is measured at; repeat for rows at several "
                    "depths (2000: the long-context row) [128]")  # fmt: skip
    ap.add_argument("--kv-dtype", action="append", choices=KV_DTYPES,
                    help="our KV cache (edge-export --kv-dtype; fp16/q8 need --our-kernel edge and int8/int4); "
                    "repeat for one row each [fp32]")  # fmt: skip
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--our-window", default="match", help="match (ring = prompt + generated), bundle, or N [match]")
    ap.add_argument("--shapes-dir", type=Path, default=Path("/tmp/edge-shapes"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/edge-vs-genai"), help="bundles and logs")
    ap.add_argument("--rebuild", action="store_true", help="rebuild bundles that exist from an earlier run")
    ap.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    args = ap.parse_args(argv)
    args.our_kernel = args.our_kernel or default_kernel()
    args.prompt_tokens = args.prompt_tokens or [128]
    kvs = args.kv_dtype or ["fp32"]
    shapes = [s for s in (args.shape or DEFAULT_SHAPES) if not (args.skip_1b and s == ONE_B)]
    precisions = args.precision or list(PRECISIONS)
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "bench.log"
    say(f"build and worker output goes to {log}")

    import onnxruntime
    import onnxruntime_genai

    env: dict[str, Any] = {
        **machine_env(),
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_genai": onnxruntime_genai.__version__,
        "prompt_tokens": ", ".join(map(str, args.prompt_tokens)),
        "gen_tokens": args.gen_tokens,
        "threads": args.threads,
        "our_window": "request-sized (prompt + generated)" if args.our_window == "match" else args.our_window,
    }

    def measure() -> list[dict[str, Any]]:
        rows = []
        for shape in shapes:
            ckpt = ensure_checkpoint(args.shapes_dir, shape)
            for depth in args.prompt_tokens:
                prompt_file = args.work / f"{shape}-prompt-{depth}.json"
                prompt_file.write_text(json.dumps(make_prompt(ckpt, depth)))
                for p in precisions:
                    for kv in kvs:
                        if problem := kv_problem(p, args.our_kernel, kv):
                            say(problem)
                            continue
                        rows.append(bench_pair(args, shape, p, kv, ckpt, prompt_file, log))
        return rows

    rows, env["bandwidth_detail"] = between_bandwidth_reads(args.threads, log, measure)
    env["load_after"] = load_average()
    report(tables, rows, env, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
