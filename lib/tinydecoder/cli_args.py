"""The command line's argument types and the toy model's prompt (shared by its commands)."""
from __future__ import annotations

import argparse


def positive_int_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def toy_prompt(args) -> list:
    """`--model toy`'s prompt: token ids separated by spaces (the toy has no tokenizer or chat template)."""
    if args.chat:
        raise ValueError("--chat needs a model with a chat template: use --model smollm2")
    try:
        return [int(t) for t in args.prompt.split()]
    except ValueError:
        raise ValueError(f"--model toy takes token ids separated by spaces (e.g. \"0 1 2 3\"), "
                         f"got {args.prompt!r}") from None


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
