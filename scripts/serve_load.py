"""A bounded load test of edge-serve on loopback (not run by CI).

    python scripts/serve_load.py --bundle BUNDLE [--clients 16 --requests 10 --max-tokens 32 --slots 4 --queue 8]
    python scripts/serve_load.py --base http://127.0.0.1:8080/v1     # a server already running

C streaming clients (threads, the official openai client, no retries) each hold one conversation of R turns,
resending the growing history as chat clients do. Every request must either finish (its stream ends with a
finish_reason, its usage adds up, its text decodes) or be refused with a 503; anything else is counted as
lost or corrupted. The server's RSS is polled from /metrics during the run and compared with its memory
budget (from /v1/models). Prints one JSON object: p50/p99 TTFT (client side: request sent -> first chunk),
total generated tokens per second of wall time, cached prompt share, 503s, RSS (its peak, and its median over the
first and the last ten polls: flat memory over the run). Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

from edge_runtime.bench.environment import cpu_model
from edge_runtime.serve.process import ServerProcess

TOPICS = [
    "the sea",
    "a lantern",
    "the harvest",
    "a clock",
    "the river",
    "an old map",
    "the wind",
    "a garden",
    "the moon",
    "a bridge",
    "the mountains",
    "a letter",
    "the forest",
    "a violin",
    "the desert",
    "a ship",
]


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(float(np.median(values)), 1) if values else None


def _rss_poller(metrics_url: str, stop: threading.Event, out: list[float]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    while not stop.wait(0.5):  # bounded by the run: stop is set when the clients are done
        try:
            text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
        except OSError:
            continue
        for fam in text_string_to_metric_families(text):
            if fam.name == "process_resident_memory_bytes":
                out.extend(s.value for s in fam.samples)


def _client(base: str, model: str, key: str, index: int, requests: int, max_tokens: int, results: list) -> None:
    import openai

    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=600)
    history = [{"role": "user", "content": f"Write one sentence about {TOPICS[index % len(TOPICS)]}."}]
    for turn in range(requests):
        t0 = time.perf_counter()
        rec = {"client": index, "turn": turn, "outcome": "lost"}
        try:
            stream = client.chat.completions.create(
                model=model,
                messages=history,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, reason, usage, first = [], None, None, None
            for chunk in stream:
                if first is None:
                    first = time.perf_counter() - t0
                if chunk.choices:
                    text.append(chunk.choices[0].delta.content or "")
                    reason = chunk.choices[0].finish_reason or reason
                if chunk.usage is not None:
                    usage = chunk.usage
                ext = (chunk.model_extra or {}).get("edge_runtime")
                if ext:
                    rec["prefill_ms"] = ext["timings"]["prefill_ms"]
                    rec["prefill_tokens"] = ext["timings"]["prefill_tokens"]
            reply = "".join(text)
            ok = reason in ("stop", "length") and usage is not None and usage.completion_tokens >= 1
            ok = ok and (reason == "stop" or usage.completion_tokens == max_tokens) and "\ufffd" not in reply
            rec.update(
                outcome="ok" if ok else "corrupted",
                ttft_s=first,
                total_s=time.perf_counter() - t0,
                tokens=usage.completion_tokens if usage else 0,
                prompt=usage.prompt_tokens if usage else 0,
                cached=usage.prompt_tokens_details.cached_tokens if usage else 0,
            )
            history += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "Go on, one more sentence."},
            ]
        except openai.APIStatusError as e:
            rec["outcome"] = "503" if e.status_code == 503 else f"http {e.status_code}"
        except openai.APIError as e:
            rec["outcome"] = f"error {type(e).__name__}"
        results.append(rec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, help="start edge-serve on this bundle (on a free loopback port)")
    ap.add_argument("--base", help="or use a running server: http://127.0.0.1:PORT/v1")
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--queue", type=int, default=8)
    ap.add_argument("--target", default="auto")
    ap.add_argument("--parallel", type=int, help="edge-serve --parallel [default: the target's]")
    args = ap.parse_args()
    server = None
    if args.bundle is not None:
        log = Path("/tmp") / f"serve_load_{int(time.time())}.log"
        extra = ("--parallel", str(args.parallel)) if args.parallel else ()
        server = ServerProcess(
            args.bundle,
            "--target",
            args.target,
            "--slots",
            str(args.slots),
            "--queue",
            str(args.queue),
            *extra,
            log=log,
        )
        base = server.base + "/v1"
    elif args.base:
        base = args.base.rstrip("/")
    else:
        ap.error("give --bundle or --base")
    host = urllib.parse.urlparse(base).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        ap.error(f"{base}: this load test only talks to loopback")
    try:
        info = json.load(urllib.request.urlopen(base + "/models", timeout=10))["data"][0]
        root = base[: -len("/v1")] if base.endswith("/v1") else base
        rss: list[float] = []
        stop = threading.Event()
        poller = threading.Thread(target=_rss_poller, args=(root + "/metrics", stop, rss), daemon=True)
        poller.start()
        results: list[dict] = []
        threads = [
            threading.Thread(
                target=_client, args=(base, info["id"], args.api_key, i, args.requests, args.max_tokens, results)
            )
            for i in range(args.clients)
        ]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        stop.set()
        poller.join(10)
    finally:
        if server is not None:
            server.stop()
    ok = [r for r in results if r["outcome"] == "ok"]
    ttft = np.array([r["ttft_s"] for r in ok]) * 1e3
    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    tokens = sum(r["tokens"] for r in ok)
    budget = info.get("memory_budget_bytes")
    report = {
        "cpu": cpu_model(),
        "model": info["id"],
        "server": {
            k: info.get(k)
            for k in ("target", "cache", "slots", "parallel", "memory_needed_bytes", "memory_budget_bytes")
        },
        "clients": args.clients,
        "requests_each": args.requests,
        "max_tokens": args.max_tokens,
        "queue": args.queue,
        "requests": len(results),
        "outcomes": outcomes,
        "lost_or_corrupted": len(results)
        - outcomes.get("ok", 0)
        - outcomes.get("503", 0)
        + (args.clients * args.requests - len(results)),
        "wall_s": round(wall, 2),
        "generated_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2),
        "ttft_ms": {"p50": round(float(np.percentile(ttft, 50)), 1), "p99": round(float(np.percentile(ttft, 99)), 1)}
        if ok
        else None,
        "cached_prompt_share": round(sum(r["cached"] for r in ok) / max(1, sum(r["prompt"] for r in ok)), 3),
        # Server side, queue wait excluded: slot switch + prefill of what the ring did not hold + first token.
        "prefill_ms_p50": {
            "cold": _median([r.get("prefill_ms") for r in ok if r["cached"] == 0]),
            "resent": _median([r.get("prefill_ms") for r in ok if r["cached"] > 0]),
        },
        "prefill_tokens_p50": {
            "cold": _median([r.get("prefill_tokens") for r in ok if r["cached"] == 0]),
            "resent": _median([r.get("prefill_tokens") for r in ok if r["cached"] > 0]),
        },
        "rss_max_mib": round(max(rss) / 2**20, 1) if rss else None,
        # flat memory: the median of the first and of the last ten polls (every 0.5 s)
        "rss_first_mib": round(float(np.median(rss[:10])) / 2**20, 1) if rss else None,
        "rss_last_mib": round(float(np.median(rss[-10:])) / 2**20, 1) if rss else None,
        "rss_within_budget": (max(rss) <= budget) if rss and budget else None,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
