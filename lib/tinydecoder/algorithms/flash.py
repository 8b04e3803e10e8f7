"""FlashAttention in numpy: attention that walks the keys block by block (notebook 12).

Softmax needs the max and the sum of a whole row of scores, yet it can be computed one block of
keys at a time. Keep, for every query, a running max m, a running sum row_sum = sum exp(score - m) and
an accumulator acc = sum exp(score - m) * v. When a block raises the max from m to m', the old
row_sum and acc are multiplied by exp(m - m') (they were summed relative to the old max), then
the block's terms are added. After the last block, out = acc / row_sum and log-sum-exp =
m + log(row_sum). (The papers call the running sum l; here l is the layer index throughout.)
No [S, T] matrix of scores ever exists: the queries, too, go in blocks, so a tile of
[Hq, block, block] scores is the largest temporary.

Conventions are those of `ops.attention`: causal, grouped-query, q [S, Hq, d], k, v [T, Hkv, d],
the queries being the last S of the T positions. `merge_partials` combines two results computed
over disjoint sets of keys (a cached prefix and a new chunk; splits of a long cache).
The lesson-only counters of notebook 12 (bytes moved between slow and on-chip memory, the peak
memory of a call) are in `lessons/flash_lab.py`.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.validate import is_int


def _check_int(name, value, minimum=None):
    if not is_int(value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def _check_qkv(q, k, v):
    """Shapes S, Hq, d, T, Hkv of attention's inputs, or a ValueError saying what is wrong."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, np.ndarray) or x.ndim != 3 or x.dtype.kind != "f":
            raise ValueError(f"{name} must be a 3-D float numpy array ([positions, heads, head_dim]), "
                             f"got {type(x).__name__} with shape {getattr(x, 'shape', None)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must share one dtype (no silent promotion), got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    S, Hq, d = q.shape
    T, Hkv, dk = k.shape
    if v.shape != k.shape:
        raise ValueError(f"k and v must have the same shape [T, Hkv, d], got {k.shape} and {v.shape}")
    if dk != d:
        raise ValueError(f"q and k must have the same head_dim, got {d} and {dk}")
    if S < 1 or T < 1:
        raise ValueError(f"need at least one query and one key, got S={S}, T={T}")
    if Hq % Hkv:
        raise ValueError(f"the number of query heads ({Hq}) must be a multiple of the number of "
                         f"KV heads ({Hkv}): each KV head serves the same number of query heads")
    return S, Hq, d, T, Hkv


def online_update(m, row_sum, acc, scores, values):
    """Fold one block of keys into the running (max, sum, accumulator) of some rows of queries.

    m, row_sum: [..., R, 1]   running max and sum of exp(score - m) of R query rows
    acc:  [..., R, dv]  running sum of exp(score - m) * value
    scores: [..., R, B] this block's scores (-inf where masked); values: [..., B, dv]
    returns the new (m, row_sum, acc) and alpha [..., R, 1], the factor the old row_sum and acc
    were rescaled by.
    A row that has seen no visible key yet keeps m = -inf, row_sum = 0, acc = 0 (no NaN from -inf - -inf)."""
    m_new = np.maximum(m, scores.max(axis=-1, keepdims=True))
    shift = np.where(np.isneginf(m_new), m_new.dtype.type(0), m_new)  # -inf only if nothing seen
    alpha = np.exp(m - shift)  # exp(m_old - m_new) <= 1: the old terms shrink when the max grows
    p = np.exp(scores - shift)  # [..., R, B] this block's unnormalised weights, each <= 1
    row_sum = alpha * row_sum + p.sum(axis=-1, keepdims=True)
    acc = alpha * acc + p @ values  # [..., R, dv]
    return m_new, row_sum, acc, alpha


def _finish(m, row_sum, acc):
    """out = acc / row_sum and lse = m + log(row_sum); a row that saw no key gets out 0, lse -inf."""
    seen = row_sum > 0
    out = np.divide(acc, row_sum, out=np.zeros_like(acc), where=seen)
    lse = np.full_like(m, -np.inf)
    np.add(m, np.log(row_sum, out=np.zeros_like(row_sum), where=seen), out=lse, where=seen)
    return out, lse


def flash_attention(q, k, v, block_size=64, query_start=None):
    """Causal grouped-query attention in tiles of `block_size` queries x `block_size` keys.

    q: [S, Hq, d]; k, v: [T, Hkv, d]; Hq a multiple of Hkv (query head h reads KV head h // (Hq//Hkv)).
    query_start: the position of the first query, counted from the first key given; by default
      T - S (the queries are the last S of the T positions, as in `attention`). A larger value
      lets every query see every key (keys of a cached prefix); a smaller one hides keys from
      queries, and a query that sees no key gets out 0 and lse -inf (see merge_partials).
    returns out [S, Hq * d] (equal to `attention(q, k, v)`) and lse [Hq, S], the log-sum-exp of
      each query's scaled, masked scores.
    Besides out and lse, it holds only one tile's worth of temporaries: [Hq, block, block] scores
    and [Hq, block, d] running state, however long S and T are."""
    S, Hq, d, T, Hkv = _check_qkv(q, k, v)
    block_size = _check_int("block_size", block_size, minimum=1)
    if query_start is None:
        if S > T:
            raise ValueError(f"S={S} queries cannot be the last S of only T={T} positions "
                             "(pass query_start to place them elsewhere)")
        query_start = T - S
    query_start = _check_int("query_start", query_start)
    out = np.empty((S, Hq * d), q.dtype)
    lse = np.empty((Hq, S), q.dtype)
    for a in range(0, S, block_size):  # one block of queries at a time, each against all its keys
        b = min(a + block_size, S)
        out[a:b], lse[:, a:b] = _query_block_attention(q[a:b], k, v, block_size, query_start + a)
    return out, lse


def _query_block_attention(q, k, v, block_size, query_start):
    """A block of queries against the keys, `block_size` keys at a time (flash_attention's tile loop).

    q: [S, Hq, d] at positions query_start .. query_start + S - 1; k, v: [T, Hkv, d] at 0 .. T-1.
    returns out [S, Hq * d], lse [Hq, S]. All S queries and all heads go through each key block
    together: the largest temporary is the block's scores [Hkv, g*S, block] (g = Hq // Hkv)."""
    S, Hq, d = q.shape
    T, Hkv, _ = k.shape
    g = Hq // Hkv
    dtype = q.dtype
    scale = dtype.type(1.0 / math.sqrt(d))  # a float64 scalar here would promote everything
    qg = (q * scale).reshape(S, Hkv, g, d).transpose(1, 2, 0, 3).reshape(Hkv, g * S, d)  # [Hkv, g*S, d]
    query_pos = np.tile(query_start + np.arange(S), g)  # [g*S] position of each stacked query row
    m = np.full((Hkv, g * S, 1), -np.inf, dtype)  # running max
    row_sum = np.zeros((Hkv, g * S, 1), dtype)  # running sum of exp(score - m)
    acc = np.zeros((Hkv, g * S, d), dtype)  # running sum of exp(score - m) * v
    end = min(T, query_start + S)  # no query sees the keys from here on: skip them
    for start in range(0, max(end, 0), block_size):
        stop = min(start + block_size, end)
        scores = qg @ k[start:stop].transpose(1, 2, 0)  # [Hkv, g*S, B]
        if stop - 1 > query_start:  # the block reaches into some query's future
            future = np.arange(start, stop)[None, :] > query_pos[:, None]  # [g*S, B]
            scores[:, future] = -np.inf
        m, row_sum, acc, _ = online_update(m, row_sum, acc, scores, v[start:stop].transpose(1, 0, 2))
    out, lse = _finish(m, row_sum, acc)  # [Hkv, g*S, d], [Hkv, g*S, 1]
    out = out.reshape(Hkv, g, S, d).transpose(2, 0, 1, 3).reshape(S, Hq * d)  # [S, Hq*d]
    return out, lse.reshape(Hq, S)


def _check_partial(name, part):
    if not isinstance(part, tuple) or len(part) != 2:
        raise ValueError(f"{name} must be a pair (out [S, Hq*d], lse [Hq, S]), got {type(part).__name__}")
    out, lse = part
    if not (isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)) or out.ndim != 2 or lse.ndim != 2:
        raise ValueError(f"{name} must be (out [S, Hq*d], lse [Hq, S]) numpy arrays, got shapes "
                         f"{getattr(out, 'shape', None)} and {getattr(lse, 'shape', None)}")
    Hq, S = lse.shape
    if out.shape[0] != S or out.shape[1] % Hq:
        raise ValueError(f"{name}: out {out.shape} does not fit lse {lse.shape} "
                         "(need out [S, Hq*d] with lse [Hq, S])")
    return out, lse


def merge_partials(part1, part2):
    """The attention over two disjoint sets of keys, from the results over each set.

    part = (out [S, Hq*d], lse [Hq, S]) as flash_attention returns. Each out is a softmax-weighted
    average over its own keys; the merged one weighs part i by exp(lse_i - lse), where
    lse = log(exp(lse1) + exp(lse2)) is the merged log-sum-exp. Associative and commutative,
    so any split of the keys, merged in any order, gives the one-pass result (to rounding).
    A query that saw no key in one part (lse -inf, out 0) takes the other part as it is."""
    o1, lse1 = _check_partial("part1", part1)
    o2, lse2 = _check_partial("part2", part2)
    if o1.shape != o2.shape or lse1.shape != lse2.shape:
        raise ValueError(f"the two parts must have the same shapes, got out {o1.shape} vs {o2.shape}, "
                         f"lse {lse1.shape} vs {lse2.shape}")
    Hq, S = lse1.shape
    d = o1.shape[1] // Hq
    lse = np.logaddexp(lse1, lse2)  # [Hq, S]; -inf only where neither part saw a key
    shift = np.where(np.isneginf(lse), lse.dtype.type(0), lse)
    w1 = np.exp(lse1 - shift).T[:, :, None]  # [S, Hq, 1] share of part 1 (0 where it saw nothing)
    w2 = np.exp(lse2 - shift).T[:, :, None]
    out = w1 * o1.reshape(S, Hq, d) + w2 * o2.reshape(S, Hq, d)  # [S, Hq, d]
    return out.reshape(S, Hq * d), lse


def online_softmax_steps(scores, values, block_size):
    """One query row's online softmax, block by block, for looking at each step.

    scores: [T] the row's scaled (and masked) scores; values: [T, dv]
    returns one dict per block: keys_seen, m (running max), row_sum (running sum of
    exp(score - m)), alpha (rescale of the previous row_sum and acc), out (acc / row_sum: the
    attention over the keys seen so far)."""
    scores = np.asarray(scores)
    values = np.asarray(values)
    if scores.ndim != 1 or scores.dtype.kind != "f" or scores.size < 1:
        raise ValueError(f"scores must be a non-empty 1-D float array [T], got shape {scores.shape}")
    if values.ndim != 2 or values.shape[0] != scores.shape[0]:
        raise ValueError(f"values must be [T, dv] with T={scores.shape[0]}, got shape {values.shape}")
    block_size = _check_int("block_size", block_size, minimum=1)
    dtype = np.result_type(scores.dtype, values.dtype)
    m = np.full((1, 1), -np.inf, dtype)
    row_sum = np.zeros((1, 1), dtype)
    acc = np.zeros((1, values.shape[1]), dtype)
    steps = []
    for start in range(0, scores.shape[0], block_size):
        stop = min(start + block_size, scores.shape[0])
        m, row_sum, acc, alpha = online_update(m, row_sum, acc, scores[None, start:stop].astype(dtype),
                                         values[start:stop].astype(dtype))
        out, _ = _finish(m, row_sum, acc)
        steps.append({"keys_seen": stop, "m": float(m[0, 0]), "row_sum": float(row_sum[0, 0]),
                      "alpha": float(alpha[0, 0]), "out": out[0]})
    return steps
