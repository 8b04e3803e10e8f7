"""`python -m tinydecoder generate`: stream a continuation of --prompt (SmolLM2's text, or the toy
model's token ids). One command, four ways to run it, chosen here:

    --tensor-parallel N   on N MPI ranks (cli/parallel.py)
    --speculative DRAFT   speculative decoding (cli/speculative.py)
    --beams N             beam search (cli/beams.py)
    otherwise             one token at a time (below); --trace FILE records its rounds (cli/trace.py)

--json prints one object; it always has `finish_reason`, and `grammar_complete` with a grammar
(cli/grammar.py)."""
from __future__ import annotations

import json

from .args import add_model_argument, add_weights_argument, float_arg, int_arg, positive_int_arg
from .grammar import add_grammar_arguments, endings, grammar_processors
from .trace import add_trace_argument, open_trace, trace_processors


def add_parser(subparsers) -> None:
    from .parallel import add_parallel_arguments
    from .speculative import add_speculative_arguments

    gen = subparsers.add_parser("generate", help="generate text with SmolLM2-135M (or token ids with the toy model)",
                                description="Stream a continuation of --prompt, greedy unless a temperature, top-k "
                                            "or top-p is given.")
    add_model_argument(gen, "smollm2", "smollm2: the real model (default); toy: the worked example's decoder, prompt = token ids")
    add_weights_argument(gen, "generate")  # --weights f32|q4_1
    gen.add_argument("--prompt", required=True, help="the text to continue (toy: ids such as \"0 1 2 3\")")
    gen.add_argument("--chat", action="store_true",
                     help="wrap the prompt in the chat template as a user message; stop at <|im_end|>")
    gen.add_argument("--max-new-tokens", type=positive_int_arg, default=64, help="at most this many tokens (64)")
    gen.add_argument("--temperature", type=float_arg, help="sample at this temperature (> 0)")
    gen.add_argument("--top-k", type=int_arg, help="sample among the k most likely tokens")
    gen.add_argument("--top-p", type=float_arg, help="sample within the top-p probability mass (0 < p <= 1)")
    gen.add_argument("--seed", type=int_arg, help="random seed, for repeatable sampling")
    gen.add_argument("--beams", type=positive_int_arg, help="beam search with N beams instead of one token at a time "
                                                          "(deterministic; prints the best beam)")
    gen.add_argument("--repetition-penalty", type=float_arg,
                     help="divide positive / multiply negative logits of tokens already seen (> 0; 1 = off)")
    gen.add_argument("--min-p", type=float_arg, help="keep tokens with p >= MIN_P * p(best token) (0..1)")
    gen.add_argument("--stop", action="append", default=[], metavar="TEXT",
                     help="stop once the generated text contains TEXT (repeatable; the text is cut before it)")
    gen.add_argument("--no-cache", action="store_true",
                     help="recompute the whole context every step instead of using a KV cache (slow)")
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object (prompt_token_ids, token_ids, text, prefill_seconds, "
                          "decode_tokens_per_second, cache_bytes, finish_reason) instead of streaming")
    add_speculative_arguments(gen)  # --speculative DRAFT --draft-tokens K
    add_grammar_arguments(gen)  # --json-schema FILE, --regex PATTERN, --lark FILE
    add_parallel_arguments(gen)  # --tensor-parallel N, --timeout
    add_trace_argument(gen)  # --trace FILE (cli/trace.py)


def run(args) -> int:
    with open_trace(args):  # --trace FILE: refuses the ways to run it cannot trace, saves the file however it ends
        return _run(args)


def _run(args) -> int:
    if args.tensor_parallel is not None:
        from .parallel import run_generate

        return run_generate(args)
    if args.speculative is not None:
        from .speculative import run_speculative

        return run_speculative(args)
    if args.draft_tokens is not None:
        raise ValueError("--draft-tokens needs --speculative prompt-lookup|early-exit:L")
    # the grammar first: --min-p then keeps what the grammar allows
    processors = grammar_processors(args) + decoding_processors(args) + trace_processors(args)
    if args.beams is not None:
        from .beams import run_beams

        return run_beams(args, processors)
    return run_plain(args, processors)


def decoding_processors(args) -> list:
    """The logits processors --repetition-penalty and --min-p ask for (stop strings: see below)."""
    from ..decoding.processors import MinP, RepetitionPenalty

    return ([RepetitionPenalty(args.repetition_penalty)] if args.repetition_penalty is not None else []) + \
        ([MinP(args.min_p)] if args.min_p is not None else [])


def sampling_of(args) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def run_plain(args, processors) -> int:
    """One token at a time: streamed as it comes, or one JSON object with --json."""
    stream = not args.json

    def show(text):
        print(text, end="", flush=True)

    from ..checkpoint.registry import check_weights, one_stream_weights

    weights = check_weights(args.model, args.weights, one_stream_weights())  # a clear error before anything loads
    if args.model == "toy":
        result = toy_generation(args, processors, (lambda t: show(f" {t}")) if stream else None)
    else:
        from ..checkpoint.text import generate_text

        result = generate_text(args.prompt, chat=args.chat, max_new_tokens=args.max_new_tokens,
                               weights=weights, use_cache=not args.no_cache, on_text=show if stream else None,
                               processors=processors, stop=args.stop, **sampling_of(args))
    if stream:
        print()  # the streamed text's line ends before a warning about it
    ended = endings(args, processors, result.prompt_token_ids, result.token_ids, result.stopped)
    if args.json:
        print(json.dumps(result.to_dict() | ended | {"weights": weights, "malloc_keeps_freed_memory": args.malloc_kept},
                         indent=2))
    return 0


def toy_generation(args, processors, on_token):
    """The toy model's run (float64, as in the seed): its text is its ids, so "--stop '2 0'"
    stops after ... 2 0."""
    from ..checkpoint.registry import open_model
    from ..checkpoint.text import TextGeneration, timed_generate
    from ..decoding.processors import StopSequences, should_stop

    chosen = open_model("toy")
    prompt = chosen.encode(args.prompt, args.chat)
    sampler = None
    if any(v is not None for v in sampling_of(args).values()):
        from ..decoding.sampling import make_sampler

        sampler = make_sampler(**sampling_of(args))
    if args.stop:
        processors = processors + [StopSequences(args.stop, chosen.decode)]
    gen, prefill_s, decode_s = timed_generate(
        chosen.model, prompt, args.max_new_tokens, sampler=sampler, use_cache=not args.no_cache,
        on_token=on_token, processors=processors, keep_logits=False)
    return TextGeneration(prompt, gen.new_tokens, chosen.decode(gen.new_tokens), prefill_s, decode_s,
                          gen.cache.nbytes if gen.cache is not None else 0,
                          stopped=should_stop(processors, gen.tokens, gen.prompt_length), generation=gen)
