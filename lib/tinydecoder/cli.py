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
    print(f"\n{'':<16}{'full context':>22}{'with cache':>22}")
    print(f"{'tokens':<16}{str(full.tokens).replace(' ', ''):>22}{str(cached.tokens).replace(' ', ''):>22}")
    print(f"{'projected rows':<16}{full.projected_rows:>22}{cached.projected_rows:>22}")
    print(f"{'score pairs':<16}{full.score_pairs:>22}{cached.score_pairs:>22}")
    return 0


def cmd_bench(args) -> int:
    from .bench import format_report, load_bench_model, run_bench

    result = run_bench(load_bench_model(args.model), repeat=args.repeat)
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0


def _float_arg(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _int_arg(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def cmd_generate(args) -> int:
    """Stream a continuation of --prompt (SmolLM2 text, or toy-model token ids)."""
    from .smollm2 import TextGeneration, generate_text, timed_generate

    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    stream = not args.json

    def show(text):
        print(text, end="", flush=True)

    if args.model == "toy":
        from .toy import toy_model

        if args.chat:
            raise ValueError("--chat needs a model with a chat template: use --model smollm2")
        try:
            prompt = [int(t) for t in args.prompt.split()]
        except ValueError:
            raise ValueError(f"--model toy takes token ids separated by spaces (e.g. \"0 1 2 3\"), "
                             f"got {args.prompt!r}") from None
        sampler = None
        if any(v is not None for v in sampling.values()):
            from .sampling import make_sampler

            sampler = make_sampler(**sampling)
        model = toy_model()  # float64, as in the seed
        gen, prefill_s, decode_s = timed_generate(
            model, prompt, args.max_new_tokens, sampler=sampler, use_cache=not args.no_cache,
            on_token=(lambda t: show(f" {t}")) if stream else None)
        result = TextGeneration(prompt, gen.new_tokens, " ".join(map(str, gen.new_tokens)), prefill_s,
                                decode_s, gen.cache.nbytes if gen.cache is not None else 0, generation=gen)
    else:
        result = generate_text(args.prompt, chat=args.chat, max_new_tokens=args.max_new_tokens,
                               use_cache=not args.no_cache, on_text=show if stream else None, **sampling)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tinydecoder",
                                     description="tinydecoder: a small numpy decoder, toy and real.")
    sub = parser.add_subparsers(dest="command", required=True)
    seed = sub.add_parser("seed", help="run seed 000's toy decoder with and without a KV cache")
    seed.add_argument("--new-tokens", type=_positive_int, default=4, help="tokens to generate (default 4)")
    seed.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    seed.set_defaults(func=cmd_seed)
    bench = sub.add_parser("bench", help="measure this machine's roofs and the model's prefill/decode speed")
    bench.add_argument("--model", choices=("toy", "smollm2"), default="toy",
                       help="toy: the seed toy's shapes (seconds); smollm2: the real model (~1 minute)")
    bench.add_argument("--repeat", type=_positive_int, default=3,
                       help="timed repetitions (default 3): roofs take the best, speeds the median; on a busy "
                            "machine compare with OPENBLAS_NUM_THREADS=1")
    bench.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    bench.set_defaults(func=cmd_bench)
    gen = sub.add_parser("generate", help="generate text with SmolLM2-135M (or token ids with the toy model)",
                         description="Stream a continuation of --prompt, greedy unless a temperature, top-k "
                                     "or top-p is given.")
    gen.add_argument("--model", choices=("smollm2", "toy"), default="smollm2",
                     help="smollm2: the real model (default); toy: seed 000's decoder, prompt = token ids")
    gen.add_argument("--prompt", required=True, help="the text to continue (toy: ids such as \"0 1 2 3\")")
    gen.add_argument("--chat", action="store_true",
                     help="wrap the prompt in the chat template as a user message; stop at <|im_end|>")
    gen.add_argument("--max-new-tokens", type=_positive_int, default=64, help="at most this many tokens (64)")
    gen.add_argument("--temperature", type=_float_arg, help="sample at this temperature (> 0)")
    gen.add_argument("--top-k", type=_int_arg, help="sample among the k most likely tokens")
    gen.add_argument("--top-p", type=_float_arg, help="sample within the top-p probability mass (0 < p <= 1)")
    gen.add_argument("--seed", type=_int_arg, help="random seed, for repeatable sampling")
    gen.add_argument("--no-cache", action="store_true",
                     help="recompute the whole context every step instead of using a KV cache (slow)")
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object (prompt_token_ids, token_ids, text, prefill_seconds, "
                          "decode_tokens_per_second, cache_bytes) instead of streaming")
    gen.set_defaults(func=cmd_generate)
    from .speculative import add_cli_arguments as add_speculative_arguments

    add_speculative_arguments(gen)  # --speculative DRAFT --draft-tokens K (speculative.cli_generate)
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
