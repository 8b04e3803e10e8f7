"""Command line: `python -m tinydecoder seed|generate|bench ...`."""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def cmd_seed(args) -> int:
    from .generate import generate
    from .toy import SEED_PROMPT, toy_model

    model = toy_model()  # float64: the seed's reference numbers to ~1e-15
    full = generate(model, SEED_PROMPT, args.new_tokens, use_cache=False)
    cached = generate(model, SEED_PROMPT, args.new_tokens, use_cache=True)
    if args.json:
        print(json.dumps({"full_context": full.to_dict(), "with_cache": cached.to_dict()}, indent=2))
        return 0
    print(f"Seed 000's toy decoder (float64), prompt {SEED_PROMPT}, {args.new_tokens} greedy tokens\n")
    print(f"{'round':<14}{'input':<16}{'cache after':<13}{'next token':<12}{'max |logits diff| vs full'}")
    for ev_c, ev_f in zip(cached.events, full.events):
        fed = cached.tokens[ev_c.context_tokens - ev_c.input_rows: ev_c.context_tokens]
        diff = float(np.max(np.abs(ev_c.logits - ev_f.logits)))
        print(f"{ev_c.step}, {ev_c.phase:<11}{str(fed):<16}{ev_c.context_tokens:<13}{ev_c.next_token:<12}{diff:.1e}")
    print(f"\n{'':<16}{'full context':>16}{'with cache':>16}")
    print(f"{'tokens':<16}{str(full.tokens).replace(' ', ''):>16}{str(cached.tokens).replace(' ', ''):>16}")
    print(f"{'projected rows':<16}{full.projected_rows:>16}{cached.projected_rows:>16}")
    print(f"{'score pairs':<16}{full.score_pairs:>16}{cached.score_pairs:>16}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tinydecoder",
                                     description="tinydecoder: a small numpy decoder, toy and real.")
    sub = parser.add_subparsers(dest="command", required=True)
    seed = sub.add_parser("seed", help="run seed 000's toy decoder with and without a KV cache")
    seed.add_argument("--new-tokens", type=_positive_int, default=4, help="tokens to generate (default 4)")
    seed.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    seed.set_defaults(func=cmd_seed)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
