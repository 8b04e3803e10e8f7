"""`python -m tinydecoder seed`: the worked example's toy decoder with and without a KV cache, round by round."""
from __future__ import annotations

import json

import numpy as np

from .args import positive_int_arg


def add_parser(subparsers) -> None:
    seed = subparsers.add_parser("seed", help="run the worked example's toy decoder with and without a KV cache")
    seed.add_argument("--new-tokens", type=positive_int_arg, default=4, help="tokens to generate (default 4)")
    seed.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def run(args) -> int:
    from ..core.toy import SEED_PROMPT, toy_model
    from ..decoding.generate import generate

    model = toy_model()  # float64: the seed's reference numbers to ~1e-15
    full = generate(model, SEED_PROMPT, args.new_tokens, use_cache=False)
    cached = generate(model, SEED_PROMPT, args.new_tokens, use_cache=True)
    if args.json:
        print(json.dumps({"full_context": full.to_dict(), "with_cache": cached.to_dict()}, indent=2))
        return 0
    print(f"the worked example's toy decoder (float64), prompt {SEED_PROMPT}, {args.new_tokens} greedy tokens\n")
    print(f"{'round':<14}{'input':<16}{'cache after':<13}{'next token':<12}{'max |logits diff| vs full'}")
    for ev_c, ev_f in zip(cached.events, full.events):
        fed = cached.tokens[ev_c.context_tokens - ev_c.input_rows: ev_c.context_tokens]
        diff = float(np.max(np.abs(ev_c.logits - ev_f.logits)))
        print(f"{ev_c.step}, {ev_c.phase:<11}{str(fed):<16}{ev_c.context_tokens:<13}{ev_c.next_token:<12}{diff:.1e}")
    print(f"\n{'':<16}{'full context':>22}{'with cache':>22}")
    print(f"{'tokens':<16}{str(full.tokens).replace(' ', ''):>22}{str(cached.tokens).replace(' ', ''):>22}")
    print(f"{'projected rows':<16}{full.projected_rows:>22}{cached.projected_rows:>22}")
    print(f"{'score pairs':<16}{full.score_pairs:>22}{cached.score_pairs:>22}")
    return 0
