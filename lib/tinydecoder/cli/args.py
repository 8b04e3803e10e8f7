"""The command line's argument types and the `--model` flag (shared by its commands)."""
from __future__ import annotations

import argparse

from ..checkpoint.registry import DEFAULT_WEIGHTS, MODEL_NAMES, WEIGHTS, toy_prompt_ids


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


def add_weights_argument(parser) -> None:
    """--weights f32|q4_1: how SmolLM2's matrices are held (checkpoint.registry.DEFAULT_WEIGHTS)."""
    parser.add_argument("--weights", choices=WEIGHTS, default=None,
                        help=f"SmolLM2's weights: f32 (float32) or q4_1 (the GGUF file's Q4_1 blocks read in place: "
                             f"decode 1.7x float32's on our 2-core test machine, prefill 2-12%% slower, the same "
                             f"greedy tokens in our tests); default {DEFAULT_WEIGHTS}, since q4_1's prefill is "
                             f"slower; the toy has f32 only")


def toy_prompt(args) -> list:
    """`--model toy`'s prompt: token ids separated by spaces (the toy has no tokenizer or chat template)."""
    return toy_prompt_ids(args.prompt, args.chat)


def load_bench_model(name: str, weights=None):
    """The model `bench --model NAME` measures: "toy" (seed shapes, float32, 4096 positions) or
    "smollm2" (weights: "f32" or "q4_1", None for the default)."""
    from ..checkpoint.registry import load_model
    from ..perf.bench import toy_bench_model

    return load_model(name, toy=toy_bench_model, weights=weights)
