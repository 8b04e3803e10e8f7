"""The decoder: weights in a dataclass, and one forward pass for prefill and decode alike.

    x = embed[ids] (+ pos_table[positions])                      # [N, D]
    for each layer:                                              # pre-norm block
        h = rmsnorm(x);  q, k, v = h Wq, h Wk, h Wv              # (+ RoPE on q, k)
        K, V = cache.append(k, v)                                # past + new, [T, Hkv, d]
        x = x + attention(q, K, V) Wo
        x = x + swiglu(rmsnorm(x)) Wdown
    logits = rmsnorm(x) W_head                                   # [N, V]

Prefill feeds the whole prompt (N = S rows); a decode step feeds one new token (N = 1)
and reads everything else from the cache. It is the same code: only the shapes differ.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cache import KVCache
from .config import Config
from .ops import apply_rope, attention, rmsnorm, silu
from .trace import Trace


@dataclass
class LayerWeights:
    """One block's weights, laid out so that a projection is `x @ w` ([in, out])."""

    wq: np.ndarray  # [D, Hq*d]
    wk: np.ndarray  # [D, Hkv*d]
    wv: np.ndarray  # [D, Hkv*d]
    wo: np.ndarray  # [Hq*d, D]
    w_gate: np.ndarray  # [D, F]
    w_up: np.ndarray  # [D, F]
    w_down: np.ndarray  # [F, D]
    attn_norm: np.ndarray | None = None  # [D], when the config has norm_scale
    ffn_norm: np.ndarray | None = None  # [D]
    # Fused storage (a speed-up, same numbers): wq|wk|wv side by side and w_gate|w_up side by
    # side, the separate weights being column views of them, so a decode step runs one matmul
    # instead of three (and two), reading the same bytes. Left None, Model fills them in
    # (`fuse_projections`); the GGUF loader stores the weights fused to begin with.
    w_qkv: np.ndarray | None = None  # [D, Hq*d + 2*Hkv*d]
    w_gate_up: np.ndarray | None = None  # [D, 2F]


FUSED = {"w_qkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up")}


def fuse_projections(layer: LayerWeights) -> LayerWeights:
    """The same layer with w_qkv and w_gate_up filled (each one that is None is built by copying
    its parts side by side) and the separate weights made views of them."""
    w_qkv = layer.w_qkv if layer.w_qkv is not None else np.concatenate([layer.wq, layer.wk, layer.wv], axis=1)
    w_gate_up = layer.w_gate_up if layer.w_gate_up is not None else np.concatenate([layer.w_gate, layer.w_up], axis=1)
    a, b = layer.wq.shape[1], layer.wq.shape[1] + layer.wk.shape[1]
    F = layer.w_gate.shape[1]
    return LayerWeights(wq=w_qkv[:, :a], wk=w_qkv[:, a:b], wv=w_qkv[:, b:], wo=layer.wo,
                        w_gate=w_gate_up[:, :F], w_up=w_gate_up[:, F:], w_down=layer.w_down,
                        attn_norm=layer.attn_norm, ffn_norm=layer.ffn_norm, w_qkv=w_qkv, w_gate_up=w_gate_up)


def _check_fused(i: int, layer: LayerWeights) -> None:
    """A fused array must be exactly the side-by-side storage of its parts (they are views of it)."""
    for fused_name, part_names in FUSED.items():
        fused = getattr(layer, fused_name)
        if fused is None:
            continue
        start = 0
        for part_name in part_names:
            part = getattr(layer, part_name)
            window = fused[:, start:start + part.shape[1]]
            if part.shape != window.shape or part.strides != window.strides or \
                    part.__array_interface__["data"][0] != window.__array_interface__["data"][0]:
                raise ValueError(f"layers[{i}].{part_name} must be a view of layers[{i}].{fused_name} "
                                 f"(columns {start}..{start + part.shape[1]}); use fuse_projections(layer)")
            start += part.shape[1]
        if start != fused.shape[1]:
            raise ValueError(f"layers[{i}].{fused_name} has {fused.shape[1]} columns, its parts {start}")


@dataclass
class Model:
    config: Config
    embed: np.ndarray  # [V, D], a row per token id
    layers: list
    final_norm: np.ndarray | None = None  # [D]
    pos_table: np.ndarray | None = None  # [max_context, D] when config.position == "table"
    lm_head: np.ndarray | None = None  # [D, V]; the embedding transposed (a view) when tied

    def __post_init__(self):
        cfg = self.config
        if self.lm_head is None:
            if not cfg.tied_embeddings:
                raise ValueError("Model needs lm_head [D, V] unless config.tied_embeddings is True")
            self.lm_head = self.embed.T  # a view: no second copy of the table
        D, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
        q_width, kv_width = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        expect = {"embed": (self.embed, (V, D)), "lm_head": (self.lm_head, (D, V))}
        if cfg.position == "table":
            expect["pos_table"] = (self.pos_table, (cfg.max_context, D))
        if cfg.norm_scale:
            expect["final_norm"] = (self.final_norm, (D,))
        if len(self.layers) != cfg.n_layers:
            raise ValueError(f"config says n_layers={cfg.n_layers} but {len(self.layers)} layers were given")
        for i, layer in enumerate(self.layers):
            shapes = {"wq": (D, q_width), "wk": (D, kv_width), "wv": (D, kv_width), "wo": (q_width, D),
                      "w_gate": (D, F), "w_up": (D, F), "w_down": (F, D)}
            if cfg.norm_scale:
                shapes.update(attn_norm=(D,), ffn_norm=(D,))
            for name, shape in shapes.items():
                expect[f"layers[{i}].{name}"] = (getattr(layer, name), shape)
        for name, (array, shape) in expect.items():
            if array is None or tuple(array.shape) != shape:
                got = None if array is None else tuple(array.shape)
                raise ValueError(f"weight {name} has shape {got}, but the config needs {shape}")
        self.layers = [fuse_projections(layer) if layer.w_qkv is None or layer.w_gate_up is None
                       else layer for layer in self.layers]  # side-by-side storage (a copy, once)
        for i, layer in enumerate(self.layers):
            _check_fused(i, layer)

    @property
    def dtype(self):
        return self.embed.dtype

    def new_cache(self, capacity: int = 16) -> KVCache:
        return KVCache(self.config, self.dtype, capacity)

    @property
    def n_params(self) -> int:
        arrays = [self.embed, self.pos_table, self.final_norm]
        if not self.config.tied_embeddings:
            arrays.append(self.lm_head)
        for layer in self.layers:
            arrays += [a for name, a in vars(layer).items() if name not in FUSED]  # fused: views, count once
        return sum(a.size for a in arrays if a is not None)

    @property
    def nbytes(self) -> int:
        """Bytes of weights one forward pass reads (the tied head counted once)."""
        return self.n_params * self.dtype.itemsize


def check_token_ids(config: Config, token_ids) -> np.ndarray:
    """Validate a sequence of token ids; return it as a 1-D int64 array."""
    if isinstance(token_ids, (str, bytes)):
        raise TypeError("token ids must be a sequence of integers, got text; encode it with a tokenizer first")
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        raise ValueError(f"token ids must be a flat sequence of integers, got an array of shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("empty prompt: at least one token id is needed")
    if arr.dtype.kind == "O" and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in arr):
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        bad = next((t for t in arr.tolist() if not isinstance(t, int) or isinstance(t, bool)), arr[0])
        raise TypeError(f"token ids must be integers, got {bad!r} ({type(bad).__name__})")
    out_of_range = np.flatnonzero((arr < 0) | (arr >= config.vocab_size))
    if out_of_range.size:
        i = int(out_of_range[0])
        raise ValueError(f"token id {int(arr[i])} at position {i} is out of range: "
                         f"ids must be in 0..{config.vocab_size - 1} (vocab_size {config.vocab_size})")
    return arr.astype(np.int64, copy=False)


def check_context(config: Config, past: int, new: int) -> None:
    if past + new > config.max_context:
        raise ValueError(f"context too long: {past} cached + {new} new = {past + new} positions, "
                         f"but this model's context limit is {config.max_context}")


def embed_tokens(model: Model, ids, positions) -> np.ndarray:
    """Each id's row of the embedding table, plus its position's row when the model has a
    position table (a RoPE model adds positions inside attention instead).  -> [N, D]"""
    x = model.embed[ids]  # [N, D]
    if model.config.position == "table":
        x = x + model.pos_table[positions]
    return x


def layer_input(model: Model, token_ids, layer: int) -> np.ndarray:
    """The hidden state [S, D] entering block `layer` when token_ids are prefilled from scratch:
    the embedding (plus positions), then blocks 0 .. layer-1. Notebooks use it to look inside."""
    cfg = model.config
    ids = check_token_ids(cfg, token_ids)
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < cfg.n_layers:
        raise ValueError(f"layer {layer!r} is out of range: layers are 0..{cfg.n_layers - 1} (n_layers)")
    positions = np.arange(len(ids))
    x = embed_tokens(model, ids, positions)  # [S, D]
    cache, bounds = model.new_cache(len(ids)), np.array([0, len(ids)])
    for l in range(int(layer)):
        x = decoder_block(cfg, model.layers[l], l, x, positions, bounds, [cache])
    return x


def forward(model: Model, token_ids, cache: KVCache | None = None, *,
            last_only: bool = False, trace: Trace | None = None) -> np.ndarray:
    """Logits [S, V] for S new tokens; with a cache, attend to its past and append the new K/V.

    last_only=True returns only the last position's logits [1, V], and the last layer
    computes queries, attention and FFN for that position alone (its K/V still for all)."""
    return forward_batch(model, [token_ids], [cache], last_only=last_only, trace=trace)[0]


def forward_batch(model: Model, batch, caches=None, *, last_only=False, trace=None) -> list:
    """Several sequences in one pass: their rows are stacked for every projection and FFN
    (one matmul reads each weight once for the whole batch); attention runs per sequence
    against that sequence's own cache. Returns a list of logits, one [S_i, V] per sequence."""
    cfg = model.config
    caches = [None] * len(batch) if caches is None else list(caches)
    if len(caches) != len(batch):
        raise ValueError(f"{len(batch)} sequences but {len(caches)} caches")
    ids = [check_token_ids(cfg, t) for t in batch]
    pasts = []
    for cache, t in zip(caches, ids):  # validate everything before any cache is touched
        if cache is not None and not isinstance(cache, KVCache) and not hasattr(cache, "append"):
            raise TypeError(f"cache must be a KVCache (or None), got {type(cache).__name__}")
        if cache is not None:
            cache.check(cfg, model.dtype)
        past = 0 if cache is None else len(cache)
        check_context(cfg, past, len(t))
        pasts.append(past)
    caches = [model.new_cache(len(t)) if c is None else c for c, t in zip(caches, ids)]
    bounds = np.cumsum([0] + [len(t) for t in ids])  # rows of sequence s: bounds[s]:bounds[s+1]
    positions = np.concatenate([np.arange(p, p + len(t)) for p, t in zip(pasts, ids)])  # [N]

    x = embed_tokens(model, np.concatenate(ids), positions)  # [N, D]
    if trace is not None:
        trace.record(None, "embed", [(len(positions),)], x.shape)
    for l, layer in enumerate(model.layers):
        keep = bounds[1:] - 1 if (last_only and l == cfg.n_layers - 1) else None
        x = decoder_block(cfg, layer, l, x, positions, bounds, caches, keep, trace)
    h = rmsnorm(x, model.final_norm, cfg.norm_eps)
    logits = h @ model.lm_head  # [N, V]
    if trace is not None:
        trace.record(None, "final_norm", [x.shape], h.shape)
        trace.matmul(None, "lm_head", h.shape, model.lm_head.shape)
    if keep is not None:
        return [logits[s:s + 1] for s in range(len(ids))]
    return [logits[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def decoder_block(cfg, layer, l, x, positions, bounds, caches, keep=None, trace=None):
    """One pre-norm block.  x: [N, D] -> [N, D]; with `keep` (row indices), only those rows
    go on past attention: their queries, attention, output projection and FFN."""
    Hq, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    h = rmsnorm(x, layer.attn_norm, cfg.norm_eps)  # [N, D]
    hq = h if keep is None else h[keep]
    if keep is None:  # one matmul for Q, K and V: their weights sit side by side in w_qkv
        qkv = h @ layer.w_qkv  # [N, (Hq + 2*Hkv) * d]
        q, kv = qkv[:, :Hq * d], qkv[:, Hq * d:]
    else:  # queries of the kept rows only; keys and values of every row (they are cached)
        q, kv = hq @ layer.wq, h @ layer.w_qkv[:, Hq * d:]  # [Nq, Hq*d], [N, 2*Hkv*d]
    k, v = kv[:, :Hkv * d], kv[:, Hkv * d:]
    q = q.reshape(-1, Hq, d)  # [Nq, Hq, d]
    k = k.reshape(-1, Hkv, d)  # [N, Hkv, d]
    v = v.reshape(-1, Hkv, d)  # [N, Hkv, d]
    if cfg.position == "rope":
        q_pos = positions if keep is None else positions[keep]
        q = apply_rope(q, q_pos, cfg.rope_base, cfg.rope_layout)
        k = apply_rope(k, positions, cfg.rope_base, cfg.rope_layout)  # cached after rotation
    if trace is not None:
        _trace_qkv(trace, l, cfg, layer, h, hq, q, k)
    out = np.empty((q.shape[0], Hq * d), x.dtype)  # [Nq, Hq*d]
    for s, cache in enumerate(caches):
        a, b = bounds[s], bounds[s + 1]
        k_all, v_all = cache.append(l, k[a:b], v[a:b])  # [T, Hkv, d]
        qa, qb = (a, b) if keep is None else (s, s + 1)
        if trace is None:
            out[qa:qb] = attention(q[qa:qb], k_all, v_all)
        else:
            out[qa:qb], weights = attention(q[qa:qb], k_all, v_all, return_weights=True)
            _trace_attention(trace, l, s, q[qa:qb], k_all, weights)
    resid = x if keep is None else x[keep]
    x = resid + out @ layer.wo  # [Nq, D]
    z = rmsnorm(x, layer.ffn_norm, cfg.norm_eps)
    gate_up = z @ layer.w_gate_up  # [Nq, 2F]: gate and up in one matmul
    hidden = silu(gate_up[:, :cfg.d_ff])  # [Nq, F]: SwiGLU, silu(z Wgate) * (z Wup)
    hidden *= gate_up[:, cfg.d_ff:]
    y = x + hidden @ layer.w_down  # [Nq, D]
    if trace is not None:
        _trace_out(trace, l, layer, out, z, hidden)
    return y


def _trace_attention(trace, l, s, q, k_all, weights):
    (S, Hq, d), T = q.shape, k_all.shape[0]
    trace.record(l, "attention", [q.shape, k_all.shape, k_all.shape], (S, Hq * d),
                 4 * Hq * S * T * d, segment=s)  # QK^T and PV: 2*Hq*S*T*d each
    if trace.keep_weights:
        trace.attention_weights[(l, s)] = weights  # [Hq, S, T]


def _trace_qkv(trace, l, cfg, layer, h, hq, q, k):
    trace.record(l, "attn_norm", [h.shape], h.shape)
    trace.matmul(l, "q_proj", hq.shape, layer.wq.shape)
    trace.matmul(l, "k_proj", h.shape, layer.wk.shape)
    trace.matmul(l, "v_proj", h.shape, layer.wv.shape)
    if cfg.position == "rope":
        trace.record(l, "rope", [q.shape, k.shape], q.shape)


def _trace_out(trace, l, layer, out, z, hidden):
    trace.matmul(l, "o_proj", out.shape, layer.wo.shape)
    trace.record(l, "ffn_norm", [z.shape], z.shape)
    trace.matmul(l, "ffn_gate", z.shape, layer.w_gate.shape)
    trace.matmul(l, "ffn_up", z.shape, layer.w_up.shape)
    trace.record(l, "swiglu", [hidden.shape, hidden.shape], hidden.shape)
    trace.matmul(l, "ffn_down", hidden.shape, layer.w_down.shape)
