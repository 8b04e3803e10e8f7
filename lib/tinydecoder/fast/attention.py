"""Attention on the fast path in numpy (what runs without numba, and for shapes the compiled
kernels do not take): the queries of B sequences over their visible keys in batched products,
without copying K or V (`attend`), and one query over a long cache in two GEMMs (`attend_one_query`).
The same numbers as `core.ops.attention` (tests/core/test_ops.py)."""
from __future__ import annotations

import math

import numpy as np

from . import tunables

QUERY_BLOCK = tunables.QUERY_BLOCK  # a long prefill attends in blocks of this many queries


def attend(q, k, v):
    """Causal attention of S new queries per sequence over T visible keys, B sequences at once.

    q: [B, S, Hq, d] (the last S of the T positions); k, v: [B, Hkv, T, d] (views are fine)
    -> [B*S, Hq*d]. Each KV head's g = Hq/Hkv query heads are stacked into one [g*S, d]
    matrix, so QK^T and PV are one batched matmul each over [B, Hkv] without copying K or V.
    More than QUERY_BLOCK queries run block by block, each against the keys it can see."""
    B, S, Hq, d = q.shape
    T, Hkv = k.shape[2], k.shape[1]
    g = Hq // Hkv
    if S <= QUERY_BLOCK:  # a decode step or a short chunk: one block
        return _attend_block(q, k, v, g).reshape(B * S, Hq * d)
    out = np.empty((B, S, Hq * d), q.dtype)
    for a in range(0, S, QUERY_BLOCK):
        b = min(a + QUERY_BLOCK, S)
        visible = T - S + b  # keys 0 .. the position of query b-1
        out[:, a:b] = _attend_block(q[:, a:b], k[:, :, :visible], v[:, :, :visible], g)
    return out.reshape(B * S, Hq * d)


def attend_one_query(q, k, v):
    """One query position of one sequence over T cached positions, as two GEMMs over all KV
    heads at once.  q: [Hq, d]; k, v: [T, Hkv, d] (the KVCache's own layout)  -> [1, Hq*d].

    A [Hq, Hkv*d] query matrix holds query head j's q (scaled) in the columns of its KV head and
    zeros elsewhere; times K seen as [Hkv*d, T] it gives every head's scores [Hq, T] in one call,
    and the weights [Hq, T] times V [T, Hkv*d] give [Hq, Hkv*d], of which head j keeps its KV
    head's d columns. It multiplies Hkv times more numbers than needed (the zeros), but in two
    calls over T positions instead of 2*Hkv calls of g rows, and its row-wise softmax reads
    contiguous rows. Faster than `attend` from ONE_QUERY_GEMM_FROM keys on (tunables.py)."""
    Hq, d = q.shape
    T, Hkv = k.shape[0], k.shape[1]
    heads = np.arange(Hq)
    kv_of = heads // (Hq // Hkv)  # [Hq]: the KV head each query head reads
    q_wide = np.zeros((Hq, Hkv, d), q.dtype)  # [Hq, Hkv*d] once reshaped
    q_wide[heads, kv_of] = q * q.dtype.type(1.0 / math.sqrt(d))
    scores = q_wide.reshape(Hq, Hkv * d) @ k.reshape(T, Hkv * d).T  # [Hq, T]
    scores -= scores.max(axis=1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=1, keepdims=True)  # the weights, in place
    both = (scores @ v.reshape(T, Hkv * d)).reshape(Hq, Hkv, d)  # [Hq, Hkv, d]
    return both[heads, kv_of].reshape(1, Hq * d)  # each head's own KV head's block


def _attend_block(q, k, v, g):
    """One block: q [B, S, Hq, d], k, v [B, Hkv, T, d] -> [B, S, Hq*d]."""
    B, S, Hq, d = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    scale = q.dtype.type(1.0 / math.sqrt(d))
    qg = q.reshape(B, S, Hkv, g, d).transpose(0, 2, 3, 1, 4) * scale  # [B, Hkv, g, S, d]
    scores = qg.reshape(B, Hkv, g * S, d) @ k.swapaxes(-1, -2)  # [B, Hkv, g*S, T]
    if S > 1:  # the causal triangle, over the last S keys only (older keys are visible to all)
        past = T - S
        future = np.arange(S)[None, :] > np.arange(S)[:, None]  # [S, S]
        scores.reshape(B, Hkv, g, S, T)[..., past:][..., future] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)  # the weights, in place
    out = scores @ v  # [B, Hkv, g*S, d]
    return out.reshape(B, Hkv, g, S, d).transpose(0, 3, 1, 2, 4).reshape(B, S, Hq * d)
