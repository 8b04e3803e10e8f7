"""Many rows times a weight matrix at the CPU's arithmetic rate: the fast path's kernel for more
than tunables.SWEEPS_UP_TO_ROWS rows (a batch's decode step, a prefill). Needs numba; imported by
`forward_pass.project` the first time it gets that many rows.

Why. With M rows a product does 2*M FLOPs per weight. From a few rows on, that arithmetic, not
the read of the weights, sets the time, and what counts is how many multiply-adds each load feeds.
few_rows' sweeps are dot products along k (one running sum per input row and weight row, each a
vector of 8 partial sums): each vector multiply-add needs a load or two of its own, and each of
the M x N sums ends in a horizontal add. A BLAS GEMM instead keeps a small tile
of the output in registers and grows it by outer products:

    acc[r, j] += w[n + r, k] * x[m + j, k]       for k = 0 .. K-1,  r < OUTPUTS, j < 16

Here a tile is OUTPUTS outputs x 16 input rows. With AVX-512 (`LANES` = 16): 12 outputs, one
register of 16 sums each; at each k one load brings x[m:m+16, k] (the rows are packed so that
these 16 numbers lie together), twelve broadcasts bring w[n:n+12, k], and 12 fused multiply-adds
follow: 13 loads feed 192 multiply-adds. With AVX2's 8 lanes and 16 registers: 6 outputs x 2
registers, 8 loads for 96. No sum needs a horizontal add. (Until December 2026 every CPU ran the
8-lane tile: on AVX-512, half the cores' multiply-adds; docs/fast_path.md has the measurements.)
The weights are read where they lie (out-major: the OUTPUTS rows of a task are one contiguous
block of memory, read front to back), and while a task computes, it asks the
memory for the next task's block (a prefetch), so the read overlaps the arithmetic. Where a
task takes one block of rows (at most 16 rows: a decode step's 5-8, a batch's step), its
weights are used once, and the prefetch brings the next task's into L2 only (`tile_stream`,
`tile8`): prefetched into every cache level, 8-row products read SmolLM2's weights at ~0.65x
the rate of one row's sweeps, into L2 at ~0.9x (tunables.STREAM_PREFETCH). The rows are
packed in compiled code too (`_pack`, on every core, 8 rows x 8 k at a time transposed in
registers: `transpose8`), into one work array that a pass hands all its products: no new array
and no numpy transpose per product (whole 500- and 100-token SmolLM2 prefills, alternating with
numpy's packing in one process: 0.94-0.97x the time; then packing 500 rows of 576 in 22-38 us
instead of 67-69 one number at a time, of 1,536 in 54-135 instead of 174-175).

numba has no vector types, and LLVM does not find this schedule in a loop over arrays: the tile
is written as a numba intrinsic that builds the loop in LLVM's IR (llvm.make_tile, ~50 lines, for
any number of outputs and of rows; x read at a start and step the caller gives, so the same
loop also runs over rows of another array: one_query's weighted values). The rest
is plain numba: `_rows_times_tiles` gives each thread its share of the outputs, and each task
(OUTPUTS outputs) runs the tile over every block of 16 rows while its weights sit in cache; a last
block of 1-8 rows runs in a tile of 8 rows (`tile8`, one vector of sums per output), which does
half the multiply-adds of a padded 16-row tile (100 rows, one 576 x 3,072 matrix in cache:
3.1-3.3 ms against 3.4-3.8). llvm.py holds the fast path's other hand-scheduled loops.

Measured (tunables.py, SmolLM2's 121 matrices, nothing in cache, 2 threads): 16 rows in 46-48 ms,
against 71-87 ms for the sweeps it replaced (two weight rows against four input rows, eight
running sums); 500 rows in 1.13-1.16 s against 1.55-1.60 s (numpy's GEMM: 1.0-1.14 s). The sums
run in another order than numpy's, so the numbers equal the reference up to float32 rounding
(tests bound it).
"""
from __future__ import annotations

import numpy as np

from .. import tunables
from ..aligned import empty64
from . import few_rows, jit
from .few_rows import dot_rows
from .llvm import has_avx512, make_tile, transpose8

prange = range  # numba.prange once compiled (jit.compiled)
INLINE = ("dot_rows",)  # compiled into `_rows_times_tiles` (jit.compiled)

LANES = 16 if has_avx512() else 8  # a tile's 16 rows: one AVX-512 vector per output, else two of AVX2's 8
# Outputs (weight rows) per tile by lanes, one broadcast each per k: with 16 lanes, 12 sums (one
# vector each) and 13 loads a k for 12 multiply-adds; with 8, 6 x 2 vectors (AVX2 has 16 registers).
OUTPUTS_FOR_LANES = {16: 12, 8: 6}
OUTPUTS = OUTPUTS_FOR_LANES[LANES]
TILE_OUTPUTS = OUTPUTS  # the name quant_rows binds it by (it has OUTPUTS of its own)
ROWS = 16  # input rows per tile


def pack_rows(x: np.ndarray, rows: int = ROWS) -> np.ndarray:
    """x [M, K] -> [ceil(M/rows), K, rows]: block b holds rows b*rows .. b*rows + rows-1 with the
    values of one k side by side (rows past M are zeros), as `tile` (rows = 16) and `tile8` load them."""
    M, K = x.shape
    blocks = -(-M // rows)
    padded = np.zeros((blocks * rows, K), np.float32)
    padded[:M] = x
    return np.ascontiguousarray(padded.reshape(blocks, rows, K).transpose(0, 2, 1))


def rows_times(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = x @ w for x [M, K] float32 and w [K, N] float32 in Fortran order (out-major), as
    `few_rows.rows_times` takes them; out [M, N] float32, C-contiguous, written in place and returned."""
    few_rows.check_rows_times(x, w, out)
    return product(x, w, out)


def product(x: np.ndarray, w: np.ndarray, out: np.ndarray, work: np.ndarray | None = None) -> np.ndarray:
    """`rows_times` without its checks, for a caller that has made them (`forward_pass.project`). The rows
    are packed into `work` (float32, at least `work_numbers(M, K)` numbers; a pass passes one
    array to all its products) or, without it, into a new array."""
    x = np.ascontiguousarray(x)
    if x.shape[1] == 0:  # no k: zeros (the tile's loop runs at least once)
        out[:] = 0.0
        return out
    M, K = x.shape
    tail = M % ROWS if M % ROWS <= 8 else 0  # a last block of 1-8 rows runs in tile8 (half the work)
    blocks, lasts = -(-(M - tail) // ROWS), int(tail > 0)
    if work is None or work.size < work_numbers(M, K):
        work = empty64(work_numbers(M, K))
    full = work[:blocks * K * ROWS].reshape(blocks, K, ROWS)  # [blocks, K, 16]
    last = work[blocks * K * ROWS:(blocks * ROWS + lasts * 8) * K].reshape(lasts, K, 8)  # [0 or 1, K, 8]
    threads = jit.threads()
    jit.compiled(_pack)(x, full, last, threads)
    jit.compiled(_rows_times_tiles)(full, last, x, w.T, out, threads)  # w.T: [N, K]
    return out


def work_numbers(M: int, K: int) -> int:
    """The numbers `product` packs M rows of K numbers into (whole blocks of 16 rows, and 8 more)."""
    return (-(-M // ROWS) * ROWS + 8) * K


def _pack(x, full, last, threads):  # pragma: no cover - runs compiled by numba
    """full [blocks, K, 16] and last [0 or 1, K, 8] <- the rows of x [M, K] as pack_rows packs
    them (rows past M: zeros). Each thread takes blocks in turn. A block's rows are copied 8 k
    at a time: each 8 rows x 8 k in registers (`transpose8`: 8 loads, 24 shuffles, 8 stores),
    rows past the last 8 of x and the k past the last 8 one number at a time."""
    M, K = x.shape
    blocks = full.shape[0]
    wide = K - K % 8
    for t in prange(threads):
        for b in range(t, blocks + last.shape[0], threads):
            dst = full[b] if b < blocks else last[0]  # [K, width]
            width = dst.shape[1]
            m0 = b * ROWS
            n = min(width, M - m0)
            whole = n - n % 8  # rows copied 8 at a time
            for k0 in range(0, wide, 8):
                for j0 in range(0, whole, 8):
                    transpose8(x, (m0 + j0) * K + k0, K, dst, k0 * width + j0, width)
                for j in range(whole, width):
                    for i in range(8):
                        dst[k0 + i, j] = x[m0 + j, k0 + i] if j < n else 0.0
            for k in range(wide, K):
                for j in range(width):
                    dst[k, j] = x[m0 + j, k] if j < n else 0.0


def _rows_times_tiles(full, last, x, wt, out, threads):  # pragma: no cover - runs compiled by numba
    """out = x @ wt.T, x packed as `full` [blocks, K, 16] and, when a last block of 1-8 rows
    remains, `last` [1, K, 8]; each thread takes a contiguous share of the tasks (6 outputs
    each) and keeps one tile's sums."""
    blocks = full.shape[0]
    M, K = x.shape
    N = wt.shape[0]
    tasks = N // OUTPUTS
    for t in prange(threads):
        acc = np.empty((OUTPUTS, ROWS), np.float32)  # one tile's sums, [outputs, rows]
        acc8 = np.empty((OUTPUTS, 8), np.float32)
        for p in range(t * tasks // threads, (t + 1) * tasks // threads):
            n = OUTPUTS * p
            for b in range(blocks):
                if blocks + last.shape[0] > 1:
                    tile(wt, n * wt.shape[1], full, b * K * ROWS, ROWS, K, acc)
                else:  # the task's weights are used once: the next task's are fetched into L2 only
                    tile_stream(wt, n * wt.shape[1], full, b * K * ROWS, ROWS, K, acc)
                m = ROWS * b
                for j in range(min(ROWS, M - m)):
                    for r in range(OUTPUTS):
                        out[m + j, n + r] = acc[r, j]
            if last.shape[0]:
                tile8(wt, n * wt.shape[1], last, 0, 8, K, acc8)
                m = ROWS * blocks
                for j in range(M - m):
                    for r in range(OUTPUTS):
                        out[m + j, n + r] = acc8[r, j]
    for n in range(OUTPUTS * tasks, N):  # the last N % 6 outputs: few_rows' dot products
        dot_rows(x, wt[n], out, n, K)
    return out


tile = make_tile(OUTPUTS, ROWS, lanes=LANES)  # OUTPUTS x 16 rows, for a task over several blocks of rows (a prefill)
tile_stream = make_tile(OUTPUTS, ROWS, tunables.STREAM_PREFETCH, LANES)  # ... over one block (16 rows: a batch's step)
tile8 = make_tile(OUTPUTS, 8, tunables.STREAM_PREFETCH)  # OUTPUTS x 8 rows (8 lanes): a last block of 1-8 rows
