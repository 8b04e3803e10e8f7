"""Attention of several paged sequences' few new rows in ONE compiled call: a server's batch of
decoding requests (`forward_batch` over paged sequences of one pool), with no Python per sequence.

`forward_pass` attends the sequences of a batch one after another, and each costs Python: its new
K and V rows written through its block table, its query rows laid out, a call into few_queries
(~10 us a sequence and layer: 5 ms of a 16-request decode step's ~30). Here one call per layer
does it for every sequence, in compiled code: for sequence s, its new rows' K and V into the
pool's blocks, its query rows scaled and grouped by KV head, then few_queries' `_attend_rows`
over its positions through its block table, the kernel `attend_rows_in_blocks` runs, on the same
numbers, so each sequence's attention is that function's bit for bit.

    out = attend_sequences(q, k_new, v_new, q_bounds, kv_bounds, k_rows, v_rows, tables, block, starts)
"""
from __future__ import annotations

import math

import numpy as np

from . import jit
from .few_queries import TASKS_PER_THREAD

CALLS = {"compiled.few_queries._attend_rows": True}  # called from the loop over sequences (parallel itself)
_attend_rows = None  # few_queries._attend_rows, bound by jit.compiled
INLINE = ("compiled.few_queries._row",)  # where position t lies: compiled into the loop
_row = None  # bound by jit.compiled


def attend_sequences(q, k_new, v_new, q_bounds, kv_bounds, k_rows, v_rows, tables, block: int, starts) -> np.ndarray:
    """Each of n paged sequences' query rows over its positions, its new K and V written first.

    q [Nq, Hq, d]: sequence s's query rows are q[q_bounds[s]:q_bounds[s+1]] (its newest positions:
    all its new rows, or its last one); k_new, v_new [N, Hkv, d]: its new K and V rows
    kv_bounds[s]:kv_bounds[s+1], for positions starts[s] onwards, which the pool has taken for it
    (`layer_rows`); k_rows, v_rows [n_blocks * block, Hkv, d]: the pool's blocks as rows; tables
    [n, width] int64: each sequence's block table, padded. -> [Nq, Hq*d] float32."""
    n = len(starts)
    Nq, Hq, d = q.shape
    Hkv = k_rows.shape[1]
    q_bounds, kv_bounds = np.asarray(q_bounds, np.int64), np.asarray(kv_bounds, np.int64)
    tables, starts = np.asarray(tables, np.int64), np.asarray(starts, np.int64)
    ok = (jit.available() and q.dtype == k_new.dtype == v_new.dtype == k_rows.dtype == v_rows.dtype == np.float32
          and k_rows.shape == v_rows.shape and k_rows.flags.c_contiguous and v_rows.flags.c_contiguous
          and k_new.shape == v_new.shape and k_new.shape[1:] == k_rows.shape[1:] and Hq % Hkv == 0 and d > 0
          and block > 0 and block % 8 == 0 and tables.ndim == 2 and len(tables) == n and n > 0
          and q_bounds.shape == kv_bounds.shape == (n + 1,) and q_bounds[-1] == Nq and kv_bounds[-1] == len(k_new)
          and np.all(np.diff(q_bounds) > 0) and np.all(np.diff(kv_bounds) >= 0) and starts.min() >= 0
          and np.all(np.diff(q_bounds) <= starts + np.diff(kv_bounds))
          and np.all(starts + np.diff(kv_bounds) <= tables.shape[1] * block)
          and tables.min() >= 0 and (tables.max() + 1) * block <= len(k_rows))
    if not ok:
        raise ValueError(f"attend_sequences needs float32 q [Nq, Hq, d], k_new, v_new [N, Hkv, d] and the pool's rows "
                         f"[rows, Hkv, d] (C-contiguous), n + 1 bounds of each sequence's query and new rows (at "
                         f"least one query row, no more than its positions), block tables [n, width] of blocks "
                         f"inside the rows covering each sequence, blocks of a multiple of 8 positions, and numba; "
                         f"got q {q.dtype}{list(q.shape)}, k_new {k_new.dtype}{list(k_new.shape)}, rows "
                         f"{k_rows.dtype}{list(k_rows.shape)}, tables {list(tables.shape)}, block {block}, "
                         f"{n} sequences")
    out = np.empty((Nq, Hq * d), np.float32)
    jit.compiled(_attend_sequences, parallel=False)(q, k_new, v_new, q_bounds, kv_bounds, k_rows, v_rows, tables,
                                                    block, starts, np.float32(1.0 / math.sqrt(d)),
                                                    TASKS_PER_THREAD * jit.threads(), out)
    return out


def _attend_sequences(q, k_new, v_new, q_bounds, kv_bounds, k_rows, v_rows, tables, block, starts, scale, tasks,
                      out):  # pragma: no cover - runs compiled by numba
    """`attend_sequences`, one sequence after another (each `_attend_rows` call spreads over the threads)."""
    Hq, d = q.shape[1], q.shape[2]
    Hkv = k_rows.shape[1]
    for s in range(len(starts)):
        a, b, table = kv_bounds[s], kv_bounds[s + 1], tables[s]
        for i in range(b - a):  # the new K and V join the sequence's blocks
            t = starts[s] + i
            r = _row(table, block, t)
            for h in range(Hkv):
                for c in range(d):
                    k_rows[r, h, c] = k_new[a + i, h, c]
                    v_rows[r, h, c] = v_new[a + i, h, c]
        qa, S, T = q_bounds[s], q_bounds[s + 1] - q_bounds[s], starts[s] + b - a
        rows = np.empty((Hq * S, d), np.float32)  # scaled, grouped by KV head: row i * S + j (i = kv head * g + its j)
        for i in range(Hq):
            for j in range(S):
                for c in range(d):
                    rows[i * S + j, c] = q[qa + j, i, c] * scale
        merge = np.empty((min(T, tasks), Hq * S, d + 2), np.float32)
        heads = np.empty((Hq * S, d), np.float32)
        _attend_rows(rows, k_rows, v_rows, table, block, T, S, merge, heads)
        for j in range(S):
            for i in range(Hq):
                for c in range(d):
                    out[qa + j, i * d + c] = heads[i * S + j, c]
