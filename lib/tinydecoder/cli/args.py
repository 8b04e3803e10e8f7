"""The command line's argument types and the `--model` flag (shared by its commands)."""
from __future__ import annotations

import argparse

from ..checkpoint.registry import DEFAULT_WEIGHTS, MODEL_NAMES, ONE_STREAM_WEIGHTS, WEIGHTS, toy_prompt_ids


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


def add_weights_argument(parser, one_stream: bool = False) -> None:
    """--weights f32|q4_1: how SmolLM2's matrices are held (checkpoint.registry's DEFAULT_WEIGHTS;
    one_stream: generate's, ONE_STREAM_WEIGHTS for one stream)."""
    default = (f"default {ONE_STREAM_WEIGHTS} for one stream (its decode reads a fifth of the bytes; {DEFAULT_WEIGHTS} "
               f"without numba), {DEFAULT_WEIGHTS} with --speculative, --beams or --tensor-parallel (passes over several "
               "rows, where float32 is faster)"
               if one_stream else f"default {DEFAULT_WEIGHTS} (this command runs passes over several rows, where "
               "float32 is faster; q4_1 decodes one stream faster)")
    parser.add_argument("--weights", choices=WEIGHTS, default=None,
                        help="SmolLM2's weights: f32 (float32) or q4_1 (the GGUF file's Q4_1 blocks read in place; "
                             f"the same greedy tokens in our tests); {default}; the toy has f32 only")


def toy_prompt(args) -> list:
    """`--model toy`'s prompt: token ids separated by spaces (the toy has no tokenizer or chat template)."""
    return toy_prompt_ids(args.prompt, args.chat)


def load_bench_model(name: str, weights=None):
    """The model `bench --model NAME` measures: "toy" (seed shapes, float32, 4096 positions) or
    "smollm2" (weights: "f32" or "q4_1", None for the default)."""
    from ..checkpoint.registry import load_model
    from ..perf.bench import toy_bench_model

    return load_model(name, toy=toy_bench_model, weights=weights)
