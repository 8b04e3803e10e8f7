"""`generate --beams N`: beam search; prints the best beam (with --json: every beam and its log-prob)."""
from __future__ import annotations

import json

from .grammar import endings


def run_beams(args, processors) -> int:
    from ..checkpoint.registry import check_weights, open_model
    from ..decoding.beam import beam_search
    from ..decoding.processors import StopSequences

    if any(v is not None for v in (args.temperature, args.top_k, args.top_p, args.seed)):
        raise ValueError("--beams is a deterministic search: drop --temperature/--top-k/--top-p/--seed")
    if args.no_cache:
        raise ValueError("--beams always uses a KV cache per beam: drop --no-cache")
    weights = check_weights(args.model, args.weights)  # float32 unless asked: beams are passes over several rows
    chosen = open_model(args.model, weights=weights)
    prompt = chosen.encode(args.prompt, args.chat)
    stop_text = StopSequences(args.stop, chosen.decode) if args.stop else None
    result = beam_search(chosen.model, prompt, args.beams, args.max_new_tokens, stop_tokens=chosen.stop_tokens,
                         processors=processors + ([stop_text] if stop_text else []))
    decoded = [chosen.decode(b.tokens) for b in result.beams]
    texts = [stop_text.trim(t) if stop_text else t for t in decoded]
    best = result.best
    if not args.json:
        print(texts[0])  # before a warning about it
    ended = endings(args, processors, prompt, best.tokens, best.finished or len(texts[0]) < len(decoded[0]))
    if args.json:
        print(json.dumps({"prompt_token_ids": prompt, "token_ids": best.tokens, "text": texts[0],
                          "forward_calls": result.forward_calls} | ended | {"weights": weights} |
                         {"beams": [b.to_dict() | {"text": t} for b, t in zip(result.beams, texts)]}, indent=2))
    return 0
