"""Command line: `python -m tinydecoder seed|generate|bench|verify|grade|eval ...`."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .cli_args import float_arg, int_arg, positive_int_arg, toy_prompt
from .cli_grammar import add_grammar_arguments, grammar_processors
from .cli_speculative import add_speculative_arguments


def cmd_seed(args) -> int:
    from .core.toy import SEED_PROMPT, toy_model
    from .decoding.generate import generate

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


def load_bench_model(name: str):
    """The model `bench --model NAME` measures: "toy" (seed shapes, float32) or "smollm2"."""
    from .serving.bench import toy_bench_model

    if name == "toy":
        return toy_bench_model()
    if name == "smollm2":
        from .checkpoint.smollm2 import load_smollm2

        return load_smollm2()
    raise ValueError(f"unknown model {name!r}; choose 'toy' or 'smollm2'")


def cmd_bench(args) -> int:
    from .serving.bench import format_report, run_bench

    prompts, stops = None, ()
    if args.model == "smollm2" and args.path == "fast":  # speculative decoding needs text: notebook 15's prompts
        from .checkpoint.smollm2 import IM_END_ID, smollm2_tokenizer
        from .serving.bench_rows import speculative_prompts

        prompts, stops = speculative_prompts(smollm2_tokenizer()), (IM_END_ID,)
    result = run_bench(load_bench_model(args.model), repeat=args.repeat, path=args.path, prompts=prompts,
                       stop_tokens=stops)
    result["malloc_keeps_freed_memory"] = args.malloc_kept
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    if args.malloc_kept and not args.json:
        print(MALLOC_NOTE)
    return 0


def _decoding_processors(args) -> list:
    """The logits processors --repetition-penalty and --min-p ask for (stop strings: see below)."""
    from .decoding.processors import MinP, RepetitionPenalty

    return ([RepetitionPenalty(args.repetition_penalty)] if args.repetition_penalty is not None else []) + \
        ([MinP(args.min_p)] if args.min_p is not None else [])


def cmd_beams(args, processors) -> int:
    """--beams N: beam search; prints the best beam (with --json: every beam and its log-prob)."""
    from .decoding.beam import beam_search
    from .decoding.processors import StopSequences

    if any(v is not None for v in (args.temperature, args.top_k, args.top_p, args.seed)):
        raise ValueError("--beams is a deterministic search: drop --temperature/--top-k/--top-p/--seed")
    if args.no_cache:
        raise ValueError("--beams always uses a KV cache per beam: drop --no-cache")
    if args.model == "toy":
        from .core.toy import toy_model

        model, stop_tokens, decode = toy_model(), (), lambda ids: " ".join(map(str, ids))
        prompt = toy_prompt(args)
    else:
        from .checkpoint.smollm2 import ENDOFTEXT_ID, IM_END_ID, load_smollm2, smollm2_tokenizer

        model, tok, stop_tokens = load_smollm2(), smollm2_tokenizer(), (IM_END_ID, ENDOFTEXT_ID)
        decode = lambda ids: tok.decode([i for i in ids if i not in stop_tokens])
        prompt = tok.encode_chat([{"role": "user", "content": args.prompt}]) if args.chat else tok.encode(args.prompt)
    stop_text = StopSequences(args.stop, decode) if args.stop else None
    result = beam_search(model, prompt, args.beams, args.max_new_tokens, stop_tokens=stop_tokens,
                         processors=processors + ([stop_text] if stop_text else []))
    texts = [stop_text.trim(decode(b.tokens)) if stop_text else decode(b.tokens) for b in result.beams]
    if args.json:
        print(json.dumps({"prompt_token_ids": prompt, "token_ids": result.best.tokens, "text": texts[0],
                          "forward_calls": result.forward_calls,
                          "beams": [b.to_dict() | {"text": t} for b, t in zip(result.beams, texts)]}, indent=2))
    else:
        print(texts[0])
    return 0


def cmd_generate(args) -> int:
    """Stream a continuation of --prompt (SmolLM2 text, or toy-model token ids)."""
    from .checkpoint.smollm2 import TextGeneration, generate_text, timed_generate

    processors = _decoding_processors(args) + grammar_processors(args)
    if args.beams is not None:
        return cmd_beams(args, processors)
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    stream = not args.json

    def show(text):
        print(text, end="", flush=True)

    if args.model == "toy":
        from .core.toy import toy_model

        prompt = toy_prompt(args)
        sampler = None
        if any(v is not None for v in sampling.values()):
            from .decoding.sampling import make_sampler

            sampler = make_sampler(**sampling)
        model = toy_model()  # float64, as in the seed
        if args.stop:  # the toy's text is its ids: "--stop '2 0'" stops after ... 2 0
            from .decoding.processors import StopSequences

            processors.append(StopSequences(args.stop, lambda ids: " ".join(map(str, ids))))
        gen, prefill_s, decode_s = timed_generate(
            model, prompt, args.max_new_tokens, sampler=sampler, use_cache=not args.no_cache,
            on_token=(lambda t: show(f" {t}")) if stream else None, processors=processors, keep_logits=False)
        result = TextGeneration(prompt, gen.new_tokens, " ".join(map(str, gen.new_tokens)), prefill_s,
                                decode_s, gen.cache.nbytes if gen.cache is not None else 0, generation=gen)
    else:
        result = generate_text(args.prompt, chat=args.chat, max_new_tokens=args.max_new_tokens,
                               use_cache=not args.no_cache, on_text=show if stream else None,
                               processors=processors, stop=args.stop, **sampling)
    if args.json:
        print(json.dumps(result.to_dict() | {"malloc_keeps_freed_memory": args.malloc_kept}, indent=2))
    else:
        print()
    return 0


def cmd_verify(args) -> int:
    """Check a weight cache's files against the sha256 its manifest recorded (see checkpoint/store.py)."""
    from .checkpoint import store
    from .checkpoint.gguf_file import verify_sha256

    if args.cache_dir is not None:
        cache_dir, source, where = Path(args.cache_dir), None, f" --cache-dir {args.cache_dir}"
    elif args.gguf is not None:
        sha256 = verify_sha256(args.gguf, None)
        cache_dir, where = store.cache_dir_for(sha256), f" --gguf {args.gguf}"
        source = lambda: (Path(args.gguf), sha256)
    else:
        from .checkpoint.smollm2 import SHA256, smollm2_path

        cache_dir, where = store.cache_dir_for(SHA256), ""
        source = lambda: (smollm2_path(), verify_sha256(smollm2_path(), SHA256))
    report = store.verify_cache(cache_dir) if cache_dir.is_dir() else None
    if args.record and report is not None and not report.hashes_recorded and not report.problems:
        n = store.record_hashes(cache_dir)
        print(f"{cache_dir}: recorded the sha256 of {n} files, trusting them as they are now "
              f"(--repair would rebuild them from the GGUF instead)")
        return 0
    if args.repair and (report is None or report.problems or not report.hashes_recorded):
        for problem in report.problems if report else ():
            print(f"{cache_dir / problem}")
        if source is None:  # a bare folder: its GGUF is not known here, the next load rebuilds it
            store.discard(cache_dir)
            print(f"{cache_dir}: removed; the next load of its GGUF rebuilds it")
            return 0
        path, sha256 = source()
        reason = f"{len(report.problems)} damaged file(s)" if report and report.problems else "verify --repair"
        store.build_cache(path, cache_dir, sha256=sha256, reason=reason)
        report = store.verify_cache(cache_dir)
    if report is None:
        print(f"{cache_dir}: no weight cache here, nothing to verify (the first load builds it; "
              f"--repair builds it now)")
        return 1
    for problem in report.problems:
        print(f"{cache_dir / problem}")
    if report.problems:
        print(f"{cache_dir}: {len(report.problems)} problem(s); rebuild the cache from its GGUF with: "
              f"python -m tinydecoder verify --repair{where}")
        return 1
    if not report.hashes_recorded:
        print(f"{cache_dir}: no sha256 recorded (a cache built before tinydecoder recorded them): shapes and "
              f"sizes are right, but same-size damage cannot be checked; --record hashes the files as they "
              f"are now, --repair rebuilds them from the GGUF")
        return 1
    print(f"{cache_dir}: all {report.checked} files match the sha256 recorded at build time")
    return 0


def cmd_serve(args) -> int:
    """Serve a model over an OpenAI-compatible HTTP API until SIGINT/SIGTERM (tinydecoder.server)."""
    try:
        from .server import run_server
    except ImportError as exc:
        raise ValueError(f"the server needs the serve extra (pip install -e '.[serve]'): {exc}") from None
    return run_server(args.model, host=args.host, port=args.port, api_key=args.api_key,
                      max_batch=args.max_batch, kv_blocks=args.kv_blocks)


def add_serve_arguments(serve) -> None:
    serve.add_argument("--model", choices=("smollm2", "toy"), default="smollm2", help="smollm2 (default) or toy")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int_arg, default=8000, help="port (default 8000)")
    serve.add_argument("--max-batch", type=positive_int_arg, default=16, help="most requests running at once (16)")
    serve.add_argument("--kv-blocks", type=positive_int_arg, default=256, help="KV blocks in the paged pool (256)")
    serve.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1/*")
    serve.set_defaults(func=cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tinydecoder",
                                     description="tinydecoder: a small numpy decoder, toy and real.")
    sub = parser.add_subparsers(dest="command", required=True)
    seed = sub.add_parser("seed", help="run seed 000's toy decoder with and without a KV cache")
    seed.add_argument("--new-tokens", type=positive_int_arg, default=4, help="tokens to generate (default 4)")
    seed.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    seed.set_defaults(func=cmd_seed)
    bench = sub.add_parser("bench", help="measure this machine's roofs and the model's prefill/decode speed")
    bench.add_argument("--model", choices=("toy", "smollm2"), default="toy",
                       help="toy: the seed toy's shapes (seconds); smollm2: the real model (~1 minute)")
    bench.add_argument("--repeat", type=positive_int_arg, default=3,
                       help="timed repetitions (default 3; pass costs, speculative runs and batch steps at least 9): roofs "
                            "take the best, speeds the median; on a busy machine compare with OPENBLAS_NUM_THREADS=1")
    bench.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    bench.add_argument("--path", choices=("fast", "reference"), default="fast",
                       help="which forward is timed: the fast path (default) or the reference forward")
    bench.set_defaults(func=cmd_bench)
    gen = sub.add_parser("generate", help="generate text with SmolLM2-135M (or token ids with the toy model)",
                         description="Stream a continuation of --prompt, greedy unless a temperature, top-k "
                                     "or top-p is given.")
    gen.add_argument("--model", choices=("smollm2", "toy"), default="smollm2",
                     help="smollm2: the real model (default); toy: seed 000's decoder, prompt = token ids")
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
                          "decode_tokens_per_second, cache_bytes) instead of streaming")
    gen.set_defaults(func=cmd_generate)
    verify = sub.add_parser(
        "verify", help="check every file of a weight cache against the sha256 its manifest recorded",
        description="Hash every file of a weight cache (SmolLM2's unless --gguf or --cache-dir) and compare "
                    "it with the sha256 recorded at build time, catching damage that keeps a file's size "
                    "(a normal load checks only shapes and sizes). One line per problem, then a summary. "
                    "Exit status: 0 every file matches; 1 a problem, no cache, or a cache without recorded "
                    "hashes (built by an older tinydecoder: see --record); 2 bad arguments.")
    where = verify.add_mutually_exclusive_group()
    where.add_argument("--gguf", metavar="PATH", help="the cache of this GGUF file (default: SmolLM2's)")
    where.add_argument("--cache-dir", metavar="PATH", help="this cache folder (<cache root>/<sha256 of the GGUF>)")
    action = verify.add_mutually_exclusive_group()
    action.add_argument("--repair", action="store_true",
                        help="rebuild a damaged (or hash-less) cache from its GGUF; with --cache-dir, remove "
                             "the folder so that the next load rebuilds it")
    action.add_argument("--record", action="store_true",
                        help="for a cache without recorded hashes: hash its files as they are now and record "
                             "them in the manifest")
    verify.set_defaults(func=cmd_verify)
    add_speculative_arguments(gen)  # --speculative DRAFT --draft-tokens K
    add_grammar_arguments(gen)  # --json-schema FILE, --regex PATTERN (cli_grammar.py)
    from .parallel.cli import add_parallel_arguments  # --tensor-parallel N (MPI, tinydecoder.parallel)
    add_parallel_arguments(gen, bench, toy_prompt=toy_prompt, load_bench_model=load_bench_model)
    add_serve_arguments(sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API "
                                       "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)"))
    from .lessons.grading import add_grade_parser  # issue 22: python -m tinydecoder grade
    add_grade_parser(sub)
    from .lessons.quality_cli import add_eval_parser  # python -m tinydecoder eval (perplexity, KL to float32)
    add_eval_parser(sub)
    return parser


MALLOC_NOTE = "malloc keeps freed memory for reuse (this process only; serving.machine.keep_freed_memory)"


def keep_freed_memory_for(args) -> bool:
    """bench and generate on SmolLM2 opt in to glibc keeping freed memory (a long prefill's
    temporaries are then not page-faulted back in every layer); their output says so (bench's
    report, and `malloc_keeps_freed_memory` in --json). True if it was set."""
    if args.command in ("bench", "generate") and getattr(args, "model", None) == "smollm2":
        from .serving.machine import keep_freed_memory

        return keep_freed_memory()
    return False


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.malloc_kept = keep_freed_memory_for(args)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
