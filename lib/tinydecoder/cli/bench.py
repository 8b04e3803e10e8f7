"""`python -m tinydecoder bench`: this machine's roofs and the model's prefill/decode speed
(with --tensor-parallel N: the decode step on N MPI ranks, see cli/parallel.py)."""
from __future__ import annotations

import json

from .args import add_model_argument, load_bench_model, positive_int_arg

MALLOC_NOTE = "malloc keeps freed memory for reuse (this process only; perf.machine.keep_freed_memory)"


def add_parser(subparsers) -> None:
    from .parallel import add_parallel_arguments

    bench = subparsers.add_parser("bench", help="measure this machine's roofs and the model's prefill/decode speed")
    add_model_argument(bench, "toy", "toy: the seed toy's shapes (seconds); smollm2: the real model (~1 minute)")
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
    result = run_bench(load_bench_model(args.model), repeat=args.repeat, path=args.path, prompts=prompts,
                       stop_tokens=stops)
    result["malloc_keeps_freed_memory"] = args.malloc_kept
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    if args.malloc_kept and not args.json:
        print(MALLOC_NOTE)
    return 0
