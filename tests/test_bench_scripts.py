"""The llama.cpp comparison reads llama-bench's JSON the way the benchmark pages' figures need it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

# `llama-bench -p 16 -n 8 -d 0,16 -t 2 -r 1 -o json` on the 135M shape (Q4_0), trimmed to the fields read.
SAMPLE = [
    {"n_prompt": 16, "n_gen": 0, "n_depth": 0, "avg_ts": 520.993278, "samples_ts": [520.993]},
    {"n_prompt": 0, "n_gen": 8, "n_depth": 0, "avg_ts": 161.628194, "samples_ts": [161.628]},
    {"n_prompt": 16, "n_gen": 0, "n_depth": 16, "avg_ts": 547.24973, "samples_ts": [547.25]},
    {"n_prompt": 0, "n_gen": 8, "n_depth": 16, "avg_ts": 181.030555, "samples_ts": [181.031]},
]


@pytest.fixture
def llamacpp_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the script imports its sibling, as when run directly
    import bench_vs_llamacpp

    return bench_vs_llamacpp


def test_prefill_at_depth_zero_and_decode_after_the_prompt(llamacpp_bench):
    got = llamacpp_bench.parse_llama_bench([json.dumps(SAMPLE)], prompt=16, gen=8)
    assert got == {"prefill_tps": 520.993278, "decode_tps": 181.030555, "decode_samples": [181.031],
                   "cache": "?/?", "flash_attn": None}  # fmt: skip


def test_the_two_runs_are_read_together(llamacpp_bench):
    # The script's own split: `-p 16 -n 0` and `-p 0 -n 8 -d 16`, one JSON list each.
    deep = {**SAMPLE[3], "type_k": "q8_0", "type_v": "q8_0", "flash_attn": 1}
    got = llamacpp_bench.parse_llama_bench([json.dumps(SAMPLE[:1]), json.dumps([deep])], prompt=16, gen=8)
    assert (got["prefill_tps"], got["decode_tps"], got["cache"], got["flash_attn"]) == (520.993278, 181.030555,
                                                                                        "q8_0/q8_0", 1)  # fmt: skip


def test_missing_test_is_an_error_not_a_wrong_number(llamacpp_bench):
    without_deep_decode = [t for t in SAMPLE if not (t["n_gen"] and t["n_depth"])]
    with pytest.raises(SystemExit, match="tg8@d16"):
        llamacpp_bench.parse_llama_bench([json.dumps(without_deep_decode)], prompt=16, gen=8)


def test_kv_cache_size_comes_from_llama_cpp_own_line(llamacpp_bench):
    # src/llama-kv-cache.cpp's format, as llama-bench -v prints it.
    line = ("llama_kv_cache: size =   34.00 MiB (  2048 cells,  30 layers,  1/1 seqs), K (q8_0):   17.00 MiB, "
            "V (q8_0):   17.00 MiB")  # fmt: skip
    assert llamacpp_bench.llama_kv_bytes(["load_tensors: ...", line]) == (34 * 2**20, 2048)
    assert llamacpp_bench.llama_kv_bytes(["no cache line"]) is None
    # one context of a model with sliding-window layers (Gemma 3): its global cache, then its window layers' one;
    # the next context's lines are not counted
    tail = "1/1 seqs), K (f16):    3.38 MiB, V (f16):    3.38 MiB"
    gemma = [
        "llama_kv_cache_iswa: creating non-SWA KV cache, size = 2304 cells",
        f"llama_kv_cache: size =    6.75 MiB (  2304 cells,   3 layers,  {tail}",
        "llama_kv_cache_iswa: creating     SWA KV cache, size = 1024 cells",
        f"llama_kv_cache: size =   15.00 MiB (  1024 cells,  15 layers,  {tail}",
        "llama_kv_cache_iswa: creating non-SWA KV cache, size = 2304 cells",
        f"llama_kv_cache: size =    6.75 MiB (  2304 cells,   3 layers,  {tail}",
    ]
    assert llamacpp_bench.llama_kv_bytes(gemma) == (round(21.75 * 2**20), 2304)
    assert llamacpp_bench.llama_kv_bytes([line, line]) == (34 * 2**20, 2048)  # two contexts: the first


def test_kv_dtype_picks_llama_cpp_cache_flags(llamacpp_bench, tmp_path):
    class Args:
        threads, llama_reps, gen_tokens = 2, 3, 128

    lc = object.__new__(llamacpp_bench.LlamaCpp)  # no build needed to compose the commands
    lc.bench = tmp_path / "llama-bench"
    pp, tg = lc.bench_cmds(tmp_path / "m.gguf", Args(), 2000, "q8")
    assert pp[pp.index("-p") + 1] == "2000" and pp[pp.index("-n") + 1] == "0" and "-d" not in pp
    assert tg[tg.index("-d") + 1] == "2000" and tg[tg.index("-n") + 1] == "128" and "-v" in tg
    assert tg[tg.index("-ctk") + 1] == tg[tg.index("-ctv") + 1] == "q8_0"
    assert "-ctk" not in lc.bench_cmds(tmp_path / "m.gguf", Args(), 128, "fp32")[1]  # its default f16


def test_our_build_names_the_cache_it_is_labelled_with(llamacpp_bench, tmp_path):
    """edge-export's own default cache is fp16 on the edge kernels: a row labelled fp32 must ask for fp32."""
    from bench_vs_ortgenai import ours_build_cmd

    for precision, kernel in (("int4", "edge"), ("int8", "edge"), ("int4", "mlas"), ("fp32", "mlas")):
        for kv in ("fp32", "fp16"):
            cmd = ours_build_cmd(tmp_path / "ckpt", tmp_path / "out", precision, 32, kernel, kv)
            assert cmd[cmd.index("--kv-dtype") + 1] == kv, cmd
