"""Causal attention of many new queries of one sequence (a prefill, a long chunk) in one compiled
call on every core: the fast path's attention for more than ATTEND_ROWS_UP_TO new rows when numba
is installed (`fast.forward`). Imports numba (through tiles.py): `fast` imports it on first use.

Why. numpy's batched products compute it well (`fast.attend`, blocks of 64 queries against the
keys they may see), but during a pass with numba, numpy's BLAS is held to one thread, so
attention used one core: ~350 ms of a 500-token SmolLM2 prefill. Here the work is
tasks of 16 query rows of one KV head, spread over numba's threads, each computing

    P[t, j] = (q_j . k_t) / sqrt(d)     for the keys t up to the position of its last row,
    w[t, j] = exp(P[t, j] - max_t P) / sum_t exp(...)   over t <= the position of row j,
    out_j = sum_t w[t, j] v_t

with tiles.py's register tile for both products: OUTPUTS keys x 16 rows for the scores (the keys
are the "weights", the rows' q packed as tiles.pack_rows packs rows), and OUTPUTS output columns x
16 rows for the weighted values (V transposed: each column of V is a "weight row" over t;
P is stored [t, 16], already the packed layout the tile reads). The softmax runs down the 16
columns of P at once (`vexp.exp_le0`). The same compiled call first lays these operands out
from q, k and v as they lie (no numpy copies; the rows and V transposed 8 x 8 numbers at a
time in registers, llvm.transpose8), the score tile stores its sums straight into P, and
each row's output is written where the pass reads it. Same numbers as `ops.attention` up to
float32 rounding (tests bound it).

Measured (SmolLM2's shapes, 30 layers, both versions alternating in one process, December
2026, the Zen 4 machine of tunables.STREAM_PREFETCH): with the transposes in registers and
the scores stored by the tile, 500 new positions 0.80-0.82x the time of a layout one number
at a time and scores copied out of the tile's sums (73-91 ms against 91-111), 100 positions
0.73-0.75x, 64 positions 0.70x.
"""
from __future__ import annotations

import math

import numpy as np

from . import jit
from .few_queries import ONE_BLOCK
from .llvm import transpose8
from .tiles import OUTPUTS, ROWS, tile

prange = range  # numba.prange once compiled (jit.compiled)
# compiled into `_attend_tasks` (jit.compiled)
INLINE = ("compiled.vexp.exp_le0", "compiled.few_queries._row", "_lay_out", "_lay_out_rows", "_lay_out_keys_values",
          "_scores", "_softmax_columns")
exp_le0 = _row = None  # vexp.exp_le0 and few_queries._row (where position t lies), bound by jit.compiled


def attend_prefill(q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray | None = None, *, blocks=None
                   ) -> np.ndarray:
    """q: [S, Hq, d] float32, the newest S positions of one sequence; k, v: [T, Hkv, d] float32
    (the KVCache's layout, the S new positions last)  -> [S, Hq*d] (written into `out` when given:
    float32, C-contiguous). Query s sees positions 0 .. T - S + s.

    blocks=(table, block_size, T): k and v are a paged pool's blocks as rows [n_blocks * block_size,
    Hkv, d] and position t lies in row table[t // block_size] * block_size + t % block_size (block
    sizes a multiple of 8): the layout reads them there, and the numbers are those of the T
    positions gathered in order, bit for bit."""
    S, Hq, d = q.shape
    Hkv = k.shape[1]
    table, block, T = (ONE_BLOCK, k.shape[0], k.shape[0]) if blocks is None else blocks
    table = np.asarray(table, np.int64)
    ok = (q.dtype == k.dtype == v.dtype == np.float32 and k.shape == v.shape and k.shape[2] == d
          and Hq % Hkv == 0 and 0 < S <= T and k.flags.c_contiguous and v.flags.c_contiguous)
    if ok and blocks is not None:
        ok = (isinstance(block, (int, np.integer)) and block > 0 and block % 8 == 0 and table.ndim == 1
              and len(table) * block >= T and table.min() >= 0 and (table.max() + 1) * block <= k.shape[0])
    if not ok:
        raise ValueError(f"attend_prefill needs float32 q [S, Hq, d] and C-contiguous k, v [T, Hkv, d] with 0 < S <= T "
                         f"and Hq a multiple of Hkv (with blocks: k, v the pool's rows, a table of blocks inside them "
                         f"covering T, blocks of a multiple of 8 positions); got q {q.dtype}{list(q.shape)}, "
                         f"k {k.dtype}{list(k.shape)}, v {v.dtype}{list(v.shape)}, T={T}")
    g = Hq // Hkv
    packed = np.empty((Hkv, -(-S * g // ROWS), d, ROWS), np.float32)  # rows r = s * g + i of KV head h, 16 a block
    keys = np.empty((Hkv, -(-T // OUTPUTS) * OUTPUTS, d), np.float32)  # tiles of OUTPUTS keys: zero keys past T
    values_t = np.empty((Hkv, -(-d // OUTPUTS) * OUTPUTS, T), np.float32)  # V transposed, zero columns past d
    out = np.empty((S, Hq * d), np.float32) if out is None else out
    jit.compiled(_attend_tasks)(q, k, v, table, int(block), int(T), np.float32(1.0 / math.sqrt(d)), packed, keys,
                                values_t, out, jit.threads())
    return out


def _attend_tasks(q, k, v, table, block, T, scale, packed, keys, values_t, out, threads):  # pragma: no cover - numba
    """out[s, (h * g + i) * d + c] for every query s, query head h * g + i of KV head h and
    column c (see attend_prefill). First every thread lays out its share of the operands for the
    tiles: the rows r = s * g + i of each KV head, times `scale`, packed as tiles.pack_rows packs
    rows (`packed` [Hkv, blocks, d, 16]); the keys by head (`keys` [Hkv, T rounded up to OUTPUTS, d]);
    the values by head and column (`values_t` [Hkv, d rounded up to OUTPUTS, T]). Then the tasks (h,
    block of 16 rows), dealt to the threads in turn (later blocks see more keys: each thread gets
    some of each)."""
    S, Hq, d = q.shape
    Hkv = k.shape[1]
    blocks = packed.shape[1]
    g = Hq // Hkv
    past = T - S
    columns = values_t.shape[1]
    for w in prange(threads):
        _lay_out(q, k, v, table, block, T, scale, packed, keys, values_t, w, threads)
    for w in prange(threads):
        acc = np.empty((OUTPUTS, ROWS), np.float32)
        scores = np.empty((1, keys.shape[1], ROWS), np.float32)  # P [t, 16]: a packed block of rows for the tile
        stop = np.empty(ROWS, np.int64)  # row j sees keys t < stop[j] (0: a padding row)
        top = np.empty(ROWS, np.float32)
        total = np.empty(ROWS, np.float32)
        for task in range(w, Hkv * blocks, threads):
            h, b = task % Hkv, task // Hkv
            seen, everyone = 0, T  # keys t < everyone are seen by all the block's real rows
            for j in range(ROWS):
                r = b * ROWS + j
                stop[j] = past + r // g + 1 if r < S * g else 0
                seen = max(seen, stop[j])
                if stop[j] > 0:
                    everyone = min(everyone, stop[j])
            p = scores[0]  # [t, 16]
            _scores(keys[h], packed[h], b, seen, acc, p)
            _softmax_columns(p, stop, everyone, seen, top, total)
            for c0 in range(0, columns, OUTPUTS):  # weighted values, OUTPUTS columns x 16 rows a tile
                tile(values_t[h], c0 * T, scores, 0, ROWS, seen, acc)
                for j in range(ROWS):
                    r = b * ROWS + j
                    if stop[j] > 0:
                        first = (h * g + r % g) * d + c0  # query s = r // g, head h * g + r % g, column c0
                        for i in range(min(OUTPUTS, d - c0)):
                            out[r // g, first + i] = acc[i, j] / total[j]
    return out


def _lay_out(q, k, v, table, block, T, scale, packed, keys, values_t, w, threads):  # pragma: no cover - numba
    """Thread w's share of the operands' layout (see _attend_tasks): blocks of rows in turn
    (`_lay_out_rows`), then blocks of 64 positions of every KV head in turn (`_lay_out_keys_values`)."""
    for task in range(w, k.shape[1] * packed.shape[1], threads):
        _lay_out_rows(q, scale, packed, task)
    spans = -(-keys.shape[1] // 64)
    for task in range(w, k.shape[1] * spans, threads):
        _lay_out_keys_values(k, v, table, block, T, keys, values_t, task % k.shape[1], task // k.shape[1] * 64)


def _lay_out_rows(q, scale, packed, task):  # pragma: no cover - runs compiled by numba
    """Block b of KV head h (task = b * Hkv + h): its 16 rows, times scale, side by side, then
    packed [d, 16] 8 rows x 8 columns at a time (`transpose8`)."""
    S, Hq, d = q.shape
    Hkv = packed.shape[0]
    g = Hq // Hkv
    h, b = task % Hkv, task // Hkv
    rows = np.empty((ROWS, d), np.float32)
    for j in range(ROWS):
        r = b * ROWS + j  # query r // g, head h * g + r % g
        for c in range(d):
            rows[j, c] = q[r // g, h * g + r % g, c] * scale if r < S * g else np.float32(0.0)
    block = packed[h, b]  # [d, 16]
    for c0 in range(0, d - d % 8, 8):
        for j0 in range(0, ROWS, 8):
            transpose8(rows, j0 * d + c0, d, block, c0 * ROWS + j0, ROWS)
    for c in range(d - d % 8, d):
        for j in range(ROWS):
            block[c, j] = rows[j, c]


def _lay_out_keys_values(k, v, table, block, T, keys, values_t, h, t0):  # pragma: no cover - numba
    """Positions t0 .. t0+63 of KV head h (position t in row table[t // block] * block + t % block of
    k and v): keys copied (zeros past T), values transposed 8 positions x 8 columns at a time
    (`transpose8`: 8 rows in a row, as a block of a multiple of 8 positions keeps them), the rest
    one number at a time."""
    Hkv, d = k.shape[1], k.shape[2]
    columns = values_t.shape[1]
    t1 = min(t0 + 64, keys.shape[1])
    for t in range(t0, t1):
        r = _row(table, block, t) if t < T else 0
        for c in range(d):
            keys[h, t, c] = k[r, h, c] if t < T else np.float32(0.0)
    t1 = min(t1, T)
    whole = t0 + (t1 - t0) // 8 * 8  # positions transposed 8 at a time
    for c0 in range(0, d - d % 8, 8):
        for t in range(t0, whole, 8):
            r = _row(table, block, t)
            transpose8(v, (r * Hkv + h) * d + c0, Hkv * d, values_t, (h * columns + c0) * T + t, T)
        for c in range(c0, c0 + 8):
            for t in range(whole, t1):
                values_t[h, c, t] = v[_row(table, block, t), h, c]
    for c in range(d - d % 8, columns):
        for t in range(t0, t1):
            values_t[h, c, t] = v[_row(table, block, t), h, c] if c < d else np.float32(0.0)


def _scores(keys, packed, b, seen, acc, p):  # pragma: no cover - runs compiled by numba
    """p[t, j] = keys[t] . (row j of packed block b) for t < seen (rounded up to OUTPUTS), a tile of OUTPUTS
    keys x 16 rows at a time, whose sums [OUTPUTS, 16] the tile stores straight into p's rows t0 ..
    t0 + OUTPUTS - 1."""
    d = packed.shape[1]
    for t0 in range(0, seen, OUTPUTS):
        tile(keys, t0 * d, packed, b * d * ROWS, ROWS, d, p[t0:t0 + OUTPUTS])


def _softmax_columns(p, stop, everyone, seen, top, total):  # pragma: no cover - runs compiled by numba
    """Column j of p [t, 16] -> exp(p - its max) over t < stop[j], 0 below (the keys row j may not
    see); total[j] = the column's sum. Keys t < everyone are seen by every row: those loops have
    no condition, and run down the 16 columns at once."""
    for j in range(ROWS):
        top[j] = -np.inf
        total[j] = 0.0
    for t in range(everyone):
        for j in range(ROWS):
            top[j] = max(top[j], p[t, j])
    for t in range(everyone, seen):
        for j in range(ROWS):
            if t < stop[j]:
                top[j] = max(top[j], p[t, j])
    for t in range(everyone):
        for j in range(ROWS):
            e = exp_le0(p[t, j] - top[j])
            p[t, j] = e
            total[j] += e
    for t in range(everyone, seen):
        for j in range(ROWS):
            e = exp_le0(p[t, j] - top[j]) if t < stop[j] else np.float32(0.0)
            p[t, j] = e
            total[j] += e
