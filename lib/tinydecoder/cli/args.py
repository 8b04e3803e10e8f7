"""The command line's argument types and the `--model` flag (shared by its commands)."""
from __future__ import annotations

import argparse

from ..checkpoint.registry import (
    DEFAULT_WEIGHTS,
    MODEL_NAMES,
    ONE_STREAM_WEIGHTS,
    SERVE_Q4_1_UP_TO_BATCH,
    WEIGHTS,
    toy_prompt_ids,
)


def positive_int_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def float_arg(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def int_arg(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def add_model_argument(parser, default: str, help: str) -> None:
    """--model NAME, one of checkpoint.registry's models."""
    parser.add_argument("--model", choices=MODEL_NAMES, default=default, help=help)


def add_weights_argument(parser, default: str = "bench") -> None:
    """--weights f32|q4_1: how SmolLM2's matrices are held; `default` names the command whose
    default the help states (checkpoint.registry: generate's one stream, serve's batches, bench's)."""
    fast = f"{ONE_STREAM_WEIGHTS} ({DEFAULT_WEIGHTS} without numba)"
    defaults = {
        "generate": f"default {fast} for one stream (its decode reads a fifth of the bytes), {DEFAULT_WEIGHTS} with "
                    "--speculative, --beams or --tensor-parallel (passes over several rows, where float32 is faster)",
        "serve": f"default {fast} up to --max-batch {SERVE_Q4_1_UP_TO_BATCH} (as fast at 16 requests, faster below, a "
                 f"fifth of the memory), {DEFAULT_WEIGHTS} above",
        "bench": f"default {DEFAULT_WEIGHTS} for the main table (its targets are float32's); the weights section "
                 "measures both"}
    parser.add_argument("--weights", choices=WEIGHTS, default=None,
                        help="SmolLM2's weights: f32 (float32) or q4_1 (the GGUF file's Q4_1 blocks read in place; "
                             f"the same greedy tokens in our tests); {defaults[default]}; the toy has f32 only")


def toy_prompt(args) -> list:
    """`--model toy`'s prompt: token ids separated by spaces (the toy has no tokenizer or chat template)."""
    return toy_prompt_ids(args.prompt, args.chat)


def load_bench_model(name: str, weights=None):
    """The model `bench --model NAME` measures: "toy" (seed shapes, float32, 4096 positions) or
    "smollm2" (weights: "f32" or "q4_1", None for the default)."""
    from ..checkpoint.registry import load_model
    from ..perf.bench import toy_bench_model

    return load_model(name, toy=toy_bench_model, weights=weights)
