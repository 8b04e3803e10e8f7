"""Rows times a weight matrix kept as the GGUF file's own blocks (Q4_1 or Q8_0), read in place:
the fast path's products for a quantised model (optional: it needs numba).

A float32 decode step streams ~540 MB of SmolLM2's weights; the file holds the same weights in
~100 MB. This module reads those blocks where they lie (a view of the memory-mapped file, no
float32 copy) and computes

    out[m, cols[n]] = sum_k x[m, k] * W[n, k]        x [M, K] float32, W's row n = output n

with W's rows stored as GGUF blocks of 32 weights (llama.cpp's layouts):

    Q4_1: 20 bytes = float16 d, float16 m, 16 bytes of 4-bit codes q (byte j: weight j in its
          low nibble, weight j + 16 in its high one); weight = d * q + m
    Q8_0: 34 bytes = float16 d, 32 int8 codes q; weight = d * q

The kernels read nothing but the file's bytes (the float16 scales are decoded in registers, x86's
F16C): per block, either each code's weight fl(d q + m) is picked from a table of the 16 possible
(Q4_1 where the CPU has AVX-512; exactly the float32 model's weights), or sum_j x_j (d q_j + m) =
sum_j x_j (d q_j) + m * sum_j x_j with the row's block sums computed once (d q_j is exact in
float32). Either way the products equal x @ dequantised(W).T up to the order of float32 sums.

`QuantMatrix` is such a tensor as an [in, out] weight (`x @ w` dequantises; `fast.project` calls
`product`); fused tensors (Q, K, V; gate, up) stay views of the file, `parts`, each writing its own
columns `cols` (which undoes llama.cpp's Q/K row order); `.T[ids]` dequantises embedding rows.

Kernels (jit.compiled, every core), each thread a contiguous share of the output rows. One or two
rows of a Q4_1 matrix (a decode step, a check of one guess) run quant_planes' lookups where they apply (AVX-512; its planes,
a second layout of the same 4-bit numbers, made as checkpoint.quant_model loads the model). Up to
ROWS_UP_TO rows otherwise (a decode step where planes do not apply, a speculative check, a small
batch), `_rows`: quant_dots' `outputs` kernels take OUTPUTS output rows a call against ROWS_A_CALL
input rows (8 with AVX-512) or the 1-4 left, each kernel in a loop of its own (`make_over_outputs`,
chosen once per part by `_over`), read in the file's order with the memory asked for PREFETCH_BYTES
ahead, each block decoded once for the input rows, several blocks' sums in flight,
each output summed in registers; the few output rows left run `dots`, one a call. More rows (a
prefill), `_tiles`: each task dequantises TILE_OUTPUTS output rows into a small float32 buffer and runs
tiles.py's register tile over them; from DENSE_FROM_ROWS rows a matrix is dequantised whole
(`_dequantize_all`) for tiles.py's own product.

Measured (SmolLM2, December 2026, 2 vCPUs of an AMD EPYC Zen 5 VM; one thread, one input row, Q4_1
at K = 576): 4.2 cycles a block with a call and a sum in memory per output row, 2.4-2.6 with
`outputs`; a decode step on 2 threads 5.1 ms before, 3.4-4.2 ms with it and the prefetch; the Q8_0
head over 4 rows 1.88 ms in `dots`, 1.37 in `outputs`; over 8 rows 2.90 in two calls of 4, 1.77
in one of 8. Several rows are bound by the multiply-adds and the blocks' decoding (a pass over 8
rows ~2.7 of quant_planes' decode steps, its multiply-adds alone 1.1-1.5: docs/fast_path.md);
prefill 0.97-0.99x float32's, 0.87x while the machine's neighbours fill the shared L3 (the
dequantised 7 MB scratch then goes to memory; docs/fast_path.md).
"""
from __future__ import annotations

import threading

import numpy as np

from ..aligned import empty64, on64
from . import jit, quant_planes
from .quant_matrix import BLOCK, BLOCK_BYTES, QuantMatrix, block_scales, dequantize_rows  # noqa: F401 - this module's interface too

# Up to this many rows: `_rows`; more: `_tiles` or dense. SmolLM2's 121 products (the head
# included), 2 threads, medians of 3 alternating rounds: 12 rows 17.7 ms in `_rows` against 24.0,
# 16 rows 23.6 both, 24 rows 37.4 against 35.0, 32 rows 52.4 against 40.3. Whole batched decode
# steps (forward_batch, context 128): batch 16 523-547 tok/s against 332-337 with 8 here, batch 32
# 500-518 against 459-468 (the dense path's copies cost more inside a step than alone), so a
# prefill of 17+ tokens keeps the tiles while a batch of up to 16 sequences runs `_rows`.
ROWS_UP_TO = 16
TILE_OUTPUTS = None  # output rows a `_tiles` task dequantises: tiles.TILE_OUTPUTS, bound by jit.compiled
# From this many rows (a prefill), a matrix of at most DENSE_UP_TO_WEIGHTS weights is dequantised
# whole into float32 and multiplied by tiles.py's product; a larger one (the 28M-weight head over
# every row) runs `_tiles` without the copy. SmolLM2, 2 threads (medians of 15): 100 tokens 0.109 s
# in `_tiles`, 0.1055 dense, f32 0.1023.
DENSE_FROM_ROWS = ROWS_UP_TO + 1
DENSE_UP_TO_WEIGHTS = 1 << 22
_scratch = threading.local()  # _dense_scratch's buffer, one per thread

prange = range  # numba.prange once compiled (jit.compiled)
INLINE = ("_block_sums", "_dots", "compiled.tiles.tile", "compiled.tiles.tile8", "compiled.tiles.TILE_OUTPUTS",
          "compiled.quant_decode.q41_dequant",
          "compiled.quant_decode.q80_dequant",
          *(f"compiled.quant_dots.q{t}_over{R}" for t in ("41", "80") for R in (1, 2, 3, 4, 8)), "_over",
          "compiled.quant_dots.ROWS_A_CALL", "compiled.quant_dots.TABLE",
          *(f"compiled.quant_dots.q{t}_dots{R}" for t in ("41", "80") for R in (1, 2, 3, 4)))  # compiled into the kernels
tile = tile8 = None  # tiles.py's register tiles, bound by jit.compiled (tiles imports numba)
q41_dots1 = q41_dots2 = q41_dots3 = q41_dots4 = None  # quant_dots' intrinsics, bound by jit.compiled
q80_dots1 = q80_dots2 = q80_dots3 = q80_dots4 = q41_dequant = q80_dequant = None
q41_over1 = q41_over2 = q41_over3 = q41_over4 = q41_over8 = None  # quant_dots' loops around its `outputs` kernels
q80_over1 = q80_over2 = q80_over3 = q80_over4 = q80_over8 = None
ROWS_A_CALL = 4  # quant_dots.ROWS_A_CALL (8 where the CPU has AVX-512), bound by jit.compiled
TABLE = False  # quant_dots.TABLE (Q4_1 blocks by table, where the CPU has AVX-512), bound by jit.compiled
OUTPUTS = 4  # quant_dots.OUTPUTS: output rows per call of the one-row kernels


NO_SCALES = np.zeros((0, 0), np.float32)  # a part's scales where its kernels read none (`scales`, fused_quant)


# ----------------------------------------------------------------------------- products

def scales(w: QuantMatrix) -> tuple:
    """Each part's blocks' (d, m) as float32 (quant_matrix.block_scales) where the `outputs` kernels
    read them (Q4_1 by table, quant_dots' make_outputs), else an empty placeholder a part: made on a
    matrix's first product over 3-16 rows (fewer take quant_planes' lookups where they apply) and
    kept with it (8 bytes a block beside the file's 20: 27 MB for SmolLM2's layers, in a process
    that runs such passes)."""
    if w._scales is None:
        from .quant_decode import TABLE  # imports numba: only where a kernel runs

        q4_1_by_table = w.kind == "Q4_1" and TABLE
        w._scales = tuple(block_scales(raw) if q4_1_by_table else NO_SCALES for raw in w.raws)
    return w._scales


def fits(x, w) -> bool:
    """Whether `rows_times(x, w, out)` applies: numba, float32 rows [M, K], a QuantMatrix [K, N]."""
    return (jit.available() and isinstance(w, QuantMatrix) and not w.transposed and isinstance(x, np.ndarray)
            and x.dtype == np.float32 and x.ndim == 2 and x.shape[1] == w.K)


def rows_times(x: np.ndarray, w: QuantMatrix, out: np.ndarray) -> np.ndarray:
    """out = x @ w for float32 x [M, K] and a QuantMatrix w [K, N]; out [M, N] float32
    C-contiguous, written in place and returned."""
    if not isinstance(w, QuantMatrix) or w.transposed:
        raise ValueError(f"rows_times needs a QuantMatrix [in, out] (not its table view), got {type(w).__name__}"
                         + (" (transposed)" if isinstance(w, QuantMatrix) else ""))
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != w.K:
        raise ValueError(f"rows_times needs float32 x [M, {w.K}] for a QuantMatrix {list(w.shape)}, "
                         f"got {x.dtype}{list(x.shape)}")
    if not isinstance(out, np.ndarray) or out.shape != (x.shape[0], w.N) or out.dtype != np.float32 \
            or not out.flags.c_contiguous:
        raise ValueError(f"rows_times writes a C-contiguous float32 out of shape {[x.shape[0], w.N]}, got "
                         f"{getattr(out, 'dtype', type(out).__name__)}{list(getattr(out, 'shape', ()))}")
    if not jit.available():
        raise ValueError("rows_times needs numba and threadpoolctl (the [fast] extra)")
    return product(x, w, out)


def product(x: np.ndarray, w: QuantMatrix, out: np.ndarray, work=None) -> np.ndarray:
    """`rows_times` without its checks (`fast.project`). work: where the tiles pack the rows, or None."""
    M = x.shape[0]
    x = on64(x) if M > 1 else np.ascontiguousarray(x)  # `outputs` loads the rows again for every output row
    if M == 0:
        return out
    threads = jit.threads()
    planes = quant_planes.planes(w) if M <= quant_planes.ROWS_UP_TO else None
    if planes is not None:  # a decode step's row (or two): by lookup (quant_planes)
        jit.compiled(quant_planes._plane_rows)(x, planes, w.cols, out, threads)
        return out
    if M <= ROWS_UP_TO:
        jit.compiled(_rows)(x, w.raws, scales(w), w.cols, w.kind == "Q4_1", out, threads)  # every part in one call
        return out
    from . import tiles

    if M >= DENSE_FROM_ROWS and w.N * w.K <= DENSE_UP_TO_WEIGHTS:  # float32 [N, K] once, tiles.py's product
        dense = _dense_scratch(w.N * w.K).reshape(w.N, w.K)
        jit.compiled(_dequantize_all)(w.raws, w.cols, w.kind == "Q4_1", dense, threads)
        return tiles.product(x, dense.T, out, work)
    K = w.K
    tail = M % tiles.ROWS if M % tiles.ROWS <= 8 else 0
    blocks, lasts = -(-(M - tail) // tiles.ROWS), int(tail > 0)
    if work is None or work.size < tiles.work_numbers(M, K):
        work = empty64(tiles.work_numbers(M, K))
    full = work[:blocks * K * tiles.ROWS].reshape(blocks, K, tiles.ROWS)
    last = work[blocks * K * tiles.ROWS:(blocks * tiles.ROWS + lasts * 8) * K].reshape(lasts, K, 8)
    jit.compiled(tiles._pack)(x, full, last, threads)
    jit.compiled(_tiles)(full, last, M, w.raws, w.cols, w.kind == "Q4_1", out, threads)  # every part in one call
    return out


def _dense_scratch(n: int) -> np.ndarray:
    """n float32s that this thread reuses for every dequantised matrix: written and read back
    while in cache (a fresh array each time: 17 ms of a prefill's memory traffic, against 5.5)."""
    if getattr(_scratch, "numbers", np.zeros(0, np.float32)).size < n:
        _scratch.numbers = empty64(n)
    return _scratch.numbers[:n]


def _block_sums(x, sx):  # pragma: no cover - runs compiled by numba
    M, K = x.shape
    for r in range(M):
        for b in range(K // 32):
            s = np.float32(0.0)
            for j in range(32):
                s += x[r, 32 * b + j]
            sx[r, b] = s


def _rows(x, raws, dms, colss, q4_1, out, threads):  # pragma: no cover - runs compiled by numba
    """out[:, cols[n]] = x @ W[n] for each row n of blocks in each part (raws[p], colss[p]; Q4_1
    or Q8_0; dms[p]: its `scales`): each thread takes a contiguous share of each part's rows, and
    each output row runs against the input rows ROWS_A_CALL at a time, then the 1-4 left
    (quant_dots: the blocks decoded in registers, lane-wise sums per input row)."""
    M, K = x.shape
    nb = K // 32
    sums = q4_1 and not TABLE  # by table, a Q4_1 block's m is in its weights
    sx = np.empty((M if sums else 0, nb), np.float32)  # each row's block sums (Q4_1's m term)
    if sums:
        _block_sums(x, sx)
    for t in prange(threads):
        acc = np.empty((4, 33), np.float32)
        acc_o = np.empty(8 * OUTPUTS, np.float32)
        for p in range(len(raws)):
            raw, dm, cols = raws[p], dms[p], colss[p]
            N, row_bytes = raw.shape
            n0, n1 = t * N // threads, (t + 1) * N // threads
            left, m0 = n0, 0  # the first output row the loops leave
            while m0 < M:  # ROWS_A_CALL input rows a call (all of them in one loop), then the 1-4 left
                R = ROWS_A_CALL if M - m0 >= ROWS_A_CALL else min(4, M - m0)
                m1 = m0 + R * ((M - m0) // R) if R == ROWS_A_CALL else m0 + R
                left = _over(q4_1, R, raw, dm, cols, n0, n1, x, m0, m1, sx, acc_o, out)
                m0 = m1
            for n in range(left, n1):  # the few output rows left, one a call
                m0 = 0
                while m0 < M:
                    R = min(4, M - m0)
                    _dots(q4_1, R, raw, n * row_bytes, x, m0 * K, K, sx, m0 * nb, acc)
                    for r in range(R):
                        s = acc[r, 32]
                        for j in range(32):
                            s += acc[r, j]
                        out[m0 + r, cols[n]] = s
                    m0 += R


def _over(q4_1, R, raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out):  # pragma: no cover - compiled only
    """quant_dots' loop around the `outputs` kernel for the block type and R (1-4, or 8) input rows
    (`make_over_outputs`): a part's output rows n0.. against input rows m0 .. m1; -> the row it left."""
    if not q4_1:
        if R == 8:
            return q80_over8(raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out)
        if R == 4:
            return q80_over4(raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out)
        if R == 3:
            return q80_over3(raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out)
        if R == 2:
            return q80_over2(raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out)
        return q80_over1(raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out)
    if R == 8:
        return q41_over8(raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out)
    if R == 4:
        return q41_over4(raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out)
    if R == 3:
        return q41_over3(raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out)
    if R == 2:
        return q41_over2(raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out)
    return q41_over1(raw, dm, cols, n0, n1, x, m0, m1, sx, acc, out)


def _dots(q4_1, R, raw, w_start, x, x_start, K, sx, sx_start, acc):  # pragma: no cover - compiled only
    """quant_dots' intrinsic for the block type and R (1-4) rows."""
    if q4_1:
        if R == 4:
            q41_dots4(raw, w_start, x, x_start, K, sx, sx_start, acc)
        elif R == 3:
            q41_dots3(raw, w_start, x, x_start, K, sx, sx_start, acc)
        elif R == 2:
            q41_dots2(raw, w_start, x, x_start, K, sx, sx_start, acc)
        else:
            q41_dots1(raw, w_start, x, x_start, K, sx, sx_start, acc)
    elif R == 4:
        q80_dots4(raw, w_start, x, x_start, K, sx, sx_start, acc)
    elif R == 3:
        q80_dots3(raw, w_start, x, x_start, K, sx, sx_start, acc)
    elif R == 2:
        q80_dots2(raw, w_start, x, x_start, K, sx, sx_start, acc)
    else:
        q80_dots1(raw, w_start, x, x_start, K, sx, sx_start, acc)


def _tiles(full, last, M, raws, colss, q4_1, out, threads):  # pragma: no cover - runs compiled by numba
    """out[:, cols[n]] for rows n of each part (raws[p], colss[p]) against M rows packed as
    tiles.pack_rows packs them (`full` [blocks, K, 16], `last` [0 or 1, K, 8]): a task is
    TILE_OUTPUTS output rows of one part, each thread a contiguous share of all parts' tasks (one parallel call for
    the matrix); a task dequantises its rows into `w_task` and runs the tile over every block of rows
    while they sit in cache."""
    blocks = full.shape[0]
    K = full.shape[1] if blocks else last.shape[1]
    O = TILE_OUTPUTS
    total = 0
    for p in range(len(raws)):
        total += -(-raws[p].shape[0] // O)
    for t in prange(threads):
        w_task = np.empty((O, K), np.float32)  # rows past a last task's few stay unused
        acc = np.empty((O, 16), np.float32)
        acc8 = np.empty((O, 8), np.float32)
        g0, g1 = t * total // threads, (t + 1) * total // threads
        base = 0
        for p in range(len(raws)):
            raw, cols = raws[p], colss[p]
            N, row_bytes = raw.shape
            tasks = -(-N // O)
            for g in range(max(g0, base), min(g1, base + tasks)):
                n0 = O * (g - base)
                rows = min(O, N - n0)
                for r in range(rows):
                    if q4_1:
                        q41_dequant(raw, (n0 + r) * row_bytes, K, w_task, r * K)
                    else:
                        q80_dequant(raw, (n0 + r) * row_bytes, K, w_task, r * K)
                for b in range(blocks):
                    tile(w_task, 0, full, b * K * 16, 16, K, acc)
                    m = 16 * b
                    for j in range(min(16, M - m)):
                        for r in range(rows):
                            out[m + j, cols[n0 + r]] = acc[r, j]
                if last.shape[0]:
                    tile8(w_task, 0, last, 0, 8, K, acc8)
                    m = 16 * blocks
                    for j in range(M - m):
                        for r in range(rows):
                            out[m + j, cols[n0 + r]] = acc8[r, j]
            base += tasks


def _dequantize_all(raws, colss, q4_1, dense, threads):  # pragma: no cover - runs compiled by numba
    """dense[cols[n]] = the dequantised row n of each part (dense [N, K] float32, C-contiguous),
    each thread a contiguous share of each part's rows."""
    K = dense.shape[1]
    for t in prange(threads):
        for p in range(len(raws)):
            raw, cols = raws[p], colss[p]
            N, row_bytes = raw.shape
            for n in range(t * N // threads, (t + 1) * N // threads):
                if q4_1:
                    q41_dequant(raw, n * row_bytes, K, dense, cols[n] * K)
                else:
                    q80_dequant(raw, n * row_bytes, K, dense, cols[n] * K)
