"""The operations of a decoder, one pure numpy function per idea.

Shapes: S = new positions, T = visible positions (past + new), Hq/Hkv = query/KV heads,
d = head width. Every function keeps the dtype of its input: a float32 array stays float32.
"""
from __future__ import annotations

import math

import numpy as np


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
    e = np.exp(-x)
    if isinstance(e, np.ndarray):  # reuse the temporary (large fresh ones cost page faults)
        e += 1.0
        return np.divide(x, e, out=e)
    return x / (1.0 + e)


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


ATTENTION_BLOCK = 64  # a long prefill runs its queries in blocks of this many (see attention)


def attention(q, k, v, return_weights=False):
    """Causal grouped-query attention of S new queries over T visible keys.

    q: [S, Hq, d]   the new positions' queries (they are the last S of the T positions)
    k, v: [T, Hkv, d] past + new keys and values; Hq must be a multiple of Hkv
    returns out [S, Hq * d] (and the weights [Hq, S, T] when asked).

    Query head h reads KV head h // (Hq // Hkv). The group of query heads that shares a KV
    head is stacked into one matrix, so each KV head costs one BLAS matmul for QK^T and one
    for PV, with no copy of K or V.

    More than ATTENTION_BLOCK queries (a long prefill) run block by block, each block against
    only the keys its last query may see: the same result (masked keys get weight exactly 0
    either way; sums may round differently in the last bit), without computing and then
    masking most of the upper triangle of the S x T scores."""
    S, Hq, d = q.shape
    T, Hkv, _ = k.shape
    if S > ATTENTION_BLOCK and not return_weights:
        out = np.empty((S, Hq * d), q.dtype)
        for a in range(0, S, ATTENTION_BLOCK):
            b = min(a + ATTENTION_BLOCK, S)
            visible = T - S + b  # keys 0 .. position of query b-1
            out[a:b] = attention(q[a:b], k[:visible], v[:visible])
        return out
    g = Hq // Hkv
    qg = q.reshape(S, Hkv, g, d).transpose(1, 2, 0, 3).reshape(Hkv, g * S, d)  # [Hkv, g*S, d]
    scale = q.dtype.type(1.0 / math.sqrt(d))  # a float64 scalar here would promote everything
    scores = (qg * scale) @ k.transpose(1, 2, 0)  # [Hkv, g*S, T]
    scores = scores.reshape(Hkv, g, S, T)
    if S > 1:  # mask BEFORE softmax; past keys are visible to every new query, so only the
        scores[..., T - S:] += causal_mask(S, S, q.dtype)  # last S columns need the triangle
    weights = softmax(scores)  # [Hkv, g, S, T]
    out = weights.reshape(Hkv, g * S, T) @ v.transpose(1, 0, 2)  # [Hkv, g*S, d]
    out = out.reshape(Hkv, g, S, d).transpose(2, 0, 1, 3).reshape(S, Hq * d)  # [S, Hq*d]
    if return_weights:
        return out, weights.reshape(Hq, S, T)
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
