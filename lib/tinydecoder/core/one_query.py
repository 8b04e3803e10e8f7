"""Attention of one new query over a long KV cache, reading the cache once: the decode step's
attention in the fast path when numba is installed (`fast.forward` on float32 caches;
`attend_last_batch` for B sequences in a `BatchKVCache`, `fast.forward_batch`).

A decode step at context T reads every cached key and value once: 2 * T * Hkv * d numbers per
layer (SmolLM2 at T = 2,048: 3 MB a layer, 94 MB a step, a sixth of the weights). numpy's
batched products (`fast.attend`, `fast.attend_one_query`) multiply a single query row at a low
rate. Here the keys are walked once for the scores (numba), `ops.softmax` turns them into
weights (numpy's exp is vectorised), and the values are walked once for the output (numba):

    s_t = (q_j . k_t) / sqrt(d),   w_t = exp(s_t - max_t s_t) / sum_t exp(...),   out_j = sum_t w_t v_t

Each key or value row of a KV head is loaded once for the g query heads that read it. The work
is split by positions: a task walks a contiguous block of the cache, position after position,
every KV head of a position in turn (the order the cache lies in memory), and there are
TASKS_PER_THREAD tasks per numba thread; the tasks' partial outputs are summed at the end
(tasks of one KV head each, reading every Hkv-th row, were slower: tunables.py). Same numbers
as `ops.attention` for one query, up to the order of float32 sums (tests bound it).
"""
from __future__ import annotations

import math

import numpy as np

from . import skinny
from .ops import softmax

prange = range  # numba.prange once compiled (skinny.compiled)
TASKS_PER_THREAD = 2  # blocks of positions per numba thread (2 balance the threads; more read no faster)


def fits(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> bool:
    """Whether `attend_last(q, k, v)` applies: numba installed, float32, C-contiguous [T, Hkv, d] k and v."""
    return (skinny.available() and q.dtype == k.dtype == v.dtype == np.float32 and q.ndim == 2 and k.ndim == 3
            and k.shape == v.shape and k.flags.c_contiguous and v.flags.c_contiguous and q.shape[1] == k.shape[2]
            and q.shape[0] % k.shape[1] == 0 and k.shape[0] > 0)


def fits_batch(q: np.ndarray, k: np.ndarray, v: np.ndarray, T: int) -> bool:
    """Whether `attend_last_batch(q, k, v, T)` applies: numba installed, float32, q [B, Hq, d],
    C-contiguous k and v [B, Hkv, capacity, d] holding at least T positions."""
    return (skinny.available() and q.dtype == k.dtype == v.dtype == np.float32 and q.ndim == 3 and k.ndim == 4
            and k.shape == v.shape and k.flags.c_contiguous and v.flags.c_contiguous and q.shape[0] == k.shape[0]
            and q.shape[2] == k.shape[3] and q.shape[1] % k.shape[1] == 0 and 0 < T <= k.shape[2])


def attend_last_batch(q: np.ndarray, k: np.ndarray, v: np.ndarray, T: int) -> np.ndarray:
    """The newest query of each of B sequences over its first T cached positions, as
    `attend_last` for each. q: [B, Hq, d]; k, v: [B, Hkv, capacity, d], a `BatchKVCache`'s own
    arrays (whole: a [:, :, :T] view would reach numba as a strided array, and its loops would
    not vectorise; positions T and later are not read)  -> [B, Hq*d]. Tasks: (sequence, KV
    head), each reading its contiguous [T, d] block of keys, then of values, once."""
    if not fits_batch(q, k, v, T):
        raise ValueError(f"attend_last_batch needs float32 q [B, Hq, d] and C-contiguous float32 k, v "
                         f"[B, Hkv, capacity, d] with Hq a multiple of Hkv and 0 < T <= capacity, and numba; "
                         f"got q {q.dtype}{list(q.shape)}, k {k.dtype}{list(k.shape)}, "
                         f"v {v.dtype}{list(v.shape)}, T={T}")
    B, Hq, d = q.shape
    scores = np.empty((B, Hq, T), np.float32)  # [B, Hq, T]
    skinny.compiled(_scores_batch)(np.ascontiguousarray(q) * np.float32(1.0 / math.sqrt(d)), k, T, scores)
    weights = softmax(scores)
    out = np.empty((B, Hq, d), np.float32)
    skinny.compiled(_weighted_values_batch)(weights, v, T, out)
    return out.reshape(B, Hq * d)


def attend_last(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """One query position (the newest: it sees every cached position) of one sequence.
    q: [Hq, d]; k, v: [T, Hkv, d] (the KVCache's own layout)  -> [1, Hq*d]."""
    if not fits(q, k, v):
        raise ValueError(f"attend_last needs float32 q [Hq, d] and C-contiguous float32 k, v [T, Hkv, d] with "
                         f"Hq a multiple of Hkv, and numba; got q {q.dtype}{list(q.shape)}, "
                         f"k {k.dtype}{list(k.shape)}, v {v.dtype}{list(v.shape)}")
    Hq, d = q.shape
    parts = TASKS_PER_THREAD * skinny.threads()  # blocks of positions, one task each
    scores = np.empty((Hq, k.shape[0]), np.float32)  # [Hq, T]
    skinny.compiled(_scores)(np.ascontiguousarray(q) * np.float32(1.0 / math.sqrt(d)), k, scores, parts)
    weights = softmax(scores)  # in numpy: a scalar exp per score in numba costs more
    partial = np.empty((parts, Hq, d), np.float32)
    skinny.compiled(_weighted_values)(weights, v, partial)
    return partial.sum(axis=0).reshape(1, Hq * d)


def _scores(q, k, scores, parts):  # pragma: no cover - runs compiled by numba
    """scores[j, t] = q[j] . k[t, j // g]: each key row read once, for the g query heads of its
    KV head. Tasks: `parts` blocks of positions, split between numba's threads."""
    Hq, d = q.shape
    T, Hkv = k.shape[0], k.shape[1]
    g = Hq // Hkv
    for part in prange(parts):
        for t in range(part * T // parts, (part + 1) * T // parts):
            for h in range(Hkv):  # the position's KV heads lie side by side: read in memory order
                kt = k[t, h]
                for i in range(g):
                    qj = q[h * g + i]
                    s = np.float32(0.0)
                    for c in range(d):
                        s += qj[c] * kt[c]
                    scores[h * g + i, t] = s


def _weighted_values(weights, v, partial):  # pragma: no cover - runs compiled by numba
    """partial[part, j] = sum over the part's positions t of weights[j, t] v[t, j // g]: each
    value row read once for the g query heads of its KV head. Tasks: blocks of positions."""
    parts, Hq, d = partial.shape
    T, Hkv = v.shape[0], v.shape[1]
    g = Hq // Hkv
    for part in prange(parts):
        acc = np.zeros((Hq, d), np.float32)
        for t in range(part * T // parts, (part + 1) * T // parts):
            for h in range(Hkv):
                vt = v[t, h]
                for i in range(g):
                    w = weights[h * g + i, t]
                    for c in range(d):
                        acc[h * g + i, c] += w * vt[c]
        partial[part] = acc


def _scores_batch(q, k, T, scores):  # pragma: no cover - runs compiled by numba
    """scores[b, j, t] = q[b, j] . k[b, j // g, t] for t < T. Tasks: (sequence, KV head)."""
    B, Hq, d = q.shape
    Hkv = k.shape[1]
    g = Hq // Hkv
    for task in prange(B * Hkv):
        b, h = task // Hkv, task % Hkv
        for t in range(T):
            kt = k[b, h, t]
            for i in range(g):
                qj = q[b, h * g + i]
                s = np.float32(0.0)
                for c in range(d):
                    s += qj[c] * kt[c]
                scores[b, h * g + i, t] = s


def _weighted_values_batch(weights, v, T, out):  # pragma: no cover - runs compiled by numba
    """out[b, j] = sum over t < T of weights[b, j, t] v[b, j // g, t]. Tasks: (sequence, KV head)."""
    B, Hq, d = out.shape
    Hkv = v.shape[1]
    g = Hq // Hkv
    for task in prange(B * Hkv):
        b, h = task // Hkv, task % Hkv
        acc = np.zeros((g, d), np.float32)
        for t in range(T):
            vt = v[b, h, t]
            for i in range(g):
                w = weights[b, h * g + i, t]
                for c in range(d):
                    acc[i, c] += w * vt[c]
        for i in range(g):
            out[b, h * g + i] = acc[i]
