"""Attention over a paged cache's blocks where they lie (`serving.paged`: a server's sequences),
for the fast path's passes: no gather of the cached positions.

A paged sequence keeps its K and V in a pool's blocks, position t in row table[t // B] * B + t % B
of the pool's blocks seen as rows. The pool's `append` returns every cached position gathered in
order, a copy per layer and sequence; here a pass takes its rows (`layer_rows`: the pool's
bookkeeping without the copy), writes the new K and V into them and attends through the block
table (compiled.few_queries.attend_rows_in_blocks; a prefill chunk of more rows: prefill_attention's
layout reads them there), with the gathered cache's numbers bit for bit:

    reads_blocks(cache, q)                           # does it apply to this sequence's query rows?
    attend_in_blocks(cache, l, q, k_new, v_new, out)  # one sequence (forward_batch's loop)
    in_one_pool(caches, q, rows, bounds)             # several sequences' few rows, of one pool ...
    attend_sequences(l, q, k, v, rows, caches, bounds)   # ... in one compiled call (compiled.paged_attention)

A pass over a few rows of a single paged sequence runs `fused.run_layers`, which reads the blocks the
same way.
"""
from __future__ import annotations

import numpy as np

from .compiled import few_queries, jit
from .tunables import ATTEND_ROWS_UP_TO


def reads_blocks(cache, q) -> bool:
    """Whether a paged sequence's attention for q [S, Hq, d] reads its K and V where its blocks lie
    (`attend_in_blocks`): numba, float32, blocks of a multiple of 8 positions. Else the pool's
    `append` gathers them."""
    return (hasattr(cache, "layer_rows") and cache.block_size % 8 == 0 and jit.available()
            and q.dtype == cache.dtype == np.float32 and q.shape[0] > 0 and q.shape[1] % cache.config.n_kv_heads == 0)


def attend_in_blocks(cache, l: int, q, k_new, v_new, out=None):
    """Layer l's attention of a paged sequence's new rows (`reads_blocks`): their K and V [S, Hkv, d]
    written into its blocks (`layer_rows`), then every cached position read in place, by
    few_queries (up to ATTEND_ROWS_UP_TO query rows) or prefill_attention -> [S, Hq*d] (into `out`
    when given), the numbers of the gathered cache bit for bit, without the gather."""
    k_rows, v_rows, table, B, start = cache.layer_rows(l, len(k_new))
    pos = np.arange(start, start + len(k_new))
    at = table[pos // B] * B + pos % B
    k_rows[at], v_rows[at] = k_new, v_new
    T = start + len(k_new)
    if q.shape[0] <= ATTEND_ROWS_UP_TO:
        got = few_queries.attend_rows_in_blocks(q, k_rows, v_rows, table, B, T)
        if out is None:
            return got
        out[...] = got
        return out
    from .compiled import prefill_attention  # imports numba: register tiles on every core

    return prefill_attention.attend_prefill(q, k_rows, v_rows, out, blocks=(table, B, T))


def in_one_pool(caches, q, rows, bounds) -> bool:
    """Whether several sequences attend in one call (`attend_sequences`): paged sequences of one
    pool, each one's query rows (all its new rows, or with `rows` its last) as `reads_blocks` takes."""
    pool = getattr(caches[0], "pool", None)
    rows_of = (lambda s: q[s:s + 1]) if rows is not None else (lambda s: q[bounds[s]:bounds[s + 1]])
    return len(caches) > 1 and all(getattr(c, "pool", None) is pool and reads_blocks(c, rows_of(s))
                                   and rows_of(s).shape[0] <= ATTEND_ROWS_UP_TO for s, c in enumerate(caches))


def attend_sequences(l: int, q, k, v, rows, caches, bounds):
    """Layer l's attention of several paged sequences of one pool (each `reads_blocks`), in one
    compiled call (compiled.paged_attention): each sequence's rows taken (`layer_rows`), then its
    new K and V written and its queries attended through its block table -> [Nq, Hq*d]."""
    from .compiled import paged_attention  # imports numba

    taken = [cache.layer_rows(l, int(b - a)) for cache, a, b in zip(caches, bounds[:-1], bounds[1:])]
    tables = np.zeros((len(taken), max(len(t[2]) for t in taken)), np.int64)  # padding past a table is never read
    for s, t in enumerate(taken):
        tables[s, :len(t[2])] = t[2]
    q_bounds = bounds if rows is None else np.arange(len(caches) + 1)
    k_rows, v_rows, _, block, _ = taken[0]
    return paged_attention.attend_sequences(q, k, v, q_bounds, bounds, k_rows, v_rows, tables, block,
                                            [t[4] for t in taken])
