"""Command line: `python -m tinydecoder seed|generate|bench|verify|serve|grade|eval ...`.

One module per command, each with `add_parser(subparsers)` and `run(args) -> int`; `main`
parses the arguments and runs the command named (one dispatch, here). Which model a command
runs ("toy" or "smollm2") is chosen in checkpoint.registry.

    seed       cli/seed.py       the worked example's toy decoder with and without a KV cache
    generate   cli/generate.py   text (or toy ids); --beams, --speculative, --tensor-parallel,
                                 --json-schema/--regex/--lark (cli/beams.py, speculative.py,
                                 parallel.py, grammar.py)
    bench      cli/bench.py      the machine's roofs and the model's speed
    verify     cli/verify.py     a weight cache against its recorded sha256
    serve      cli/serve.py      the OpenAI-compatible HTTP server
    grade      cli/grade.py      run notebooks headless and grade their exercises
    eval       cli/evaluate.py      perplexity on a shipped text, and KL to float32, per approximation
"""
from __future__ import annotations

import argparse
import sys

from . import bench, evaluate, generate, grade, seed, serve, verify
from .args import load_bench_model
from .bench import MALLOC_NOTE

COMMANDS = {"seed": seed, "bench": bench, "generate": generate, "verify": verify, "serve": serve, "grade": grade,
            "eval": evaluate}

__all__ = ["COMMANDS", "MALLOC_NOTE", "build_parser", "keep_freed_memory_for", "load_bench_model", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tinydecoder",
                                     description="tinydecoder: a small numpy decoder, toy and real.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def keep_freed_memory_for(args) -> bool:
    """bench and generate on SmolLM2 opt in to glibc keeping freed memory (a long prefill's
    temporaries are then not page-faulted back in every layer); their output says so (bench's
    report, and `malloc_keeps_freed_memory` in --json). True if it was set."""
    if args.command in ("bench", "generate") and getattr(args, "model", None) == "smollm2":
        from ..perf.machine import keep_freed_memory

        return keep_freed_memory()
    return False


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.malloc_kept = keep_freed_memory_for(args)
    try:
        return COMMANDS[args.command].run(args)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
