"""Notebook 08's helpers: a prompt typed by the learner, traced through a real model (bounded in
length), and where the FLOPs that `forward(..., last_only=True)` saves come from."""
from __future__ import annotations

from ..core.reference import forward
from ..core.trace import Trace

MAX_PROMPT_TOKENS = 32  # the attention explorer traces at most this many tokens (a quick forward)


def token_piece_labels(tokenizer, token_ids, start: int = 0) -> list:
    """Tick labels "position:piece" for token ids, the piece stripped of its leading space
    (a piece that is only whitespace is shown as its repr, e.g. '\\n')."""
    labels = []
    for i, piece in enumerate(tokenizer.pieces([int(t) for t in token_ids])):
        labels.append(f"{start + i}:{piece.strip() or repr(piece)}")
    return labels


def trace_prompt(model, tokenizer, text, max_tokens: int = MAX_PROMPT_TOKENS) -> dict:
    """Encode `text` (no chat template, no BOS) and run one traced prefill of the model on it.

    Returns {"text", "ids", "labels" ("position:piece"), "trace" (attention weights of every
    layer), "next_token" (greedy, after the last position)}. Raises ValueError, with what is
    allowed, for text that is not a string, empty, or longer than `max_tokens` tokens."""
    if not isinstance(text, str):
        raise ValueError(f"the prompt must be text (a str), got {type(text).__name__}")
    if int(max_tokens) < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if not text.strip():
        raise ValueError(f"the prompt is empty: type a few words (at most {max_tokens} tokens)")
    ids = tokenizer.encode(text)
    if len(ids) > max_tokens:
        raise ValueError(f"the prompt is {len(ids)} tokens long; the explorer takes at most {max_tokens} "
                         f"(a shorter text, please)")
    trace = Trace()
    logits = forward(model, ids, trace=trace)  # [S, V]
    return {"text": text, "ids": list(ids), "labels": token_piece_labels(tokenizer, ids), "trace": trace,
            "next_token": int(logits[-1].argmax())}


def last_only_savings(full: Trace, lean: Trace) -> dict:
    """Compare the Trace of a full prefill with the Trace of the same prompt run with
    last_only=True. Returns FLOPs {"full", "lean", "saved", "lm_head_saved", "last_layer_saved",
    "other_saved" (the remaining layers: 0 when only the last layer is trimmed), "lm_head_share"
    (the LM head's share of the saving), "last_layer" (its index)}."""
    layers = {r.layer for r in full.ops if r.layer is not None}
    if not layers or not lean.ops:
        raise ValueError("both traces must come from forward(model, ids, trace=Trace()), "
                         "the second with last_only=True")
    last = max(layers)
    saved = full.total_flops() - lean.total_flops()
    lm_head = full.total_flops(op="lm_head") - lean.total_flops(op="lm_head")
    last_layer = full.total_flops(layer=last) - lean.total_flops(layer=last)
    if saved <= 0:
        raise ValueError("the second trace saves nothing: run it with last_only=True on the same prompt")
    return {"full": full.total_flops(), "lean": lean.total_flops(), "saved": saved, "lm_head_saved": lm_head,
            "last_layer_saved": last_layer, "other_saved": saved - lm_head - last_layer,
            "lm_head_share": lm_head / saved, "last_layer": last}
