"""Prefill and decode side by side, and the KV cache step by step (notebooks 06 and 06).

Prefill runs the S prompt positions through every layer at once; a decode step runs one
new position and reads the T - 1 earlier ones from the cache. Everything here is computed
by the library's own forward pass and read back from a `Trace`; nothing is typed by hand.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.model import Model
from ..core.ops import rmsnorm
from ..core.reference import decoder_block, embed_tokens, forward, forward_batch
from ..core.trace import Trace
from ..core.validate import check_token_ids, layer_index, positive_int
from ..core.validate import max_new_tokens as check_max_new_tokens
from ..decoding.generate import Generation
from ..decoding.sampling import greedy

SKIP_LAYERS = ("none", "last", "all")


# ---------------------------------------------------------------- shapes, FLOPs, rows
def phase_shapes(trace: Trace, layer: int = 0) -> dict:
    """The seed's prefill/decode table, read from a trace of one forward (batch) call.

    Returns {"Q": (B, Hq, S, d), "new K/V": (B, Hkv, S, d), "visible K/V": (B, Hkv, T, d),
    "scores": (B, Hq, S, T)} for `layer`. B is the number of sequences in the call; they must
    all have the same S and T (as a padded batch would)."""
    records = trace.select(op="attention", layer=layer)
    if not records:
        raise ValueError(f"the trace holds no attention record for layer {layer}; "
                         f"run forward(..., trace=Trace()) first")
    shapes = {(r.inputs[0], r.inputs[1]) for r in records}
    if len(shapes) != 1:
        raise ValueError(f"the sequences in this trace have different shapes {sorted(shapes)}; "
                         f"phase_shapes needs one S and one T for the whole batch")
    (S, Hq, d), (T, Hkv, _) = shapes.pop()
    B = len(records)
    return {"Q": (B, Hq, S, d), "new K/V": (B, Hkv, S, d), "visible K/V": (B, Hkv, T, d),
            "scores": (B, Hq, S, T)}


def attention_flops(batch: int, n_heads: int, n_queries: int, n_keys: int, head_dim: int) -> int:
    """QK^T plus PV over the full [S, T] score matrix: 2 matmuls of 2*B*Hq*S*T*d FLOPs each.

    Prefill (S = T): 4*B*Hq*S^2*d.  A decode step (S = 1): 4*B*Hq*T*d."""
    return 4 * batch * n_heads * n_queries * n_keys * head_dim


def rows_per_op(trace: Trace, layer: int = 0) -> dict:
    """op name -> the rows (positions) it processed in `layer`, from the first input's shape.

    Attention is summed over the sequences of the batch (it runs once per sequence)."""
    rows = {}
    for r in trace.select(layer=layer):
        n = r.inputs[0][0]
        rows[r.op] = rows.get(r.op, 0) + n if r.op == "attention" else n
    return rows


# ---------------------------------------------------------------- skipping queries
def forward_skipping_queries(model: Model, token_ids, layers: str = "last", trace: Trace | None = None,
                             cache=None):
    """Logits [1, V] of the last position of a prompt (no cache), skipping the queries of the
    other positions in the chosen layers.

    A skipped layer still computes K and V for every position, but queries, attention, output
    projection and FFN only for the last one; as in the walk-through, the other positions' hidden
    states then pass through that layer unchanged.
      layers="none": nothing skipped (the ordinary forward);
      layers="last": only the last layer skips (what forward(..., last_only=True) does): exact;
      layers="all":  every layer skips (the walk-through's claim): WRONG from the second layer on,
                     because a later layer's K/V for the earlier positions are then computed
                     from hidden states the earlier layers never updated.
    cache: an empty KV cache to keep the K/V every layer computed (to inspect them)."""
    if layers not in SKIP_LAYERS:
        raise ValueError(f"layers must be one of {SKIP_LAYERS}, got {layers!r}")
    cfg = model.config
    ids = check_token_ids(cfg, token_ids)
    positions = np.arange(len(ids))
    last = len(ids) - 1
    if cache is None:
        cache = model.new_cache(len(ids))
    else:
        cache.check(cfg, model.dtype)
        if len(cache):
            raise ValueError(f"forward_skipping_queries runs a prompt from scratch; the cache given "
                             f"already holds {len(cache)} positions")
    x = embed_tokens(model, ids, positions)  # [S, D]
    for l, layer in enumerate(model.layers):
        skip = layers == "all" or (layers == "last" and l == cfg.n_layers - 1)
        y = decoder_block(layer, x, positions, cache.layer(l), last_only=skip, trace=trace)
        if not skip:
            x = y
            continue
        x = x.copy()
        x[last] = y[0]  # the other rows keep this layer's input
    h = rmsnorm(x[last:], model.final_norm, cfg.norm_eps)
    return h @ model.lm_head  # [1, V]


# ---------------------------------------------------------------- the generation loop
def generation_table(gen: Generation) -> list:
    """One row per round of `generate`: round, phase, input tokens, cache length after the
    round, and the token chosen from that round's last logits."""
    rows = []
    for e in gen.events:
        fed = gen.tokens[e.context_tokens - e.input_rows:e.context_tokens]
        rows.append({"round": e.step, "phase": e.phase, "input": list(fed),
                     "cache_after": e.context_tokens, "chosen": e.next_token})
    return rows


def recompute_differences(model: Model, gen: Generation) -> list:
    """For every round, max |cached last logits - logits of a full recompute of the context|."""
    return [float(np.max(np.abs(e.logits - forward(model, gen.tokens[:e.context_tokens])[-1])))
            for e in gen.events]


def prefix_difference(model: Model, prefix, suffix) -> float:
    """max |logits of `prefix` alone - logits of the same positions once `suffix` is appended|.

    0 for a causal decoder: a position never sees the positions after it."""
    alone = forward(model, list(prefix))
    extended = forward(model, list(prefix) + list(suffix))[:len(prefix)]
    return float(np.max(np.abs(alone - extended)))


@dataclass
class StepView:
    """What one round of cached generation did, as seen from one layer."""

    step: int  # 1-based round
    phase: str  # "prefill" or "decode"
    input_tokens: list  # the tokens fed this round
    positions: list  # their positions
    cache_before: int  # rows in the cache before the round
    cache_after: int  # rows after it
    context: list  # the tokens at positions 0 .. cache_after - 1
    weights: np.ndarray  # [Hq, S, T] attention weights of the layer
    next_token: int


def cached_steps(model: Model, prompt, max_new_tokens: int, *, layer: int = 0, sampler=greedy) -> list:
    """Run the cached generation loop (prefill, then one token a round) with a trace on
    every round; return a StepView per round. Same tokens as `generate(model, prompt, n)`."""
    cfg = model.config
    layer_index(layer, cfg.n_layers)
    check_max_new_tokens(max_new_tokens)
    tokens = [int(t) for t in check_token_ids(cfg, prompt)]
    cache = model.new_cache(len(tokens) + max_new_tokens)
    views = []
    for step in range(1, max_new_tokens + 1):
        before = len(cache)
        new = tokens[before:]
        trace = Trace()
        logits = forward(model, new, cache, trace=trace)[-1]  # [V]
        token = int(sampler(logits))
        views.append(StepView(step, "prefill" if step == 1 else "decode", list(new),
                              list(range(before, before + len(new))), before, len(cache),
                              list(tokens), trace.attention_weights[(layer, 0)], token))
        tokens.append(token)
    return views


def prefill_then_decode(model: Model, prompt, *, batch: int = 1):
    """Prefill `prompt` (the same prompt `batch` times, as one batch), pick each sequence's
    next token greedily, and run one decode step. Returns (prefill_trace, decode_trace,
    next_token) with attention weights kept in both traces."""
    ids = [int(t) for t in check_token_ids(model.config, prompt)]
    positive_int("batch", batch)
    caches = [model.new_cache(len(ids) + 1) for _ in range(batch)]
    pre, dec = Trace(), Trace()
    logits = forward_batch(model, [ids] * batch, caches, trace=pre)
    token = greedy(logits[0][-1])
    forward_batch(model, [[token]] * batch, caches, trace=dec)
    return pre, dec, token
