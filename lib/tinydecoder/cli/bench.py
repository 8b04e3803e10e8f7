"""`python -m tinydecoder bench`: this machine's roofs and the model's prefill/decode speed
(with --tensor-parallel N: the decode step on N MPI ranks, see cli/parallel.py)."""
from __future__ import annotations

import json

from .args import add_model_argument, add_weights_argument, load_bench_model, positive_int_arg

MALLOC_NOTE = "malloc keeps freed memory for reuse (this process only; perf.machine.keep_freed_memory)"


def add_parser(subparsers) -> None:
    from .parallel import add_parallel_arguments

    bench = subparsers.add_parser("bench", help="measure this machine's roofs and the model's prefill/decode speed")
    add_model_argument(bench, "toy", "toy: the seed toy's shapes (seconds); smollm2: the real model (~1 minute)")
    add_weights_argument(bench)  # --weights f32|q4_1: the model the main table measures
    bench.add_argument("--repeat", type=positive_int_arg, default=3,
                       help="timed repetitions (default 3; pass costs, speculative runs and batch steps at least 9): roofs "
                            "take the best, speeds the median; on a busy machine compare with OPENBLAS_NUM_THREADS=1")
    bench.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    bench.add_argument("--path", choices=("fast", "reference"), default="fast",
                       help="which forward is timed: the fast path (default) or the reference forward")
    add_parallel_arguments(bench)  # --tensor-parallel N, --timeout


def run(args) -> int:
    if args.tensor_parallel is not None:
        from .parallel import run_bench

        return run_bench(args)
    from ..perf.bench import format_report, run_bench

    prompts, stops = None, ()
    if args.model == "smollm2" and args.path == "fast":  # speculative decoding needs text: notebook 15's prompts
        from ..checkpoint.registry import open_tokenizer, stop_tokens_of
        from ..perf.bench_rows import speculative_prompts

        prompts, stops = speculative_prompts(open_tokenizer("smollm2")), stop_tokens_of("smollm2")[:1]  # <|im_end|>
    from ..checkpoint.registry import check_weights

    weights = check_weights(args.model, args.weights)
    load_before = machine_load()
    model = load_bench_model(args.model, weights)
    result = run_bench(model, repeat=args.repeat, path=args.path, prompts=prompts, stop_tokens=stops)
    result["malloc_keeps_freed_memory"] = args.malloc_kept
    result["weights_choice"] = weights
    result["weights"] = weights_section(args, model, weights, result) if args.path == "fast" else None
    result["load_average"] = {"before": load_before, "after": machine_load()}  # 1-minute: others' jobs move the numbers
    lines = format_report(result)
    if result["weights"]:
        from ..perf.weights_bench import format_weights

        lines = "\n".join([lines] + format_weights(result["weights"]))
    print(json.dumps(result, indent=2) if args.json else lines)
    if args.malloc_kept and not args.json:
        print(MALLOC_NOTE)
    return 0


def weights_section(args, model, weights: str, result: dict) -> dict:
    """bench's "weights": SmolLM2 as q4_1 and as f32, measured in turn (perf.weights_bench; the
    toy: f32 only); its target joins result["targets"]."""
    from ..perf.weights_bench import compare_weights, weights_targets

    names = ("q4_1", "f32") if args.model == "smollm2" else ("f32",)
    models = {name: model if name == weights else load_bench_model(args.model, name) for name in names}
    roof = result.get("fma_gflops") or result["matmul_gflops"]  # the compute roof, as bench's batch table uses
    section = compare_weights(models, rounds=max(3, args.repeat), bandwidth_gbps=result["bandwidth_gbps"],
                              peak_gflops=roof)
    result["targets"].update(weights_targets(section))
    if "q4_1" in section:
        from ..checkpoint.registry import open_tokenizer

        section["q4_1"]["price"] = decode_price(models["q4_1"], models["f32"], open_tokenizer(args.model))
    return section


PRICE_TOKENS = 256  # of eval's shipped text: ~1 s of decode steps, beside the speed they price


def decode_price(quantized, model, tokenizer, tokens: int = PRICE_TOKENS) -> dict:
    """The speed-up's price beside it: the first `tokens` tokens of eval's shipped text fed to the
    `quantized` model one per forward (decode steps, the kernels whose speed bench reports) and
    scored against `model`'s prefill (lessons.quality): {"tokens", "perplexity",
    "reference_perplexity", "mean_kl"} (nats a token)."""
    import math

    from ..lessons.quality import score, shipped_text
    from ..lessons.quality_variants import Variant, build_runner, reference_runner

    ids = tokenizer.encode(shipped_text())[:tokens]
    run = build_runner(model, Variant(weights="q4_1", piece=1), quantized=quantized)
    result = score(run, ids, context=len(ids), stride=len(ids) // 2, reference=reference_runner(model))
    return {"tokens": len(ids), "perplexity": result.perplexity,
            "reference_perplexity": float(math.exp(result.reference_nll.mean())), "mean_kl": result.mean_kl}


def machine_load():
    """The 1-minute load average (None where the platform has none)."""
    import os

    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
