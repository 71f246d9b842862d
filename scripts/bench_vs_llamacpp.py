"""Side-by-side speed against llama.cpp (llama-bench) on random-weight checkpoints of real shapes.

    python scripts/bench_vs_llamacpp.py --llama-cpp DIR [--shape smollm2-135m | --checkpoint NAME=CKPT_DIR]
                                        [--precision int4 ...] [--rounds 3] [--pure] [--work /tmp/edge-vs-llamacpp]
    python scripts/bench_vs_llamacpp.py --llama-cpp DIR --gguf NAME=FILE.gguf ...   # the same file on both sides

With --gguf, both sides run that file: llama.cpp as it is, ours as `edge-export FILE --target nuc` exports it
(every Linear of an executed type kept in its GGUF blocks, MatMulGGUF); the prompt is edge-bench's passage
through the bundle's own tokenizer.

DIR is a llama.cpp source tree built for this CPU (`cmake -B build -DGGML_NATIVE=ON && cmake --build
build --target llama-bench llama-quantize`); its converter runs from the tree (`gguf-py`, `conversion/`)
and needs torch, transformers and sentencepiece in this environment. llama-cpp-python's sdist carries a
tree under `vendor/llama.cpp` when GitHub is out of reach.

For each shape and precision (fp32 / F32, int8 / Q8_0, int4 block 32 / Q4_0) it
  1. converts the checkpoint to an F32 GGUF once (`convert_hf_to_gguf.py`) and quantizes it with
     `llama-quantize` (its default mixture, which keeps a tied LM head at Q6_K under Q4_0; `--pure`
     quantizes every matrix to the named type),
  2. builds our bundle as scripts/bench_vs_ortgenai.py does (same flags, same work layout, reused),
  3. runs both alternately, `--rounds` times, each run a fresh process: ours through
     scripts/bench_worker.py (prompt of `--prompt-tokens` ids, `--gen-tokens` greedy tokens, request-sized
     ring); theirs through `llama-bench -p N -n 0` (prompt processing at depth 0, TTFT = N / pp rate) and
     `llama-bench -p 0 -n M -d N` (generation at depth N: decode after the prompt, as ours is measured),
     each `-t T -o json`; `--kv-dtype fp16|q8` builds our bundle with that cache and gives llama-bench
     `-ctk/-ctv f16|q8_0` (the script's default fp32 cache, named on every build, runs against its default
     f16; with --gguf the default is fp16, edge-export's own on the edge kernels); `--prompt-tokens 2000`
     is the long-context row (repeat the option for rows at several depths),
  4. reports medians, ratios ours / llama.cpp (of the medians, and the median of per-round ratios, which
     cancels slow drift of a shared machine), peak RSS of each process, weight bytes read per token
     (ours: as in bench_vs_ortgenai.py; GGUF: every tensor, except `token_embd` when a separate `output`
     exists), the KV cache's bytes (ours: the pool's K/V arrays; llama.cpp: its own `llama_kv_cache: size`
     lines, llama-bench -v, the global and sliding-window caches of one context summed), and the achieved
     fraction of the read bandwidth measured in the same run.

Caveats, printed with the tables: llama-bench samples random token ids and repeats each test
(`--llama-reps`, default 3) inside one process after a warm-up run, and its peak RSS covers all its
tests. The random-weight checkpoints' tokenizer is unknown to the converter's pre-tokenizer table, so
the converter is told "gpt-2": llama-bench never tokenizes, so this changes nothing measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

# A sibling script, importable because Python puts this script's folder first on the path.
from bench_vs_ortgenai import (
    MB,
    WORKER,
    _fmt,
    _ratio,
    between_bandwidth_reads,
    build,
    default_kernel,
    ensure_checkpoint,
    kv_problem,
    load_average,
    machine_env,
    make_prompt,
    ours_build_cmd,
    ours_dir,
    report,
    round_probe,
    round_share_cell,
    round_shares,
    run_child,
    say,
    weight_bytes_per_token,
)

PRECISIONS = {"fp32": "F32", "int8": "Q8_0", "int4": "Q4_0"}
# Our --kv-dtype and the llama.cpp cache type it runs against: our fp32 cache meets llama.cpp's default
# (f16), as every earlier table did; fp16 meets f16, and q8 (int8 codes, an fp32 scale per row of
# head_dim) meets q8_0 (int8 codes, an fp16 scale per 32).
KV_TYPES = {"fp32": None, "fp16": "f16", "q8": "q8_0"}
# llama.cpp's own account of its cache (src/llama-kv-cache.cpp, printed with llama-bench -v).
_KV_LINE = re.compile(r"llama_kv_cache: size = +([0-9.]+) MiB \( *(\d+) cells.*K \((\w+)\).*V \((\w+)\)")

# Runs llama.cpp's converter with the pre-tokenizer check answered (see the module docstring).
_CONVERT = (
    "import runpy, sys\n"
    "import conversion.base as base\n"
    "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)

# Tensor bytes of a GGUF file, by name, through the tree's own gguf-py.
_GGUF_BYTES = (
    "import json, sys\n"
    "from gguf import GGUFReader\n"
    "print(json.dumps({t.name: int(t.n_bytes) for t in GGUFReader(sys.argv[1]).tensors}))\n"
)


class LlamaCpp:
    def __init__(self, root: Path, build_dir: str):
        self.root = root
        self.bench = root / build_dir / "bin" / "llama-bench"
        self.quantize = root / build_dir / "bin" / "llama-quantize"
        self.convert = root / "convert_hf_to_gguf.py"
        for tool in (self.bench, self.quantize, self.convert):
            if not tool.is_file():
                raise SystemExit(f"{tool} not found: build llama.cpp first (see this script's docstring)")
        # the tree's gguf-py first, the caller's PYTHONPATH kept (sentencepiece may live there)
        paths = [str(root), str(root / "gguf-py"), *filter(None, [os.environ.get("PYTHONPATH")])]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}

    def _run(self, cmd: list[str], log: Path, what: str) -> None:
        with log.open("a") as f:
            f.write(f"\n$ {' '.join(cmd)}\n")
            f.flush()
            rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env)
        if rc != 0:
            raise SystemExit(f"{what} failed (exit {rc}); see {log}")

    def gguf(self, ckpt: Path, work: Path, precision: str, pure: bool, log: Path) -> Path:
        """The checkpoint as a GGUF of `precision`, converted / quantized once and reused."""
        f32 = work / "model-F32.gguf"
        qtype = PRECISIONS[precision]
        out = work / f"model-{qtype}{'-pure' if pure else ''}.gguf"
        if precision != "fp32" and out.is_file():  # reused without its F32 source (32 GB at 8B)
            return out
        if not f32.is_file():
            say(f"converting {ckpt.name} to {f32.name}")
            tmp = f32.with_suffix(".tmp")
            cmd = [sys.executable, "-c", _CONVERT, str(self.convert), str(ckpt), "--outtype", "f32"]
            self._run([*cmd, "--outfile", str(tmp)], log, "convert_hf_to_gguf.py")
            tmp.rename(f32)
        if precision == "fp32":
            return f32
        if not out.is_file():
            say(f"quantizing {f32.name} to {out.name}")
            tmp = out.with_suffix(".tmp")
            self._run([str(self.quantize), *(["--pure"] if pure else []), str(f32), str(tmp), qtype], log, "quantize")
            tmp.rename(out)
        return out

    def weight_bytes(self, gguf: Path) -> dict[str, int]:
        out = subprocess.run([sys.executable, "-c", _GGUF_BYTES, str(gguf)], env=self.env, capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        sizes = json.loads(out)
        gathered = sizes.get("token_embd.weight", 0) if "output.weight" in sizes else 0
        return {"read": sum(sizes.values()) - gathered, "gathered": gathered}

    def bench_cmds(self, gguf: Path, a: argparse.Namespace, prompt: int, kv: str) -> list[list[str]]:
        """Two llama-bench runs: the prompt at depth 0, then generation at depth `prompt` (-v: its cache's
        size line). One run of `-p P -n G -d 0,P` would also time pp P at depth P and tg G at depth 0,
        a cross product that costs seconds per run at P = 2000 and that nothing here reads."""
        common = ["-m", str(gguf), "-t", str(a.threads), "-r", str(a.llama_reps), "-o", "json"]
        if KV_TYPES[kv]:
            common += ["-ctk", KV_TYPES[kv], "-ctv", KV_TYPES[kv]]
        return [
            [str(self.bench), *common, "-p", str(prompt), "-n", "0"],
            [str(self.bench), *common, "-p", "0", "-n", str(a.gen_tokens), "-d", str(prompt), "-v"],
        ]


def parse_llama_bench(outs: list[str], prompt: int, gen: int) -> dict[str, Any]:
    """Prompt rate at depth 0 and generation rate at depth `prompt` from llama-bench's JSON."""
    tests = [t for out in outs for t in json.loads(out)]
    pp = [t for t in tests if t["n_prompt"] == prompt and t["n_gen"] == 0 and t.get("n_depth", 0) == 0]
    tg = [t for t in tests if t["n_gen"] == gen and t["n_prompt"] == 0 and t.get("n_depth", 0) == prompt]
    if len(pp) != 1 or len(tg) != 1:
        raise SystemExit(f"llama-bench output lacks pp{prompt}@d0 or tg{gen}@d{prompt}: {outs}"[:800])
    return {"prefill_tps": pp[0]["avg_ts"], "decode_tps": tg[0]["avg_ts"], "decode_samples": tg[0]["samples_ts"],
            "cache": f"{tg[0].get('type_k', '?')}/{tg[0].get('type_v', '?')}",
            "flash_attn": tg[0].get("flash_attn")}  # fmt: skip


def llama_kv_bytes(stderr: list[str]) -> tuple[int, int] | None:
    """(bytes, cells) of llama.cpp's first KV cache from its own log lines, or None where it printed none. A model
    with sliding-window layers (Gemma 3) logs two caches per context, its global layers' and then, after
    `llama_kv_cache_iswa: creating     SWA KV cache`, its window layers': their bytes are summed, the cells are the
    global one's."""
    found: tuple[int, int] | None = None
    swa = False
    for line in stderr:
        if found is not None and "llama_kv_cache_iswa: creating" in line and "SWA KV cache" in line:
            swa = "non-SWA" not in line
        elif m := _KV_LINE.search(line):
            size = round(float(m.group(1)) * 2**20)
            if found is None:
                found = size, int(m.group(2))
            elif swa:
                return found[0] + size, found[1]
            else:
                return found
    return found


def bundle_prompt(bundle: Path, n: int) -> list[int]:
    """Exactly n ids of edge-bench's fixed passage through a bundle's own tokenizer (BOS first, EOS never)."""
    from edge_runtime.bench.runner import deterministic_prompt
    from edge_runtime.bundle import open_bundle
    from edge_runtime.tokenizer import Tokenizer

    b = open_bundle(bundle)
    spec = b.manifest.tokenizer
    return deterministic_prompt(Tokenizer(b.tokenizer_file, spec), n, list(spec.eos_token_ids))


def bench_pair(
    a: argparse.Namespace,
    lc: LlamaCpp,
    shape: str,
    ckpt: Path | None,
    precision: str,
    kv: str,
    prompt: int,
    log: Path,
    gguf_file: Path | None = None,
) -> dict[str, Any]:
    work = a.work / shape
    work.mkdir(parents=True, exist_ok=True)
    prompt_file = work / f"prompt-{prompt}.json"
    if gguf_file is None:
        prompt_file.write_text(json.dumps(make_prompt(ckpt, prompt)))
        bundle = ours_dir(a.ours_work / shape, precision, a.our_kernel, kv)
        cmd = ours_build_cmd(ckpt, bundle, precision, a.block, a.our_kernel, kv)
    else:  # the file itself on both sides: ours keeps its blocks (the default for an edge-kernel target)
        # the cache named, always: a GGUF export's default (fp16) is not the other exports' (fp32)
        bundle = a.ours_work / shape / f"ours-gguf-kv{kv}"
        cli = Path(sys.executable).with_name("edge-export")
        cmd = [str(cli), "build", str(gguf_file), "-o", str(bundle), "--overwrite", "--target", "nuc"]
        cmd += ["--kv-dtype", kv]
    say(f"{shape} {precision} (KV {kv}, depth {prompt}): building ours")
    built = build("ours", cmd, bundle, "manifest.json", False, log)
    if not built["ok"]:
        raise SystemExit(f"our build failed (exit {built.get('rc')}); see {log}")
    if gguf_file is not None:
        prompt_file.write_text(json.dumps(bundle_prompt(bundle, prompt)))
    gguf = gguf_file or lc.gguf(ckpt, work, precision, a.pure, log)
    row: dict[str, Any] = {"shape": shape, "precision": precision, "kv": kv, "depth": prompt, "gguf": gguf.name,
                           "sides": {}}  # fmt: skip
    bytes_ = {"ours": weight_bytes_per_token(bundle / "model.onnx"), "llama.cpp": lc.weight_bytes(gguf)}
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "llama.cpp": []}
    probes = []
    for r in range(a.rounds):
        probes.append(round_probe(a.threads, log))
        for side in ("ours", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "ours"):
            if side == "ours":
                cmd = [sys.executable, str(WORKER), "worker", "ours", str(bundle), "--prompt-file", str(prompt_file)]
                cmd += ["--gen-tokens", str(a.gen_tokens), "--threads", str(a.threads), "--warmup", "1"]
                cmd += ["--trials", "2", "--window", "match"]
                rc, _, rss, out = run_child(cmd, log)
                if rc != 0:
                    raise SystemExit(f"ours failed (exit {rc}); see {log}")
                res = json.loads(out.strip().splitlines()[-1])
                result = {
                    "prefill_tps": statistics.median(prompt / t["ttft_s"] for t in res["trials"]),
                    "decode_tps": statistics.median(t["decode_tps"] for t in res["trials"]),
                    "kv_bytes": res.get("kv_bytes"),
                    "kv_cells": res["capacity"],
                }
            else:
                outs, rss, stderr = [], 0, []
                for cmd in lc.bench_cmds(gguf, a, prompt, kv):
                    rc, _, one_rss, out = run_child(cmd, log, stderr)
                    if rc != 0:
                        raise SystemExit(f"llama-bench failed (exit {rc}); see {log}")
                    outs.append(out)
                    rss = max(rss, one_rss)
                result = parse_llama_bench(outs, prompt, a.gen_tokens)
                kv_size = llama_kv_bytes(stderr)
                result["kv_bytes"], result["kv_cells"] = kv_size or (None, None)
            result["peak_rss"] = rss
            runs[side].append(result)
            say(f"  round {r + 1}/{a.rounds} {side}: prefill {result['prefill_tps']:.0f} tok/s, decode "
                f"{result['decode_tps']:.1f} tok/s, peak RSS {rss / MB:.0f} MB "
                f"(probe {probes[-1] / 1e9:.1f} GB/s)")  # fmt: skip
    # Rounds run back to back, so a per-round ratio cancels most of this shared machine's drift.
    pairs = list(zip(runs["ours"], runs["llama.cpp"], strict=True))
    row["paired"] = {k: statistics.median(o[k] / t[k] for o, t in pairs) for k in ("prefill_tps", "decode_tps")}
    row["llama_cache"] = runs["llama.cpp"][0]["cache"]
    row["llama_flash_attn"] = runs["llama.cpp"][0]["flash_attn"]
    shares = round_shares(probes, {s: [bytes_[s]["read"] * r["decode_tps"] for r in res] for s, res in runs.items()})
    row["round_probes"] = probes
    for side, results in runs.items():
        pre = statistics.median(r["prefill_tps"] for r in results)
        row["sides"][side] = {
            "prefill_tps": pre,
            "ttft_ms": 1e3 * prompt / pre,
            "decode_tps": statistics.median(r["decode_tps"] for r in results),
            "decode_tps_all": [round(r["decode_tps"], 2) for r in results],
            "peak_rss": statistics.median(r["peak_rss"] for r in results),
            "weight_bytes_read": bytes_[side]["read"],
            "round_bw_shares": shares[side],
            "kv_bytes": results[0]["kv_bytes"],
            "kv_cells": results[0]["kv_cells"],
        }
    return row


def tables(rows: list[dict[str, Any]], bandwidth: float, env: dict[str, Any]) -> str:
    out = [
        f"Machine: {env['cpu']} ({env['cores']} cores; {env['cpu_features']}; edge kernels {env['edge_kernels']}), "
        f"load average {env['load_before']} before / "
        f"{env['load_after']} after; llama.cpp {env['llama_cpp']}; prompt (the context depth decode runs at) "
        f"{env['prompt_tokens']} tokens, {env['gen_tokens']} generated, {env['threads']} threads; llama.cpp "
        f"quantization: {env['quant_mix']}. KV cache: ours the pool's K/V arrays (ring sized to the request), "
        "llama.cpp's its own log line (llama-bench sizes its context to depth + generated).",
        f"Measured read bandwidth ({env['threads']} threads, best case): {bandwidth / 1e9:.1f} GB/s."
        + (f" {env['bandwidth_note']}" if "bandwidth_note" in env else ""),
        "",
        "| shape | precision (GGUF) | depth | KV: ours, llama.cpp | ours / llama.cpp: TTFT | decode tok/s "
        "| paired per round: TTFT, decode | peak RSS | KV cache | weights read per token |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        o, t = r["sides"]["ours"], r["sides"]["llama.cpp"]
        fa = {0: ", no FA", 1: ", FA"}.get(r.get("llama_flash_attn"), "")
        out.append(
            f"| {r['shape']} | {r['precision']} ({r['gguf']}) | {r['depth']} | {r['kv']}, {r['llama_cache']}{fa} | "
            f"{_ratio(o['ttft_ms'], t['ttft_ms'])} | "
            f"{_ratio(o['decode_tps'], t['decode_tps'])} | {1 / r['paired']['prefill_tps']:.2f}×, "
            f"{r['paired']['decode_tps']:.2f}× | {_ratio(o['peak_rss'], t['peak_rss'])} | "
            f"{_ratio(o['kv_bytes'], t['kv_bytes'])} | {_ratio(o['weight_bytes_read'], t['weight_bytes_read'])} |"
        )
    out += [
        "",
        "| shape | precision | depth | side (KV) | prefill tok/s | TTFT ms | decode tok/s (runs) | peak RSS MB "
        "| KV cache MB (cells) | weights read/token MB | % of read BW | % of round's BW |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        for side, s in r["sides"].items():
            achieved = s["weight_bytes_read"] * s["decode_tps"]
            runs = ", ".join(f"{x:.1f}" for x in s["decode_tps_all"])
            kv = r["kv"] if side == "ours" else r["llama_cache"]
            kv_mb = "n/a" if s["kv_bytes"] is None else f"{s['kv_bytes'] / MB:.1f} ({s['kv_cells']})"
            out.append(
                f"| {r['shape']} | {r['precision']} | {r['depth']} | {side} ({kv}) | {s['prefill_tps']:.0f} | "
                f"{s['ttft_ms']:.0f} | {s['decode_tps']:.1f} ({runs}) | {s['peak_rss'] / MB:.0f} | {kv_mb} | "
                f"{s['weight_bytes_read'] / MB:.1f} | {_fmt(100 * achieved / bandwidth, '.0f')}% | "
                f"{round_share_cell(s.get('round_bw_shares'))} |"
            )
    return "\n".join(out)


def llama_cpp_version(root: Path) -> str:
    try:
        head = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %cs"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        return f"commit {head}"
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"


def gguf_arg(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"expected NAME=FILE with FILE a .gguf, got {text!r}")
    return name, Path(path).resolve()


def checkpoint_arg(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"expected NAME=DIR with DIR a checkpoint directory, got {text!r}")
    return name, Path(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree, built")
    ap.add_argument("--build-dir", default="build", help="its CMake build folder, relative to it [build]")
    ap.add_argument("--shape", action="append", choices=("smollm2-135m", "llama-3.2-1b"), help="[smollm2-135m]")
    ap.add_argument("--checkpoint", action="append", type=checkpoint_arg, metavar="NAME=DIR",
                    help="a Hugging Face checkpoint directory (pretrained), NAME in the tables")  # fmt: skip
    ap.add_argument("--precision", action="append", choices=tuple(PRECISIONS), help="[fp32, int8, int4]")
    ap.add_argument("--gguf", action="append", type=gguf_arg, metavar="NAME=FILE",
                    help="run this GGUF on both sides (ours: its blocks kept); --shape/--checkpoint then optional")
    ap.add_argument("--pure", action="store_true", help="llama-quantize --pure: no Q6_K LM head under Q4_0")
    ap.add_argument("--block", type=int, default=32, help="our int4 block size (Q4_0's is 32) [32]")
    ap.add_argument("--our-kernel", choices=("edge", "mlas"), help="our kernels [edge where they run here]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-reps", type=int, default=3, help="llama-bench -r [3]")
    ap.add_argument("--prompt-tokens", type=int, action="append",
                    help="prompt length, so the context depth decode is measured at (llama-bench -d); repeat for "
                    "rows at several depths (2000: the long-context row) [128]")  # fmt: skip
    ap.add_argument("--kv-dtype", action="append", choices=tuple(KV_TYPES),
                    help="our KV cache (edge-export --kv-dtype) against llama.cpp's -ctk/-ctv: fp32 against its "
                    "default f16, fp16 against f16, q8 against q8_0; repeat for one row each [fp32; with --gguf "
                    "fp16, the export's default for a GGUF kept in its blocks]")  # fmt: skip
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes-dir", type=Path, default=Path("/tmp/edge-shapes"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/edge-vs-llamacpp"), help="GGUF files and the log")
    ap.add_argument("--ours-work", type=Path, default=Path("/tmp/edge-vs-genai"),
                    help="where our bundles are built (shared with bench_vs_ortgenai.py)")  # fmt: skip
    ap.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    a = ap.parse_args(argv)
    a.our_kernel = a.our_kernel or default_kernel()
    a.prompt_tokens = a.prompt_tokens or [128]
    kvs = a.kv_dtype or (["fp16"] if a.gguf else ["fp32"])
    lc = LlamaCpp(a.llama_cpp.resolve(), a.build_dir)
    a.work.mkdir(parents=True, exist_ok=True)
    log = a.work / "bench.log"
    say(f"conversion, build and worker output goes to {log}")
    env: dict[str, Any] = {
        **machine_env(),
        "llama_cpp": llama_cpp_version(lc.root),
        "prompt_tokens": ", ".join(map(str, a.prompt_tokens)),
        "gen_tokens": a.gen_tokens,
        "threads": a.threads,
        "quant_mix": "--pure (every matrix the named type)" if a.pure else "llama-quantize default mixture",
    }
    precisions = a.precision or list(PRECISIONS)
    models = [(s, None) for s in a.shape or ([] if a.checkpoint or a.gguf else ["smollm2-135m"])] + (a.checkpoint or [])

    def measure() -> list[dict[str, Any]]:
        rows = []
        for name, file in a.gguf or []:
            for depth in a.prompt_tokens:
                for kv in kvs:
                    rows.append(bench_pair(a, lc, name, None, "gguf", kv, depth, log, gguf_file=file))
        for name, ckpt in models:
            ckpt = ckpt or ensure_checkpoint(a.shapes_dir, name)
            for depth in a.prompt_tokens:
                for p in precisions:
                    for kv in kvs:
                        if problem := kv_problem(p, a.our_kernel, kv):
                            say(problem)
                            continue
                        rows.append(bench_pair(a, lc, name, ckpt, p, kv, depth, log))
        return rows

    rows, env["bandwidth_detail"] = between_bandwidth_reads(a.threads, log, measure)
    env["load_after"] = load_average()
    report(tables, rows, env, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
