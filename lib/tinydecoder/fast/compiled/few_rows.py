"""A few rows times a weight matrix, reading the weights once: the fast path's kernel for decode
steps, speculative verification and small batches (optional: it needs numba).

Why. A decode step multiplies one row by every weight matrix, so it streams ~540 MB and does
2 FLOPs per 4-byte weight: memory-bound. Two, four or eight rows could cost about as much, since
the weights are read once whatever the number of rows, and the extra FLOPs fit under the time the
read takes. numpy's BLAS does not get there: a matrix-vector product per row reads the weights
once per row, and its GEMM packs skinny operands at a fraction of the bandwidth (docs/fast_path.md has the
measurements). This kernel computes

    out[m, n] = sum_k x[m, k] * w[k, n]        x [M, K], w [K, N] stored out-major, out [M, N]

for a weight stored "out-major" (Fortran order: the K weights of output n lie together, as in
the GGUF file; `checkpoint.weights` stores every SmolLM2 matrix so). Each output n is a dot
product of a contiguous weight row with every input row. A task takes OUTPUTS = 4 weight rows;
the tasks are split between threads, so each thread walks its half of the matrix front to back.
A task reads its weight rows one after the other, each once from memory, and sweeps it against
four input rows at a time (`dot_rows`: one loaded weight serves four running sums; the next
sweeps find the row in cache): the weights stream in memory order, which is what a
memory-bound product needs. It computes any number of rows, but beyond a few the arithmetic
counts more than the stream: `forward_pass.project` gives more than tunables.SWEEPS_UP_TO_ROWS rows to
`tiles.py`, whose register tiles feed more multiply-adds per load.

Four rows (when K is a multiple of 8) run in llvm.py's `kdots2x4` instead of the sweeps: a call
takes two weight rows and the four input rows 8 k at a time, 2 + 4 vector loads feeding 8
multiply-adds into 8 vectors of partial sums (reduced at the end), while it prefetches the
weight rows 6 ahead into L2 (without the prefetch it read them at ~0.6x the sweeps' rate).
Whole SmolLM2 passes over 4 rows, both alternating in one process (December 2026, the Zen 4
machine of tunables.STREAM_PREFETCH): 0.84-0.90x the sweeps' time at contexts 128 and 512. Two
rows in 2 x 2 calls took 1.12-1.18x, three rows the same time: they keep the sweeps.

(tunables.py records what was measured.)

It is compiled with numba on first use (cached on disk afterwards). Without numba, or without
threadpoolctl (see `one_blas_thread`), `available()` is False and the fast path uses numpy's BLAS
for every product; the numbers are the same up to float rounding (the sums run in another
order), which the tests bound.
"""
from __future__ import annotations

import numpy as np

from .. import tunables
from ..aligned import on64
from .jit import available, compiled


def fits(x: np.ndarray, w: np.ndarray) -> bool:
    """Whether `rows_times(x, w, out)` applies: float32 rows and an out-major float32 weight."""
    return (available() and x.dtype == np.float32 and w.dtype == np.float32 and x.ndim == 2
            and w.ndim == 2 and w.flags.f_contiguous and x.shape[1] == w.shape[0])


def takes(w: np.ndarray) -> bool:
    """Whether the fast path gives weight w to numba's products (this module's sweeps or tiles.py's
    tiles): numba installed, w out-major float32 [K, N] of at least tunables.SKINNY_MIN_WEIGHTS
    numbers. `forward_pass.project` and `fused.fits` both ask it, so the two paths pick alike."""
    return (available() and isinstance(w, np.ndarray) and w.dtype == np.float32 and w.ndim == 2 and w.flags.f_contiguous
            and w.size >= tunables.SKINNY_MIN_WEIGHTS)


def rows_times(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = x @ w for x [M, K] float32 and w [K, N] float32 in Fortran order (see `fits`);
    out [M, N] float32, C-contiguous, written in place and returned."""
    check_rows_times(x, w, out)
    return product(x, w, out)


def check_rows_times(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """ValueError unless `fits(x, w)` and out is a C-contiguous float32 [M, N] (this module's and
    tiles.py's `rows_times`)."""
    if not fits(x, w):
        raise ValueError(f"rows_times needs float32 x [M, K] and an out-major (Fortran-order) float32 w [K, N]; "
                         f"got x {x.dtype}{list(x.shape)}, w {w.dtype}{list(w.shape)} "
                         f"{'F' if w.flags.f_contiguous else 'C' if w.flags.c_contiguous else 'strided'}"
                         + ("" if available() else " (and numba is not installed)"))
    if out.shape != (x.shape[0], w.shape[1]) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"rows_times writes a C-contiguous float32 out of shape {[x.shape[0], w.shape[1]]}, "
                         f"got {out.dtype}{list(out.shape)}")


def product(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`rows_times` without its checks, for a caller that has made them (`forward_pass.project`)."""
    x = on64(x) if x.shape[0] > 1 else np.ascontiguousarray(x)  # the sweeps load the rows again for every output
    _kernel()(x, w.T, out)  # w.T: [N, K], one contiguous row per output
    return out


OUTPUTS = 4  # outputs per task: their weight rows stay in cache while every input row passes
PIECES = 16  # 4 rows: the tasks run in this many contiguous runs, each allocating its sums once
INLINE = ("dot_rows", "_dot1", "_dot2", "_dot3", "_dot4",  # small functions compiled into the kernel (`compiled`)
          "compiled.llvm.kdots2x4")
kdots2x4 = None  # llvm.py's, bound by `compiled` (it imports numba)
prange = range  # numba.prange once compiled (see `compiled`): the loops it marks are split between threads
def _kernel():
    return compiled(_rows_times_rows)


def _rows_times_rows(x, wt, out):  # pragma: no cover - runs compiled by numba
    """out[m, n] = x[m] . wt[n] for x [M, K], wt [N, K] (both C-contiguous)."""
    N = wt.shape[0]
    M, K = x.shape
    tasks = N // OUTPUTS
    if M == 4 and K % 8 == 0 and K > 0:  # 4 rows: llvm.kdots2x4, two outputs x four rows a call
        pieces = min(tasks, PIECES)
        for piece in prange(pieces):  # contiguous runs of tasks, each with its own sums
            acc = np.empty((2, 8), np.float32)
            for p in range(piece * tasks // pieces, (piece + 1) * tasks // pieces):
                for n in range(OUTPUTS * p, OUTPUTS * p + OUTPUTS, 2):
                    kdots2x4(wt, n * K, x, 0, K, K, acc)
                    for r in range(2):
                        for m in range(4):
                            out[m, n + r] = acc[r, m]
    else:
        for p in prange(N // OUTPUTS):  # a task: four outputs (four weight rows), each read front to back
            for j in range(OUTPUTS * p, OUTPUTS * p + OUTPUTS):
                dot_rows(x, wt[j], out, j, K)
    for j in range(OUTPUTS * (N // OUTPUTS), N):  # the last N % 4 outputs
        dot_rows(x, wt[j], out, j, K)
    return out


def dot_rows(x, w, out, n, K):  # pragma: no cover - runs compiled by numba
    """out[m, n] = x[m] . w for every row m of x [M, K] and one weight row w [K] (compiled only:
    `compiled` binds it into the kernels that call it): four rows per sweep over w, then the
    1-3 left."""
    M = x.shape[0]
    m = 0
    while m + 4 <= M:
        _dot4(x, m, w, out, n, K)
        m += 4
    if M - m == 3:
        _dot3(x, m, w, out, n, K)
    elif M - m == 2:
        _dot2(x, m, w, out, n, K)
    elif M - m == 1:
        _dot1(x, m, w, out, n, K)


# The sweeps: R rows times one weight row, one running sum each (in registers). Each
# loaded weight serves R rows; numba vectorises the loop over k (8 floats at a time on AVX2).

def _dot1(x, m, w, out, n, K):  # pragma: no cover - runs compiled by numba
    a = x[m]
    s = np.float32(0.0)
    for k in range(K):
        s += a[k] * w[k]
    out[m, n] = s


def _dot2(x, m, w, out, n, K):  # pragma: no cover - runs compiled by numba
    a, b = x[m], x[m + 1]
    sa = sb = np.float32(0.0)
    for k in range(K):
        u = w[k]
        sa += a[k] * u
        sb += b[k] * u
    out[m, n], out[m + 1, n] = sa, sb


def _dot3(x, m, w, out, n, K):  # pragma: no cover - runs compiled by numba
    a, b, c = x[m], x[m + 1], x[m + 2]
    sa = sb = sc = np.float32(0.0)
    for k in range(K):
        u = w[k]
        sa += a[k] * u
        sb += b[k] * u
        sc += c[k] * u
    out[m, n], out[m + 1, n], out[m + 2, n] = sa, sb, sc


def _dot4(x, m, w, out, n, K):  # pragma: no cover - runs compiled by numba
    a, b, c, d = x[m], x[m + 1], x[m + 2], x[m + 3]
    sa = sb = sc = sd = np.float32(0.0)
    for k in range(K):
        u = w[k]
        sa += a[k] * u
        sb += b[k] * u
        sc += c[k] * u
        sd += d[k] * u
    out[m, n], out[m + 1, n], out[m + 2, n], out[m + 3, n] = sa, sb, sc, sd
