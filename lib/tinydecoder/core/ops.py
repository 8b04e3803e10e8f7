"""The operations of a decoder, one pure numpy function per idea.

Shapes: S = new positions, T = visible positions (past + new), Hq/Hkv = query/KV heads,
d = head width. Every function keeps the dtype of its input: a float32 array stays float32.
"""
from __future__ import annotations

import math

import numpy as np

from .validate import even_head_dim, heads_per_kv


def rmsnorm(x, weight=None, eps=1e-6):
    """x / sqrt(mean(x^2) + eps), times a learned weight when given.  x: [..., D]."""
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # [..., 1]
    out = x * scale
    return out if weight is None else out * weight


def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)), after subtracting the max so that exp never overflows.

    Entries of -inf get weight 0, as a causal mask needs."""
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))  # shifted: the largest entry becomes 0
    e /= np.sum(e, axis=axis, keepdims=True)  # in place: one large temporary fewer
    return e


def silu(x):
    """x * sigmoid(x) = x / (1 + exp(-x))."""
    return x / (1 + np.exp(-x))


def swiglu(x, w_gate, w_up):
    """SiLU(x W_gate) * (x W_up): the gated hidden layer of a Llama feed-forward.  -> [..., F]"""
    return silu(x @ w_gate) * (x @ w_up)


def causal_mask(n_queries, n_keys, dtype=np.float32):
    """Additive mask [S, T]: 0 where query i may see key j, -inf where j is in its future.

    The queries are the last S of T positions, so query i sits at position T - S + i and
    sees keys 0 .. T - S + i. In prefill (S = T) this is the lower triangle; in a decode
    step (S = 1) it is one row of zeros; in a chunk it is a rectangle with a triangle cut."""
    past = n_keys - n_queries
    future = np.arange(n_keys)[None, :] > (past + np.arange(n_queries))[:, None]
    mask = np.zeros(future.shape, dtype)
    mask[future] = -np.inf
    return mask


def attention(q, k, v, return_weights=False, softmax=softmax):
    """Causal grouped-query attention of S new queries over T visible keys, by its definition.

    q: [S, Hq, d]   the new positions' queries (they are the last S of the T positions)
    k, v: [T, Hkv, d] past + new keys and values; Hq must be a multiple of Hkv
    returns out [S, Hq * d] (and the weights [Hq, S, T] when asked).

        K, V = repeat_kv(k), repeat_kv(v)          query head h reads KV head h // (Hq / Hkv)
        scores = q K^T / sqrt(d) + mask            mask: -inf where a key is in the query's future
        out = softmax(scores) V                    per head; heads side by side

    Every score is computed and held ([Hq, S, T]); the fast path (`fast/forward_pass.py`) and
    `flash_attention` get the same numbers without holding them all."""
    S, Hq, d = q.shape
    T, Hkv, _ = k.shape
    n_rep = heads_per_kv(Hq, Hkv)
    if k.shape != v.shape or k.shape[2] != d or T < S:
        raise ValueError(f"attention needs q [S, Hq, d] and k, v [T, Hkv, d] with T >= S; got q {q.shape}, "
                         f"k {k.shape}, v {v.shape}")
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # [T, Hq, d]
    scale = 1 / math.sqrt(d)
    scores = (q * scale).transpose(1, 0, 2) @ k.transpose(1, 2, 0)  # [Hq, S, T]
    scores = scores + causal_mask(S, T, q.dtype)  # BEFORE softmax: masked keys get weight 0
    weights = softmax(scores)  # [Hq, S, T]
    out = (weights @ v.transpose(1, 0, 2)).transpose(1, 0, 2).reshape(S, Hq * d)  # [S, Hq*d]
    if return_weights:
        return out, weights
    return out


def repeat_kv(x, n_rep):
    """[T, Hkv, d] -> [T, Hkv * n_rep, d]: each KV head copied for the query heads it serves.

    GQA is multi-head attention with repeated K/V; this makes that explicit (tests use it)."""
    return np.repeat(x, n_rep, axis=1)


def rope_angles(positions, head_dim, base):
    """cos and sin of theta_i * pos for i < d/2, theta_i = base^(-2i/d).  -> two [S, d/2] float64."""
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # [d/2]
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # [S, d/2]
    return np.cos(angles), np.sin(angles)


def apply_rope(x, positions, base=10000.0, layout="halves"):
    """Rotate each pair of x's last axis by its position's angle.  x: [S, H, d] -> [S, H, d].

    layout "halves" pairs (x[i], x[i + d/2]) (Hugging Face); "interleaved" pairs
    (x[2i], x[2i+1]) (llama.cpp, Meta). A checkpoint's Q/K rows are laid out for one of them."""
    S, H, d = x.shape
    even_head_dim(d)
    if len(positions) != S:
        raise ValueError(f"apply_rope got {len(positions)} positions for {S} rows: one position per row")
    cos, sin = rope_angles(positions, d, base)
    cos = cos.astype(x.dtype)[:, None, :]  # [S, 1, d/2]
    sin = sin.astype(x.dtype)[:, None, :]
    if layout == "halves":
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out
    raise ValueError(f"RoPE layout must be 'halves' or 'interleaved', got {layout!r}")
