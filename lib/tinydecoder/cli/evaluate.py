"""`python -m tinydecoder eval`: SmolLM2's perplexity on the shipped text, and the KL of a variant's
next-token distributions to the float32 model's (lessons/quality.py scores, quality_variants.py
builds each variant from the module that teaches it).

    python -m tinydecoder eval                        # the float32 model: the reference
    python -m tinydecoder eval --weights int4-nogroup --json
    python -m tinydecoder eval --kv int8
    python -m tinydecoder eval --sinks 4 --window 256
    python -m tinydecoder eval --experts 8 --tokens 1024
    python -m tinydecoder eval --early-exit 20
"""
from __future__ import annotations

import json
import math
import sys
import time

from ..lessons.quality import EVAL_TEXT, score, shipped_text, text_sources
from ..lessons.quality_variants import KV_BITS, N_EXPERTS, WEIGHTS, Variant, build_runner, calibration_sequences, reference_runner

DEFAULT_TOKENS = 4096  # 15 windows of 512 (stride 256): well under a minute for f32 on 2 idle cores
DEFAULT_CONTEXT, DEFAULT_STRIDE = 512, 256
DEFAULT_PIECE = 16  # sink-cache tokens per forward after the first prefill (--piece 1: exact StreamingLLM)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="perplexity of SmolLM2 on a shipped text, and KL to float32, for a speed-up's approximation",
        description="Score SmolLM2-135M on the shipped Python-documentation text in overlapping windows: "
                    "perplexity = exp(mean NLL of each next token), and the mean KL(p_float32 || p_variant) of "
                    "the next-token distributions (0 for the float32 model itself). Flags choose the variant; "
                    "they combine where the pieces do.")
    p.add_argument("--weights", choices=WEIGHTS, default="f32",
                   help="f32 (default, the reference); q4_1 (the file's own blocks, read in place); q8_0 "
                        "(re-quantised to Q8_0 blocks of 32); int4-nogroup (4 bits, one scale per matrix row: bad)")
    p.add_argument("--kv", choices=tuple(KV_BITS), help="quantised KV cache (KIVI: keys per channel, values per token)")
    p.add_argument("--sinks", type=int, metavar="N", help="StreamingLLM: keep the first N positions ... (needs --window)")
    p.add_argument("--window", type=int, metavar="W", help="... and the last W (alone: a plain sliding window)")
    p.add_argument("--piece", type=int, metavar="P",
                   help=f"tokens per forward through the cache: with --window, once the sink cache is full (default "
                        f"{DEFAULT_PIECE}; 1 = exact StreamingLLM, slow); without, instead of one prefill per window "
                        f"(1 = as decode steps run: prices q4_1's decode kernels)")
    p.add_argument("--experts", type=int, metavar="K", help=f"MoEfication: K of {N_EXPERTS} experts per token (1..16)")
    p.add_argument("--early-exit", type=int, metavar="L", help="only the first L layers, then the norm and head (1..30)")
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS,
                   help=f"tokens of the text to score (default {DEFAULT_TOKENS}; the text has "
                        f"{text_sources()['files'][EVAL_TEXT]['smollm2_tokens']:,})")
    p.add_argument("--context", type=int, default=DEFAULT_CONTEXT, help=f"tokens per window (default {DEFAULT_CONTEXT})")
    p.add_argument("--stride", type=int, default=DEFAULT_STRIDE,
                   help=f"tokens between window starts (default {DEFAULT_STRIDE}): each scored token after the first "
                        f"window sees at least context - stride tokens before it")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")


def variant_from_args(args) -> Variant:
    piece = args.piece if args.piece is not None else min(DEFAULT_PIECE, args.window) if args.window else None
    return Variant(weights=args.weights, kv=args.kv, sinks=args.sinks, window=args.window, experts=args.experts,
                   early_exit=args.early_exit, piece=piece).check()


def check_tokens(tokens: int, available: int, context: int) -> int:
    if not 2 <= tokens <= available:
        raise ValueError(f"--tokens must be in 2..{available} (the shipped text's tokens), got {tokens}")
    if context < 2:
        raise ValueError(f"--context (tokens per window) must be >= 2, got {context}")
    return tokens


def evaluate(model, tokenizer, variant: Variant, tokens: int = DEFAULT_TOKENS, context: int = DEFAULT_CONTEXT,
             stride: int = DEFAULT_STRIDE, progress=None, quantized=None) -> dict:
    """The JSON object `eval --json` prints, for `variant` on the first `tokens` of the text
    (quantized: the model on its file's Q4_1 blocks, for weights "q4_1")."""
    started = time.perf_counter()
    all_ids = tokenizer.encode(shipped_text())
    ids = all_ids[:check_tokens(tokens, len(all_ids), context)]
    calibration = calibration_sequences(tokenizer) if variant.experts is not None else None
    run = build_runner(model, variant, calibration, quantized)
    reference = None if variant.is_reference else reference_runner(model)
    setup = time.perf_counter() - started  # tokenising, and building the variant (re-quantising, MoEfication)
    result = score(run, ids, context, stride, reference, progress)
    sources = text_sources()
    return {"perplexity": result.perplexity, "tokens": len(ids), "scored_tokens": len(result.nll),
            "mean_nll": float(result.nll.mean()), "kl_to_reference": result.mean_kl,
            "reference_perplexity": result.perplexity if reference is None else
            float(math.exp(result.reference_nll.mean())),
            "variant": variant.to_dict(), "windows": len(result.windows), "context": context, "stride": stride,
            "seconds": round(result.seconds, 2), "setup_seconds": round(setup, 2), "model": model.config.name,
            "text": {"file": EVAL_TEXT, "python": sources["python"], "source": "pydoc_data.topics",
                     "topics": sources["files"][EVAL_TEXT]["topics"]}}


def run(args) -> int:
    from tqdm import tqdm

    from ..checkpoint.smollm2 import load_smollm2, smollm2_tokenizer

    variant = variant_from_args(args)  # bad flags are reported before the model loads
    available = text_sources()["files"][EVAL_TEXT]["smollm2_tokens"]
    if not 2 <= args.tokens <= available:
        raise ValueError(f"--tokens must be in 2..{available} (the shipped text's tokens), got {args.tokens}")
    if args.context < 2:
        raise ValueError(f"--context (tokens per window) must be >= 2, got {args.context}")
    if not 1 <= args.stride < args.context:
        raise ValueError(f"--stride must be in 1..{args.context - 1} (below --context, so that windows overlap and "
                         f"each scored token has context), got {args.stride}")
    progress = lambda **kw: tqdm(file=sys.stderr, leave=False, **kw)
    quantized = load_smollm2("q4_1") if variant.weights == "q4_1" else None
    out = evaluate(load_smollm2(), smollm2_tokenizer(), variant, args.tokens, args.context, args.stride, progress,
                   quantized)
    if args.json:
        print(json.dumps(out))
        return 0
    changed = {k: v for k, v in out["variant"].items() if v != Variant().to_dict()[k]}
    print(f"{out['model']}, variant {changed or 'f32 (reference)'}: {out['tokens']} tokens of {out['text']['file']} "
          f"(Python {out['text']['python']}), {out['windows']} windows of {out['context']} (stride {out['stride']})")
    print(f"perplexity {out['perplexity']:.4f} (float32 reference {out['reference_perplexity']:.4f}, "
          f"{100 * (out['perplexity'] / out['reference_perplexity'] - 1):+.2f} %)")
    print(f"KL(float32 || variant) {out['kl_to_reference']:.5f} nats per token; scoring {out['seconds']:.1f} s "
          f"(+ {out['setup_seconds']:.1f} s to tokenise and build the variant)")
    return 0
