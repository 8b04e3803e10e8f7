"""Load test: N concurrent streaming clients against the tinydecoder server, on loopback.

    python tools/load_test.py --model smollm2 --clients 1 4 16 --max-tokens 16
    python tools/load_test.py --model toy --clients 16 --requests 64

It starts the server in this process (or uses --url), sends the same greedy requests first
one at a time (the baseline, --baseline requests) and then with N clients in flight, and
prints for each N: throughput in completion tokens per second against one at a time, TTFT and
TPOT p50/p99 as the clients saw them, the preemptions the server made (from /metrics), and the
KV blocks still held once every request has ended (blocks leaked: must be 0, else exit 1).
Counts and the whole run's time are bounded (--requests, --timeout). Timings depend on the
machine and on what else runs on it; quote them with that said."""
from __future__ import annotations

import argparse
import json
import sys
import time

import httpx

from tinydecoder.server import parse_metrics, start_server
from tinydecoder.server.load import run_clients, summarize

TOPICS = ("the moon", "bread", "rivers", "chess", "owls", "glass", "tea", "bicycles", "volcanoes", "maps",
          "bees", "clocks", "snow", "paper", "salt", "bridges")


def jobs_for(model: str, n: int, max_tokens: int) -> list:
    if model == "toy":
        return [(" ".join(str((i * 7 + k) % 6) for k in range(4 + i % 9)), max_tokens) for i in range(n)]
    return [(f"Write one sentence about {TOPICS[i % len(TOPICS)]}" + "." * (1 + i // len(TOPICS)), max_tokens)
            for i in range(n)]


def metrics(url: str) -> dict:
    return parse_metrics(httpx.get(url + "/metrics", timeout=30).text)


def run(url, model, jobs, clients, timeout) -> dict:
    before = metrics(url)
    timelines = run_clients(url, model, jobs, clients, chat=model != "toy", timeout=timeout)
    deadline = time.monotonic() + 30
    while True:  # the engine frees the last blocks between steps, just after the last event
        after = metrics(url)
        if after["tinydecoder_requests_running"] + after["tinydecoder_requests_waiting"] == 0:
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    out = summarize(timelines)
    out["clients"] = clients
    out["preemptions"] = int(after["tinydecoder_preemptions_total"] - before["tinydecoder_preemptions_total"])
    out["prefix_hit_tokens"] = int(after["tinydecoder_prefix_cache_hit_tokens_total"]
                                   - before["tinydecoder_prefix_cache_hit_tokens_total"])
    out["blocks_leaked"] = int(after["tinydecoder_kv_blocks_used"])
    out["texts"] = [t.text for t in timelines]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("toy", "smollm2"), default="toy")
    p.add_argument("--url", help="a running server (default: start one in this process)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16], help="concurrent clients, one run each")
    p.add_argument("--requests", type=int, help="requests per run (default: as many as clients)")
    p.add_argument("--baseline", type=int, default=2, help="requests sent one at a time for the baseline (2)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--kv-blocks", type=int, default=256)
    p.add_argument("--timeout", type=float, default=600.0, help="bound on each run, seconds (600)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    server = None if args.url else start_server(args.model, max_batch=args.max_batch, kv_blocks=args.kv_blocks)
    url = args.url or server.url
    try:
        base_jobs = jobs_for(args.model, args.baseline, args.max_tokens)
        baseline = run(url, args.model, base_jobs, 1, args.timeout)
        rows = []
        for n in args.clients:
            jobs = jobs_for(args.model, args.requests or n, args.max_tokens)
            r = run(url, args.model, jobs, n, args.timeout)
            r["speedup_vs_one_at_a_time"] = r["tokens_per_s"] / baseline["tokens_per_s"]
            k = min(len(jobs), len(base_jobs))  # the first jobs are the baseline's jobs
            r["same_texts_as_baseline"] = r["texts"][:k] == baseline["texts"][:k]
            rows.append(r)
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps({"baseline": {k: v for k, v in baseline.items() if k != "texts"},
                          "runs": [{k: v for k, v in r.items() if k != "texts"} for r in rows]}, indent=1))
    else:
        print(f"model {args.model}, max_tokens {args.max_tokens}; one at a time: {baseline['tokens_per_s']:.2f} tok/s "
              f"over {baseline['requests']} requests")
        print(f"{'clients':>7} {'reqs':>4} {'tok/s':>7} {'x one':>6} {'TTFT p50':>9} {'p99':>7} {'TPOT p50':>9} "
              f"{'p99':>7} {'preempt':>7} {'leaked':>6} {'same':>5}")
        for r in rows:
            print(f"{r['clients']:>7} {r['requests']:>4} {r['tokens_per_s']:>7.2f} {r['speedup_vs_one_at_a_time']:>6.2f} "
                  f"{r['ttft_p50_s']:>8.3f}s {r['ttft_p99_s']:>6.3f}s {r['tpot_p50_s']:>8.3f}s {r['tpot_p99_s']:>6.3f}s "
                  f"{r['preemptions']:>7} {r['blocks_leaked']:>6} {str(r['same_texts_as_baseline']):>5}")
    return 1 if any(r["blocks_leaked"] for r in rows + [baseline]) else 0


if __name__ == "__main__":
    sys.exit(main())
