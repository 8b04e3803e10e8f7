"""`generate --speculative prompt-lookup|early-exit:L --draft-tokens K`: the same output as
`generate` (and --json fields), the tokens verified in passes of k + 1 rows."""
from __future__ import annotations

import json

from .args import positive_int_arg
from .grammar import finish_reason, grammar_flags


def add_speculative_arguments(parser) -> None:
    """Add `--speculative prompt-lookup|early-exit:L --draft-tokens K` to the `generate` parser."""
    parser.add_argument("--speculative", metavar="DRAFT",
                        help="speculative decoding with this draft: prompt-lookup, or early-exit:L (the "
                             "model's first L layers); --json then adds draft_tokens_proposed, "
                             "draft_tokens_accepted and target_forward_calls")
    parser.add_argument("--draft-tokens", type=positive_int_arg, metavar="K",
                        help="with --speculative: at most K guessed tokens per verification pass (default 4)")


def run_speculative(args) -> int:
    """The `generate` command with --speculative: the same output (and --json fields) as without."""
    import time

    from ..checkpoint.registry import check_weights, open_model
    from ..checkpoint.text import TextGeneration

    if args.no_cache:
        raise ValueError("--speculative verifies guesses against the KV cache: drop --no-cache")
    ignored = [flag for flag, given in (("--beams", args.beams is not None), ("--min-p", args.min_p is not None),
                                        ("--repetition-penalty", args.repetition_penalty is not None),
                                        ("--stop", bool(args.stop)), *grammar_flags(args)) if given]
    if ignored:
        raise ValueError(f"--speculative does not apply {', '.join(ignored)} (its verification keeps the model's own "
                         "distribution): drop " + ("it" if len(ignored) == 1 else "them"))
    settings = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    weights = check_weights(args.model, args.weights)  # float32 unless asked: a check is a pass over several rows
    chosen = open_model(args.model, weights=weights)
    prompt = chosen.encode(args.prompt, args.chat)
    model, stop_tokens, piece_of = chosen.model, chosen.stop_tokens, chosen.piece_writer()
    pieces, times = [], []

    def on_token(token):
        times.append(time.perf_counter())
        pieces.append(piece_of(token))
        if not args.json:
            print(pieces[-1], end="", flush=True)

    from ..decoding.speculative import speculative_generate

    start = time.perf_counter()
    spec = speculative_generate(model, prompt, args.max_new_tokens, args.speculative,
                                draft_tokens=args.draft_tokens or 4, stop_tokens=stop_tokens,
                                on_token=on_token, **settings)
    new = spec.new_tokens
    text = "".join(pieces).strip() if args.model == "toy" else "".join(pieces)
    result = TextGeneration(list(prompt), list(new), text, times[0] - start, times[-1] - times[0],
                            spec.cache.nbytes, stopped=bool(new) and new[-1] in stop_tokens)
    if args.json:
        ended = {"finish_reason": finish_reason(result.stopped, len(new), args.max_new_tokens)}
        out = result.to_dict() | ended | {"weights": weights} | {k: v for k, v in spec.to_dict().items()
                                          if k in ("draft", "draft_tokens", "draft_tokens_proposed",
                                                   "draft_tokens_accepted", "target_forward_calls", "accepted_per_step")}
        print(json.dumps(out, indent=2))
    else:
        print()
    return 0
