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
thread. Inside a task, both products run in llvm.py's loops: the scores eight keys at a
time per query row (`dots8`: eight dot products reduced together, instead of a horizontal add
for each), the weighted values up to 4 query rows' weights x 64 columns of V in registers
(`tile4x64` on AVX-512: each V vector loaded once for the rows of its head; `tile1x64` on AVX2).
The softmax's exponentials are `vexp.exp_le0`, which LLVM vectorises. Same numbers as
`ops.attention`, up to the order of float32 sums and exp's last bits (tests bound it).

Measured (30 layers of SmolLM2's shapes, every layer's cache cold, 2 threads, December 2026, the
Zen 3 machine of tunables.SWEEPS_UP_TO_ROWS, medians of 5 alternating runs): one row over 2,048
positions 7.5 -> 6.9 ms, 8 rows over 512 positions 12.1 -> 7.5 ms, against one dot product per
key and row and one multiply-add per value row and column. Cold, the order of the reads counts:
weighted values in tiles of 3 rows x 32 columns (a row of V read in pieces, 6 passes over the
block) were faster in cache but slower at 2,048 (medians 8.6-9.5 ms against 7.1-7.4 for the old
loop, in the same runs). The values of up to 4 rows in one tile (Zen 5, December 2026, SmolLM2's
shapes at 132 positions, the same numbers bit for bit): in cache 10.1 / 26.7 / 48.9 -> 5.4 / 13.0 /
23.3 us for 1 / 4 / 8 new rows; 30 layers' caches read from L3 or memory, processes taking turns,
no change for 1 row, 3-6% less for 3-4 rows, 13% for 8 (there the reads decide).
"""
from __future__ import annotations

import math

import numpy as np

from . import jit
from .few_rows import dot_rows

prange = range  # numba.prange once compiled (jit.compiled)
# compiled into the kernels (jit.compiled)
INLINE = ("dot_rows", "_part", "_row", "_weigh", "_block_scores", "_block_softmax", "_block_values", "_merge",
          "compiled.vexp.exp_le0", "compiled.llvm.tile1x64", "compiled.llvm.tile2x64", "compiled.llvm.tile3x64",
          "compiled.llvm.tile4x64", "compiled.llvm.tile1x8", "compiled.llvm.dots8", "compiled.llvm.prefetch",
          "compiled.llvm.VALUE_ROWS")
tile1x64 = tile2x64 = tile3x64 = tile4x64 = tile1x8 = dots8 = prefetch = None  # llvm.py's, bound by jit.compiled
VALUE_ROWS = 1  # llvm.VALUE_ROWS, query rows weighed together (`_block_values`; 4 on AVX-512), bound by jit.compiled
exp_le0 = None  # vexp.exp_le0, a vectorisable exp(x <= 0), bound by jit.compiled (vexp imports numba)
CHUNK = 64  # positions whose values are weighed together (their V, 48 KB for SmolLM2, stays in cache)
TASKS_PER_THREAD = 2  # blocks of positions per numba thread (2 balance the threads; more read no faster)
ONE_BLOCK = np.zeros(1, np.int64)  # a KVCache's block table: its arrays are one block (`_attend_rows`)


def fits_batch(q: np.ndarray, k: np.ndarray, v: np.ndarray, T: int) -> bool:
    """Whether `attend_last_batch(q, k, v, T)` applies: numba installed, float32, q [B, Hq, d],
    C-contiguous k and v [B, Hkv, capacity, d] holding at least T positions."""
    return (jit.available() and q.dtype == k.dtype == v.dtype == np.float32 and q.ndim == 3 and k.ndim == 4
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
    jit.compiled(_attend_batch)(np.ascontiguousarray(q), k, v, T, np.float32(1.0 / math.sqrt(d)), out)
    return out.reshape(B, Hq * d)


def fits_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> bool:
    """Whether `attend_rows(q, k, v)` applies: numba installed, float32, q [S, Hq, d] with
    0 < S <= T and 0 < d, C-contiguous k and v [T, Hkv, d], Hq a multiple of Hkv."""
    return (jit.available() and q.dtype == k.dtype == v.dtype == np.float32 and q.ndim == 3 and k.ndim == 3
            and k.shape == v.shape and k.flags.c_contiguous and v.flags.c_contiguous and q.shape[2] == k.shape[2]
            and q.shape[1] % k.shape[1] == 0 and 0 < q.shape[0] <= k.shape[0] and q.shape[2] > 0)


def attend_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The S newest positions of one sequence (a decode step, or S guesses checked at once),
    causal: query s sees positions 0 .. T - S + s.  q: [S, Hq, d]; k, v: [T, Hkv, d], the
    KVCache's own layout, the S new positions included  -> [S, Hq*d].

    Every query row that reads KV head h (its g heads for each of the S positions) is computed
    together, so each cached key and value is loaded once for all of them."""
    if not fits_rows(q, k, v):
        raise ValueError(f"attend_rows needs float32 q [S, Hq, d] with 0 < S <= T and 0 < d and C-contiguous float32 k, v "
                         f"[T, Hkv, d] with Hq a multiple of Hkv, and numba; got q {q.dtype}{list(q.shape)}, "
                         f"k {k.dtype}{list(k.shape)}, v {v.dtype}{list(v.shape)}")
    return _attend(q, k, v, ONE_BLOCK, k.shape[0], k.shape[0])


def attend_rows_in_blocks(q: np.ndarray, k: np.ndarray, v: np.ndarray, table, block_size: int, T: int) -> np.ndarray:
    """`attend_rows` over a paged cache's blocks, read where they lie: position t of the sequence is
    row table[t // block_size] * block_size + t % block_size of k, v [n_blocks * block_size, Hkv, d]
    (a pool's blocks as rows). The same numbers as `attend_rows` on the T positions gathered in
    order, bit for bit, for block sizes that are multiples of 8."""
    table = np.asarray(table, np.int64)
    if not (isinstance(block_size, (int, np.integer)) and block_size > 0 and block_size % 8 == 0):
        raise ValueError(f"attend_rows_in_blocks needs a block size that is a positive multiple of 8, got {block_size!r}")
    if not (fits_rows(q, k, v) and 0 < q.shape[0] <= T and table.ndim == 1 and len(table) * block_size >= T
            and table.size and 0 <= table.min() and (table.max() + 1) * block_size <= k.shape[0]):
        raise ValueError(f"attend_rows_in_blocks needs float32 q [S, Hq, d] (0 < S <= T), C-contiguous float32 k, v "
                         f"[rows, Hkv, d] and a block table of blocks inside k covering T = {T} positions, and numba; "
                         f"got q {q.dtype}{list(q.shape)}, k {k.dtype}{list(k.shape)}, table of {table.size} "
                         f"blocks of {block_size}")
    return _attend(q, k, v, table, int(block_size), int(T))


def _attend(q, k, v, table, block, T):
    S, Hq, d = q.shape
    Hkv = k.shape[1]
    g = Hq // Hkv
    rows = (q.reshape(S, Hkv, g, d).transpose(1, 2, 0, 3) * np.float32(1.0 / math.sqrt(d))).reshape(Hq * S, d)
    out = np.empty((Hq * S, d), np.float32)  # rows as in `rows`: [Hkv, g, S, d]
    parts = min(T, TASKS_PER_THREAD * jit.threads())
    merge = np.empty((parts, Hq * S, d + 2), np.float32)  # each part's weighted values, max and sum
    jit.compiled(_attend_rows)(rows, k, v, table, block, T, S, merge, out)
    return out.reshape(Hkv, g, S, d).transpose(2, 0, 1, 3).reshape(S, Hq * d)


def _attend_rows(q, k, v, table, block, T, S, merge, out):  # pragma: no cover - runs compiled by numba
    """out[j] = softmax over t < T - S + 1 + j % S of (q[j] . k[row t, h]), times v[row t, h], for
    each row j of q (the S new positions of one query head are S rows in a row); rows h*G .. h*G + G - 1
    read KV head h. k, v: [rows, Hkv, d], position t in row table[t // block] * block + t % block:
    a KVCache's whole arrays with table [0] and block >= T (`fused` passes them; positions T and
    later are not read), or a paged pool's blocks [n_blocks * block, Hkv, d] with a sequence's
    block table (block a multiple of 8 where d is: `dots8` reads 8 rows in a row). Tasks: runs of positions (`_part`), each with
    its own softmax (its max, its sum of exponentials, its weighted values: `merge`), merged at the
    end as flash-decoding merges its splits. The numbers depend on T and the tasks, not on where
    the rows lie: a paged cache's pass gives a KVCache's numbers. (Outside the parallel loop:
    loops, not array expressions, for which numba would start threads each time; inside it they
    run on the task's own thread.)"""
    R, d = q.shape
    parts = merge.shape[0]
    everyone = T - S + 1  # positions 0 .. T - S are seen by every row
    for part in prange(parts):
        a, b = _part(part, parts, T), _part(part + 1, parts, T)
        scores = np.empty((R, max(b - a, 1)), np.float32)  # the part's scores, then weights
        acc = np.empty((R, d), np.float32)  # its weighted values
        _block_scores(q, k, table, block, T, a, b, scores)
        _block_softmax(scores, a, b, everyone, S, merge[part])
        _block_values(scores, v, table, block, a, b, acc)
        merge[part, :, :d] = acc
    _merge(merge, out)


def _part(part, parts, T):  # pragma: no cover - runs compiled by numba
    """Where task `part` of `parts` starts (T for part == parts): part * T / parts, down to a
    multiple of 8, so that eight keys of `dots8` never straddle two of a paged cache's blocks."""
    return T if part == parts else part * T // parts // 8 * 8


def _row(table, block, t):  # pragma: no cover - runs compiled by numba
    """The row of k and v that holds position t (`_attend_rows`)."""
    return table[t // block] * block + t % block


def _block_scores(q, k, table, block, T, a, b, scores):  # pragma: no cover - runs compiled by numba
    """scores[j, t - a] = q[j] . k[row t, h] for positions a .. b-1, rows h*G .. h*G + G - 1 against KV
    head h. Eight positions at a time (when d is a multiple of 8): llvm.dots8 takes one row
    against the 8 keys of a head, for each row of that head in turn, so the block of keys is read
    from memory once, in memory order (a position's KV heads lie side by side), and from cache for
    the other rows; the positions left (or every position, when d is not a multiple of 8): one
    dot product per row and key."""
    R, d = q.shape
    Hkv = k.shape[1]
    G = R // Hkv
    width = scores.shape[1]
    stop = a if d % 8 else a + (b - a) // 8 * 8  # dots8 up to here (fits_rows: d > 0, so d >= 8 here)
    for t0 in range(a, stop, 8):
        if t0 + 16 < T:
            prefetch(k, _row(table, block, t0 + 16) * Hkv * d, 8 * Hkv * d)  # the keys two steps ahead, into L2
        r0 = _row(table, block, t0)
        for h in range(Hkv):
            for j in range(h * G, h * G + G):
                dots8(k, (r0 * Hkv + h) * d, Hkv * d, q, j * d, d, scores, j * width + t0 - a)
    for t in range(stop, b):
        r = _row(table, block, t)
        for h in range(Hkv):
            kt = k[r, h]
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
        for t in range(max(stop, 0), b - a):  # positions row j may not see weigh nothing
            scores[j, t] = 0.0
        merge[j, d], merge[j, d + 1] = top, total


def _block_values(scores, v, table, block, a, b, acc):  # pragma: no cover - runs compiled by numba
    """acc[j] = sum over positions t = a .. b-1 of scores[j, t - a] * v[row t, h] for every row j (h:
    its KV head), the weights of positions row j may not see being 0. In chunks of CHUNK positions:
    for up to VALUE_ROWS rows of a head at once, llvm.py's register tile of those rows x 64 columns
    (per position one load of each V vector for all of them, a multiply-add per row; the sums kept
    in registers over the chunk, or over each run of it in one block of a paged cache, carried from
    run to run), the chunk's sums then added to acc; columns past the last 64 in tiles of one row x
    8, then one at a time. Each sum grows by the same multiply-adds in the same order whatever the
    rows weighed with it. A head's value rows are read whole (d numbers side by side): the first
    rows of the head bring the chunk from memory, the others read it from cache."""
    R, d = acc.shape
    Hkv = v.shape[1]
    G = R // Hkv
    width = scores.shape[1]
    wide = d - d % 64  # columns in tiles of 64
    narrow = d - d % 8  # ... and of 8
    sums = np.empty((VALUE_ROWS, 64), np.float32)
    for j in range(R):
        for c in range(d):
            acc[j, c] = 0.0
    for t0 in range(a, b, CHUNK):
        t1 = min(t0 + CHUNK, b)
        for h in range(Hkv):
            for j0 in range(h * G, h * G + G, VALUE_ROWS):
                n = min(VALUE_ROWS, h * G + G - j0)
                for c0 in range(0, wide, 64):
                    _weigh(scores, j0, n, j0 * width - a, v, table, block, t0, t1, h * d + c0, 64, sums, acc, c0)
                for j in range(j0, j0 + n):
                    for c0 in range(wide, narrow, 8):
                        _weigh(scores, j, 1, j * width - a, v, table, block, t0, t1, h * d + c0, 8, sums, acc, c0)
                    if narrow < d:
                        row = acc[j]
                        for t in range(t0, t1):
                            w = scores[j, t - a]
                            vt = v[_row(table, block, t), h]
                            for c in range(narrow, d):
                                row[c] += w * vt[c]


def _weigh(scores, j0, n, first, v, table, block, t0, t1, column, cols, sums, acc, c0):  # pragma: no cover - numba
    """acc[j0 + r, c0 : c0 + cols] += sum over positions t0 .. t1-1 of scores.flat[first + r * width + t]
    times the `cols` numbers of V's row for t from `column` on, for each of n rows r (cols: 64, or 8
    with n = 1; one register tile): the tile's sums run through each stretch of positions that lie
    in one block of rows, carried from one to the next, so they are the same sums wherever the
    blocks lie."""
    Hkv, d = v.shape[1], v.shape[2]
    for r in range(n):
        for c in range(cols):
            sums[r, c] = 0.0
    s = t0
    while s < t1:
        e = min(t1, (s // block + 1) * block)
        at = _row(table, block, s) * Hkv * d + column
        if cols == 8:
            tile1x8(scores, first + s, v, at, Hkv * d, e - s, sums)
        elif n == 1:
            tile1x64(scores, first + s, v, at, Hkv * d, e - s, sums)
        elif n == 2:
            tile2x64(scores, first + s, v, at, Hkv * d, e - s, sums)
        elif n == 3:
            tile3x64(scores, first + s, v, at, Hkv * d, e - s, sums)
        else:
            tile4x64(scores, first + s, v, at, Hkv * d, e - s, sums)
        s = e
    for r in range(n):
        for c in range(cols):
            acc[j0 + r, c0 + c] += sums[r, c]


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
