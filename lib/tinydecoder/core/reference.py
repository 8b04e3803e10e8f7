"""The decoder, the readable way: weights in a dataclass, one block, one forward pass for
prefill and decode alike. (The same arithmetic, made fast, is `fast/forward_pass.py`; tests prove them equal.)

    x = embed[ids] (+ pos_table[positions])                      # [S, D]
    for each layer:                                              # pre-norm block
        h = rmsnorm(x);  q, k, v = h Wq, h Wk, h Wv              # (+ RoPE on q, k)
        K, V = cache.append(k, v)                                # past + new, [T, Hkv, d]
        x = x + attention(q, K, V) Wo
        x = x + swiglu(rmsnorm(x), Wgate, Wup) Wdown
    logits = rmsnorm(x) W_head                                   # [S, V]

Prefill feeds the whole prompt (S rows); a decode step feeds one new token (S = 1) and reads
everything else from the cache. It is the same code: only the shapes differ.
"""
from __future__ import annotations

import numpy as np

from .cache import LayerKV, check_cache
from .kernels import LIBRARY, Kernels
from .model import LayerWeights, Model
from .ops import attention, rmsnorm, silu, swiglu
from .trace import Trace
from .validate import check_context, check_positions, check_token_ids, layer_index


def embed_tokens(model: Model, ids, positions) -> np.ndarray:
    """Each id's row of the embedding table, plus its position's row when the model has a
    position table (a RoPE model adds positions inside attention instead).  -> [N, D]"""
    x = model.embed[ids]  # [N, D]
    if model.config.position == "table":
        x = x + model.pos_table[positions]
    return x


def decoder_block(layer: LayerWeights, x, positions, kv: LayerKV, *, last_only=False, kernels: Kernels = LIBRARY,
                  trace=None, record=None, ffn=None):
    """One pre-norm block for one sequence.  x [S, D] -> [S, D] ([1, D] with last_only).

    `kv` is one layer of a cache (`cache.layer(l)`): the new keys and values are appended to
    it and attention reads all of them. last_only: only the last row goes on past attention
    (its query, attention, output projection and FFN); keys and values are made for all rows.
    `kernels` supplies softmax, attention and RoPE (a learner's own, or the lessons' broken
    ones); `trace` (a Trace) and `record` (a dict, filled with every intermediate) are for
    looking inside. `ffn(l, layer, z)` -> [Sq, D], when given, replaces the dense SwiGLU
    feed-forward of layer l (e.g. a mixture of experts); None is the dense one."""
    cfg = kv.config
    Hq, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    h = rmsnorm(x, layer.attn_norm, cfg.norm_eps)  # [S, D]
    hq = h[-1:] if last_only else h  # the rows that ask (query)
    q = (hq @ layer.wq).reshape(-1, Hq, d)  # [Sq, Hq, d]
    k = (h @ layer.wk).reshape(-1, Hkv, d)  # [S, Hkv, d]
    v = (h @ layer.wv).reshape(-1, Hkv, d)  # [S, Hkv, d]
    if cfg.position == "rope":
        q = kernels.rotate(q, positions[-len(q):], cfg.rope_base, cfg.rope_layout)
        k = kernels.rotate(k, positions, cfg.rope_base, cfg.rope_layout)  # cached after rotation
    k_all, v_all = kv.append(k, v)  # [T, Hkv, d]: the past and these rows
    out = kernels.attend(q, k_all, v_all).reshape(len(q), Hq * d)  # [Sq, Hq*d]: heads side by side
    x1 = (x[-1:] if last_only else x) + out @ layer.wo  # [Sq, D]
    z = rmsnorm(x1, layer.ffn_norm, cfg.norm_eps)
    ffn_out = swiglu(z, layer.w_gate, layer.w_up) @ layer.w_down if ffn is None else ffn(kv.index, layer, z)
    x2 = x1 + ffn_out  # [Sq, D]
    if trace is not None or record is not None:
        look_inside(trace, record, kv, layer, x, h, hq, q, k, k_all, v_all, out, x1, z, x2)
    return x2


def forward(model: Model, token_ids, cache=None, *, last_only: bool = False, trace: Trace | None = None,
            positions=None, kernels: Kernels = LIBRARY, ffn=None) -> np.ndarray:
    """Logits [S, V] for S new tokens; with a cache, attend to its past and append the new K/V.

    last_only=True returns only the last position's logits [1, V], and the last layer
    computes queries, attention and FFN for that position alone (its K/V still for all).
    `positions` of the new tokens default to right after the cache (anything else is a
    position bug, which the lessons show); `kernels` replaces softmax, attention or RoPE (a
    learner's own functions, or the lessons' broken ones); `ffn(l, layer, z)` replaces every
    layer's feed-forward (see decoder_block)."""
    cfg = model.config
    ids = check_token_ids(cfg, token_ids)
    cache = model.new_cache(len(ids)) if cache is None else check_cache(cache, cfg, model.dtype)
    check_context(cfg, len(cache), len(ids))
    if positions is None:
        positions = np.arange(len(cache), len(cache) + len(ids))  # [S]
    else:  # a position table has max_context rows; RoPE turns any position
        positions = check_positions(positions, len(ids), cfg.max_context if cfg.position == "table" else None)
    if not isinstance(kernels, Kernels):
        raise TypeError(f"kernels must be a tinydecoder Kernels, got {type(kernels).__name__}")
    x = embed_tokens(model, ids, positions)  # [S, D]
    if trace is not None:
        trace.record(None, "embed", [(len(ids),)], x.shape)
    for l, layer in enumerate(model.layers):
        last = last_only and l == cfg.n_layers - 1  # earlier layers' rows feed later K/V
        x = decoder_block(layer, x, positions, LayerKV(cache, l, cfg), last_only=last, kernels=kernels,
                          trace=trace, ffn=ffn)
    h = rmsnorm(x, model.final_norm, cfg.norm_eps)
    logits = h @ model.lm_head  # [S, V]
    if trace is not None:
        trace.record(None, "final_norm", [x.shape], h.shape)
        trace.matmul(None, "lm_head", h.shape, model.lm_head.shape)
    return logits


def forward_batch(model: Model, batch, caches=None, *, last_only: bool = False, trace: Trace | None = None) -> list:
    """The reference for a batch: each sequence through `forward`, one after another. Returns a
    list of logits, one [S_i, V] per sequence, as `fast.forward_batch` does.

    With a trace, the ops are recorded the way one batched pass runs them (the fast path's
    layout): the rows of all sequences stacked for every projection, norm and the LM head (each
    weight read once for the batch), attention per sequence (`segment` = its index)."""
    caches = [None] * len(batch) if caches is None else list(caches)
    if len(caches) != len(batch):
        raise ValueError(f"{len(batch)} sequences but {len(caches)} caches")
    for cache, ids in zip(caches, batch):  # validate everything before any cache is touched
        if cache is not None:
            check_context(model.config, len(check_cache(cache, model.config, model.dtype)),
                          len(check_token_ids(model.config, ids)))
    traces = [None if trace is None else Trace(keep_weights=trace.keep_weights) for _ in batch]
    logits = [forward(model, ids, cache, last_only=last_only, trace=t) for ids, cache, t in zip(batch, caches, traces)]
    if trace is not None:
        stack_traces(trace, traces)
    return logits


def stack_traces(into: Trace, traces: list) -> None:
    """Record in `into` the batched pass whose sequences' own passes are `traces`."""
    for records in zip(*(t.ops for t in traces)):
        first = records[0]
        if first.op == "attention":
            for s, r in enumerate(records):
                into.record(r.layer, r.op, r.inputs, r.output, r.flops, segment=s)
            continue
        weight = 1 if first.op in MATMUL_OPS else None  # a matmul's second input is its weight
        inputs = [shape if i == weight else (sum(r.inputs[i][0] for r in records),) + tuple(shape[1:])
                  for i, shape in enumerate(first.inputs)]
        output = (sum(r.output[0] for r in records),) + tuple(first.output[1:])
        into.record(first.layer, first.op, inputs, output, sum(r.flops for r in records))
    for s, t in enumerate(traces):
        into.attention_weights.update({(l, s): w for (l, _), w in t.attention_weights.items()})


def layer_input(model: Model, token_ids, layer: int) -> np.ndarray:
    """The hidden state [S, D] entering block `layer` when token_ids are prefilled from scratch:
    the embedding (plus positions), then blocks 0 .. layer-1. Notebooks use it to look inside."""
    ids = check_token_ids(model.config, token_ids)
    layer = layer_index(layer, model.config.n_layers)
    positions = np.arange(len(ids))
    x = embed_tokens(model, ids, positions)  # [S, D]
    cache = model.new_cache(len(ids))
    for l in range(layer):
        x = decoder_block(model.layers[l], x, positions, cache.layer(l))
    return x


# ----------------------------------------------------------------------------- looking inside

MATMUL_OPS = ("q_proj", "k_proj", "v_proj", "o_proj", "ffn_gate", "ffn_up", "ffn_down", "lm_head")
LAYER_STEPS = ("input x", "attn_norm", "q_proj", "k_proj", "v_proj", "attention", "o_proj",
               "residual 1", "ffn_norm", "ffn_gate", "ffn_up", "swiglu", "ffn_down", "residual 2")


def look_inside(trace, record, kv, layer, x, h, hq, q, k, k_all, v_all, out, x1, z, x2):
    """What `decoder_block` computed, for a Trace (op shapes, FLOPs, attention weights) and/or a
    record dict (every intermediate by name, LAYER_STEPS, plus q, k, v per head and the weights).
    Only the attention weights and the FFN's two halves are computed again here."""
    cfg, l = kv.config, kv.index
    weights = attention(q, k_all, v_all, return_weights=True)[1]  # [Hq, Sq, T]
    gate, up = z @ layer.w_gate, z @ layer.w_up  # [Sq, F]
    hidden = silu(gate) * up
    if record is not None:
        q_proj, k_proj, v_proj = hq @ layer.wq, h @ layer.wk, h @ layer.wv  # before RoPE
        record.update(zip(LAYER_STEPS, (x, h, q_proj, k_proj, v_proj, out, out @ layer.wo, x1, z, gate, up,
                                        hidden, hidden @ layer.w_down, x2)))
        record.update(q=q, k=k, v=v_proj.reshape(k.shape), weights=weights)  # q, k after RoPE
    if trace is not None:
        trace_block_inputs(trace, l, cfg, h, hq, q, k, layer)
        trace_attention(trace, l, 0, q, k_all, weights)
        trace_block_outputs(trace, l, layer, out, z, hidden)


def trace_block_inputs(trace, l, cfg, h, hq, q, k, layer):
    trace.record(l, "attn_norm", [h.shape], h.shape)
    trace.matmul(l, "q_proj", hq.shape, layer.wq.shape)
    trace.matmul(l, "k_proj", h.shape, layer.wk.shape)
    trace.matmul(l, "v_proj", h.shape, layer.wv.shape)
    if cfg.position == "rope":
        trace.record(l, "rope", [q.shape, k.shape], q.shape)


def trace_attention(trace, l, s, q, k_all, weights):
    (S, Hq, d), T = q.shape, k_all.shape[0]
    trace.record(l, "attention", [q.shape, k_all.shape, k_all.shape], (S, Hq * d),
                 4 * Hq * S * T * d, segment=s)  # QK^T and PV: 2*Hq*S*T*d each
    if trace.keep_weights:
        trace.attention_weights[(l, s)] = weights  # [Hq, S, T]


def trace_block_outputs(trace, l, layer, out, z, hidden):
    trace.matmul(l, "o_proj", out.shape, layer.wo.shape)
    trace.record(l, "ffn_norm", [z.shape], z.shape)
    trace.matmul(l, "ffn_gate", z.shape, layer.w_gate.shape)
    trace.matmul(l, "ffn_up", z.shape, layer.w_up.shape)
    trace.record(l, "swiglu", [hidden.shape, hidden.shape], hidden.shape)
    trace.matmul(l, "ffn_down", hidden.shape, layer.w_down.shape)
