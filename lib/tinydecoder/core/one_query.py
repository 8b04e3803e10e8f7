"""Attention of the newest positions of one sequence over its KV cache, reading the cache once:
the fast path's attention for a decode step and for a few guesses checked at once (up to
ATTEND_ROWS_UP_TO rows, `fast.forward` on float32 caches, when numba is installed), and for B
sequences' decode step in a `BatchKVCache` (`attend_last_batch`).

A decode step at context T reads every cached key and value once: 2 * T * Hkv * d numbers per
layer (SmolLM2 at T = 2,048: 3 MB a layer, 94 MB a step, a sixth of the weights). numpy's
batched products (`fast.attend`) multiply so few query rows at a low rate, and each numpy call
around them costs microseconds. `attend_rows` is one compiled call:

    s_jt = (q_j . k_t) / sqrt(d),   w_jt = exp(s_jt - max_t s_jt) / sum_t exp(...),   out_j = sum_t w_jt v_t

where t runs over the positions query j may see (a guess sees the guesses before it, not those
after). Every query row that reads KV head h (its g heads, for each of the S new positions) is
computed together, so each key or value row is loaded once for all of them. The work is split
by positions: a task walks a contiguous block of the cache in memory order, with its own
softmax (its max, its sum of exponentials, its weighted values), and the blocks are merged at
the end as flash-decoding merges its splits (notebook 12). TASKS_PER_THREAD tasks per numba
thread. The softmax's exponentials are `vexp.exp_le0`, which LLVM vectorises. Same numbers as
`ops.attention`, up to the order of float32 sums and exp's last bits (tests bound it).
"""
from __future__ import annotations

import math

import numpy as np

from . import skinny
from .skinny import dot_rows

prange = range  # numba.prange once compiled (skinny.compiled)
INLINE = ("dot_rows", "_block_scores", "_block_softmax", "_merge", "vexp.exp_le0")  # compiled into the kernels (skinny.compiled)
exp_le0 = None  # vexp.exp_le0, a vectorisable exp(x <= 0), bound by skinny.compiled (vexp imports numba)
TASKS_PER_THREAD = 2  # blocks of positions per numba thread (2 balance the threads; more read no faster)


def fits_batch(q: np.ndarray, k: np.ndarray, v: np.ndarray, T: int) -> bool:
    """Whether `attend_last_batch(q, k, v, T)` applies: numba installed, float32, q [B, Hq, d],
    C-contiguous k and v [B, Hkv, capacity, d] holding at least T positions."""
    return (skinny.available() and q.dtype == k.dtype == v.dtype == np.float32 and q.ndim == 3 and k.ndim == 4
            and k.shape == v.shape and k.flags.c_contiguous and v.flags.c_contiguous and q.shape[0] == k.shape[0]
            and q.shape[2] == k.shape[3] and q.shape[1] % k.shape[1] == 0 and 0 < T <= k.shape[2])


def attend_last_batch(q: np.ndarray, k: np.ndarray, v: np.ndarray, T: int) -> np.ndarray:
    """The newest query of each of B sequences over its first T cached positions, as
    `attend_rows` with one row for each. q: [B, Hq, d]; k, v: [B, Hkv, capacity, d], a `BatchKVCache`'s own
    arrays (whole: a [:, :, :T] view would reach numba as a strided array, and its loops would
    not vectorise; positions T and later are not read)  -> [B, Hq*d]. One compiled call; its
    tasks are (sequence, KV head) pairs, each reading its contiguous [T, d] block of keys, then
    of values, once (`_attend_batch`)."""
    if not fits_batch(q, k, v, T):
        raise ValueError(f"attend_last_batch needs float32 q [B, Hq, d] and C-contiguous float32 k, v "
                         f"[B, Hkv, capacity, d] with Hq a multiple of Hkv and 0 < T <= capacity, and numba; "
                         f"got q {q.dtype}{list(q.shape)}, k {k.dtype}{list(k.shape)}, "
                         f"v {v.dtype}{list(v.shape)}, T={T}")
    B, Hq, d = q.shape
    out = np.empty((B, Hq, d), np.float32)
    skinny.compiled(_attend_batch)(np.ascontiguousarray(q), k, v, T, np.float32(1.0 / math.sqrt(d)), out)
    return out.reshape(B, Hq * d)


def fits_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> bool:
    """Whether `attend_rows(q, k, v)` applies: numba installed, float32, q [S, Hq, d] with
    0 < S <= T, C-contiguous k and v [T, Hkv, d], Hq a multiple of Hkv."""
    return (skinny.available() and q.dtype == k.dtype == v.dtype == np.float32 and q.ndim == 3 and k.ndim == 3
            and k.shape == v.shape and k.flags.c_contiguous and v.flags.c_contiguous and q.shape[2] == k.shape[2]
            and q.shape[1] % k.shape[1] == 0 and 0 < q.shape[0] <= k.shape[0])


def attend_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The S newest positions of one sequence (a decode step, or S guesses checked at once),
    causal: query s sees positions 0 .. T - S + s.  q: [S, Hq, d]; k, v: [T, Hkv, d], the
    KVCache's own layout, the S new positions included  -> [S, Hq*d].

    Every query row that reads KV head h (its g heads for each of the S positions) is computed
    together, so each cached key and value is loaded once for all of them."""
    if not fits_rows(q, k, v):
        raise ValueError(f"attend_rows needs float32 q [S, Hq, d] with 0 < S <= T and C-contiguous float32 k, v "
                         f"[T, Hkv, d] with Hq a multiple of Hkv, and numba; got q {q.dtype}{list(q.shape)}, "
                         f"k {k.dtype}{list(k.shape)}, v {v.dtype}{list(v.shape)}")
    S, Hq, d = q.shape
    T, Hkv = k.shape[0], k.shape[1]
    g = Hq // Hkv
    rows = (q.reshape(S, Hkv, g, d).transpose(1, 2, 0, 3) * np.float32(1.0 / math.sqrt(d))).reshape(Hq * S, d)
    out = np.empty((Hq * S, d), np.float32)  # rows as in `rows`: [Hkv, g, S, d]
    parts = min(T, TASKS_PER_THREAD * skinny.threads())
    merge = np.empty((parts, Hq * S, d + 2), np.float32)  # each part's weighted values, max and sum
    skinny.compiled(_attend_rows)(rows, k, v, S, merge, out)
    return out.reshape(Hkv, g, S, d).transpose(2, 0, 1, 3).reshape(S, Hq * d)


def _attend_rows(q, k, v, S, merge, out):  # pragma: no cover - runs compiled by numba
    """out[j] = softmax over t < T - S + 1 + j % S of (q[j] . k[t, h]), times v[t, h], for each
    row j of q (the S new positions of one query head are S rows in a row); rows h*G .. h*G + G - 1
    read KV head h. Tasks: blocks of positions, each with its own softmax (its max, its sum of
    exponentials, its weighted values: `merge`), merged at the end as flash-decoding merges its
    splits. (Outside the parallel loop: loops, not array expressions, for which numba would start
    threads each time; inside it they run on the task's own thread.)"""
    R, d = q.shape
    T, Hkv = k.shape[0], k.shape[1]
    G = R // Hkv
    parts = merge.shape[0]
    everyone = T - S + 1  # positions 0 .. T - S are seen by every row
    for part in prange(parts):
        a, b = part * T // parts, (part + 1) * T // parts
        scores = np.empty((R, max(b - a, 1)), np.float32)  # the part's scores, then weights
        acc = np.zeros((R, d), np.float32)  # its weighted values
        _block_scores(q, k, a, b, scores)
        _block_softmax(scores, a, b, everyone, S, merge[part])
        for t in range(a, b):  # weighted values: each value row read once
            for h in range(Hkv):
                vt = v[t, h]
                for j in range(h * G, h * G + G):
                    if t < everyone or t - everyone < j % S:  # (the modulo: only for the last S - 1)
                        w = scores[j, t - a]
                        row = acc[j]
                        for c in range(d):
                            row[c] += w * vt[c]
        merge[part, :, :d] = acc
    _merge(merge, out)


def _block_scores(q, k, a, b, scores):  # pragma: no cover - runs compiled by numba
    """scores[j, t - a] = q[j] . k[t, h] for positions a .. b-1, rows h*G .. h*G + G - 1 against KV
    head h: each key row read once, for the G rows of its KV head, in memory order (a position's KV
    heads lie side by side). Four or more rows per head: skinny's sweep of four rows per key
    (0.85-0.9x the time at 4-8 new rows); fewer: one dot product per row (0.86-0.93x at 1)."""
    R, d = q.shape
    Hkv = k.shape[1]
    G = R // Hkv
    if G >= 4:
        for t in range(a, b):
            for h in range(Hkv):
                dot_rows(q[h * G:h * G + G], k[t, h], scores[h * G:h * G + G], t - a, d)
    else:
        for t in range(a, b):
            for h in range(Hkv):
                kt = k[t, h]
                for j in range(h * G, h * G + G):
                    qj = q[j]
                    s = np.float32(0.0)
                    for c in range(d):
                        s += qj[c] * kt[c]
                    scores[j, t - a] = s


def _block_softmax(scores, a, b, everyone, S, merge):  # pragma: no cover - runs compiled by numba
    """Positions a .. b-1 of every row j: scores -> exp(score - the block's max) in place, over the
    positions the row may see; merge[j, d] = that max, merge[j, d + 1] = the sum of exponentials."""
    R, d = scores.shape[0], merge.shape[1] - 2
    for j in range(R):
        stop = min(b, everyone + j % S) - a
        top, total = np.float32(-np.inf), np.float32(0.0)
        if stop > 0:
            row = scores[j]
            top = row[0]
            for t in range(1, stop):
                top = max(top, row[t])
            for t in range(stop):
                e = exp_le0(row[t] - top)
                row[t] = e
                total += e
        merge[j, d], merge[j, d + 1] = top, total


def _merge(merge, out):  # pragma: no cover - runs compiled by numba
    """out[j] = sum over blocks of f * weighted values / sum over blocks of f * sum of exponentials,
    f = exp(the block's max - the overall max): each block's softmax rescaled to the overall one."""
    parts, R, d = merge.shape[0], merge.shape[1], merge.shape[2] - 2
    for j in range(R):
        top = merge[0, j, d]
        for part in range(1, parts):
            top = max(top, merge[part, j, d])
        total = np.float32(0.0)
        row = out[j]
        for c in range(d):
            row[c] = 0.0
        for part in range(parts):
            if merge[part, j, d + 1] > 0:  # a block with no position row j may see adds nothing
                f = np.exp(merge[part, j, d] - top)
                total += f * merge[part, j, d + 1]
                for c in range(d):
                    row[c] += f * merge[part, j, c]
        inv = np.float32(1.0) / total
        for c in range(d):
            row[c] *= inv


def _attend_batch(q, k, v, T, scale, out):  # pragma: no cover - runs compiled by numba
    """out[b, j] = softmax over t < T of scale * (q[b, j] . k[b, h, t]), times v[b, h, t], where
    h = j // g. Tasks: (sequence, KV head), each with the g query rows of that head: its scores
    (each key row read once for the g rows), their softmax, and the weighted values (each value
    row read once), all in the task's own arrays."""
    B, Hq, d = q.shape
    Hkv = k.shape[1]
    g = Hq // Hkv
    for task in prange(B * Hkv):
        b, h = task // Hkv, task % Hkv
        rows = q[b, h * g:h * g + g]  # [g, d]
        scores = np.empty((g, T), np.float32)
        for t in range(T):
            dot_rows(rows, k[b, h, t], scores, t, d)
        acc = np.zeros((g, d), np.float32)
        for i in range(g):
            row = scores[i]
            top = row[0]
            for t in range(1, T):
                top = max(top, row[t])
            total = np.float32(0.0)
            for t in range(T):
                e = exp_le0(scale * (row[t] - top))
                row[t] = e
                total += e
            inv = np.float32(1.0) / total
            for t in range(T):
                row[t] *= inv
        for t in range(T):
            vt = v[b, h, t]
            for i in range(g):
                w = scores[i, t]
                for c in range(d):
                    acc[i, c] += w * vt[c]
        for i in range(g):
            for c in range(d):
                out[b, h * g + i, c] = acc[i, c]
