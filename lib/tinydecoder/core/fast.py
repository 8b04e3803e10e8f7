"""The fast path: the arithmetic of `model.decoder_block`, arranged for speed.

- fused projections: one matmul for Q|K|V and one for gate|up (the weights are stored side by
  side), their outputs split where they are used;
- batched rows: several sequences' rows stacked, so each weight is read once for the batch;
- the last layer of `last_only` computes queries, attention and FFN for the last rows alone;
- glibc's malloc keeps freed memory for the next layer's temporaries (`retain_freed_memory`).

The readable reference is `model.forward`; tests/core/test_fast.py proves the two equal on
models whose weights are not shared. Everything the library runs for speed (generation,
serving, benchmarks) calls this module.
"""
from __future__ import annotations

import functools

import numpy as np

from .cache import check_cache
from .model import (
    Model,
    check_context,
    check_token_ids,
    embed_tokens,
    trace_attention,
    trace_block_inputs,
    trace_block_outputs,
)
from .ops import apply_rope, attention, rmsnorm, silu


def forward_fast(model: Model, token_ids, cache=None, *, last_only: bool = False) -> np.ndarray:
    """`model.forward` for one sequence, on the fast path: logits [S, V] ([1, V] with last_only)."""
    return forward_batch(model, [token_ids], [cache], last_only=last_only)[0]


def forward_batch(model: Model, batch, caches=None, *, last_only=False, trace=None) -> list:
    """Several sequences in one pass: their rows are stacked for every projection and FFN
    (one matmul reads each weight once for the whole batch); attention runs per sequence
    against that sequence's own cache. Returns a list of logits, one [S_i, V] per sequence."""
    cfg = model.config
    if model.dtype == np.float32:  # a real-size model: its temporaries are worth keeping
        tune_allocator_once()
    caches = [None] * len(batch) if caches is None else list(caches)
    if len(caches) != len(batch):
        raise ValueError(f"{len(batch)} sequences but {len(caches)} caches")
    ids = [check_token_ids(cfg, t) for t in batch]
    pasts = []
    for cache, t in zip(caches, ids):  # validate everything before any cache is touched
        past = 0 if cache is None else len(check_cache(cache, cfg, model.dtype))
        check_context(cfg, past, len(t))
        pasts.append(past)
    caches = [model.new_cache(len(t)) if c is None else c for c, t in zip(caches, ids)]
    bounds = np.cumsum([0] + [len(t) for t in ids])  # rows of sequence s: bounds[s]:bounds[s+1]
    positions = np.concatenate([np.arange(p, p + len(t)) for p, t in zip(pasts, ids)])  # [N]

    x = embed_tokens(model, np.concatenate(ids), positions)  # [N, D]
    if trace is not None:
        trace.record(None, "embed", [(len(positions),)], x.shape)
    keep = None
    for l, layer in enumerate(model.layers):
        keep = bounds[1:] - 1 if (last_only and l == cfg.n_layers - 1) else None
        x = fast_block(cfg, layer, l, x, positions, bounds, caches, keep, trace)
    h = rmsnorm(x, model.final_norm, cfg.norm_eps)
    logits = h @ model.lm_head  # [N, V]
    if trace is not None:
        trace.record(None, "final_norm", [x.shape], h.shape)
        trace.matmul(None, "lm_head", h.shape, model.lm_head.shape)
    if keep is not None:
        return [logits[s:s + 1] for s in range(len(ids))]
    return [logits[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def fast_block(cfg, layer, l, x, positions, bounds, caches, keep=None, trace=None):
    """One pre-norm block over the stacked rows of several sequences.  x: [N, D] -> [N, D];
    with `keep` (row indices), only those rows go on past attention."""
    Hq, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    h = rmsnorm(x, layer.attn_norm, cfg.norm_eps)  # [N, D]
    hq = h if keep is None else h[keep]
    if keep is None:  # one matmul for Q, K and V, split afterwards
        q, k, v = np.split(h @ layer.w_qkv, [cfg.q_width, cfg.q_width + cfg.kv_width], axis=1)
    else:  # queries of the kept rows only; keys and values of every row (they are cached)
        q = hq @ layer.wq  # [Nq, Hq*d]
        k, v = np.split(h @ layer.w_qkv[:, cfg.q_width:], 2, axis=1)  # [N, Hkv*d] each
    q = q.reshape(-1, Hq, d)  # [Nq, Hq, d]
    k = k.reshape(-1, Hkv, d)  # [N, Hkv, d]
    v = v.reshape(-1, Hkv, d)  # [N, Hkv, d]
    if cfg.position == "rope":
        q_pos = positions if keep is None else positions[keep]
        q = apply_rope(q, q_pos, cfg.rope_base, cfg.rope_layout)
        k = apply_rope(k, positions, cfg.rope_base, cfg.rope_layout)  # cached after rotation
    if trace is not None:
        trace_block_inputs(trace, l, cfg, h, hq, q, k, layer)
    out = np.empty((q.shape[0], Hq * d), x.dtype)  # [Nq, Hq*d]
    for s, cache in enumerate(caches):
        a, b = bounds[s], bounds[s + 1]
        k_all, v_all = cache.append(l, k[a:b], v[a:b])  # [T, Hkv, d]
        qa, qb = (a, b) if keep is None else (s, s + 1)
        if trace is None:
            out[qa:qb] = attention(q[qa:qb], k_all, v_all)
        else:
            out[qa:qb], weights = attention(q[qa:qb], k_all, v_all, return_weights=True)
            trace_attention(trace, l, s, q[qa:qb], k_all, weights)
    resid = x if keep is None else x[keep]
    x = resid + out @ layer.wo  # [Nq, D]
    z = rmsnorm(x, layer.ffn_norm, cfg.norm_eps)
    gate, up = np.split(z @ layer.w_gate_up, 2, axis=1)  # [Nq, F] each, one matmul
    hidden = silu(gate)  # SwiGLU: silu(z Wgate) * (z Wup)
    hidden *= up
    y = x + hidden @ layer.w_down  # [Nq, D]
    if trace is not None:
        trace_block_outputs(trace, l, layer, out, z, hidden)
    return y


def retain_freed_memory(trim_bytes: int = 256 << 20, mmap_bytes: int = 32 << 20) -> bool:
    """Ask glibc's malloc to keep freed memory for reuse (True if it could: Linux with glibc).

    A 500-token prefill allocates ~300 MB of short-lived numpy temporaries. By default glibc
    returns much of it to the OS between layers and page-faults it back in the next one
    (~78,000 page faults, a quarter of a second of system time per prefill here). This keeps
    up to `trim_bytes` of freed heap and serves allocations below `mmap_bytes` from it.
    It changes this process's allocator settings; `forward_batch` calls it once (see
    `tune_allocator_once`), the first time it runs a float32 model."""
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, int(mmap_bytes))) and \
            bool(libc.mallopt(M_TRIM_THRESHOLD, int(trim_bytes)))
    except (OSError, AttributeError):
        return False


@functools.cache
def tune_allocator_once() -> bool:
    """`retain_freed_memory()` on the first call only (it sets process-wide malloc options)."""
    return retain_freed_memory()
