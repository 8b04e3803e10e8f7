"""A few rows times a weight matrix, reading the weights once: the fast path's kernel for decode
steps, speculative verification and small batches (optional: it needs numba).

Why. A decode step multiplies one row by every weight matrix, so it streams ~540 MB and does
2 FLOPs per 4-byte weight: memory-bound. Two, four or eight rows could cost about as much, since
the weights are read once whatever the number of rows, and the extra FLOPs fit under the time the
read takes. numpy's BLAS does not get there: a matrix-vector product per row reads the weights
once per row, and its GEMM packs skinny operands at a fraction of the bandwidth (issue 23 has the
measurements). This kernel computes

    out[m, n] = sum_k x[m, k] * w[k, n]        x [M, K], w [K, N] stored out-major, out [M, N]

for a weight stored "out-major" (Fortran order: the K weights of output n lie together, as in
the GGUF file; `checkpoint.weights` stores every SmolLM2 matrix so). Each output n is a dot
product of a contiguous weight row with every input row: the weight row is loaded once into
cache and used by up to four rows at a time (four running sums per loaded weight), and the N
outputs are split between threads. From PAIR_ROWS rows on, two weight rows go together (eight
running sums), so each loaded input value also serves two outputs.

It is compiled with numba on first use (cached on disk afterwards). Without numba,
`available()` is False and the fast path uses numpy's BLAS for every product; the numbers are
the same up to float rounding (the sums run in another order), which the tests bound.
"""
from __future__ import annotations

import contextlib
import importlib.util

import numpy as np

# numba is optional (pip install "tinydecoder[fast]") and imported on the first product only, so
# that a notebook on the toy models never pays for importing it.
_HAVE_NUMBA = importlib.util.find_spec("numba") is not None


def available() -> bool:
    """True when numba is installed, so `rows_times` can run."""
    return _HAVE_NUMBA


_blas = None


def one_blas_thread():
    """A context in which numpy's BLAS runs on one thread (threadpoolctl), for a pass that runs
    numba's kernels: two thread pools on the same cores otherwise wait on each other's spinning
    threads (measured on 2 cores: decode steps several times slower, see `serving.machine.settle`).
    Without threadpoolctl, a no-op."""
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _blas = False
        else:
            _blas = ThreadpoolController().select(user_api="blas")
    return _blas.limit(limits=1) if _blas else contextlib.nullcontext()


_pool = None


def threads() -> int:
    """How many threads numba's kernels (and `split_matmul`) use: numba's setting, else 1."""
    if not available():
        return 1
    import numba

    return int(numba.get_num_threads())


def split_matmul(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = x @ w as `threads()` numpy products over column blocks of w, run at once on a pool of
    Python threads (numpy releases the GIL in a product), for the many-row products (a prefill)
    of a pass that holds numpy's BLAS to one thread (`one_blas_thread`): the cores are used
    without waking BLAS threads that would then spin. -> out."""
    global _pool
    n = threads()
    if n == 1 or w.shape[1] < 2 * n:
        return np.matmul(x, w, out=out)
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(n, thread_name_prefix="tinydecoder-matmul")
    cuts = [w.shape[1] * i // n for i in range(n + 1)]
    parts = [_pool.submit(_matmul_into, x, w[:, a:b], out[:, a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    for part in parts:
        part.result()
    return out


def _matmul_into(x, w, out):
    np.matmul(x, w, out=out)  # out: a column block of the caller's array (BLAS writes it in place)


def fits(x: np.ndarray, w: np.ndarray) -> bool:
    """Whether `rows_times(x, w, out)` applies: float32 rows and an out-major float32 weight."""
    return (available() and x.dtype == np.float32 and w.dtype == np.float32 and x.ndim == 2
            and w.ndim == 2 and w.flags.f_contiguous and x.shape[1] == w.shape[0])


def rows_times(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = x @ w for x [M, K] float32 and w [K, N] float32 in Fortran order (see `fits`);
    out [M, N] float32, C-contiguous, written in place and returned."""
    if not fits(x, w):
        raise ValueError(f"rows_times needs float32 x [M, K] and an out-major (Fortran-order) float32 w [K, N]; "
                         f"got x {x.dtype}{list(x.shape)}, w {w.dtype}{list(w.shape)} "
                         f"{'F' if w.flags.f_contiguous else 'C' if w.flags.c_contiguous else 'strided'}"
                         + ("" if available() else " (and numba is not installed)"))
    if out.shape != (x.shape[0], w.shape[1]) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"rows_times writes a C-contiguous float32 out of shape {[x.shape[0], w.shape[1]]}, "
                         f"got {out.dtype}{list(out.shape)}")
    _kernel()(np.ascontiguousarray(x), w.T, out)  # w.T: [N, K], one contiguous row per output
    return out


PAIR_ROWS = 8  # from this many rows on, outputs go in pairs (measured: at 4 rows pairs were slower)
prange = range  # numba.prange once compiled (see `compiled`): the loops it marks are split between threads
_compiled = {}


def compiled(fn):
    """`fn` compiled by numba (parallel, fastmath, cached on disk), once per process. The
    functions it compiles are plain Python in this package whose module binds `prange = range`;
    compiled, their `prange` loops run on numba's threads. The first call compiles (seconds) or
    loads numba's disk cache, under a lock shared by this user's processes: two processes
    starting at once (two notebooks, two test workers) compile once, and the second loads."""
    if fn not in _compiled:
        import numba

        fn.__globals__["prange"] = numba.prange  # the name the function's module reads
        dispatcher = numba.njit(parallel=True, fastmath=True, cache=True)(fn)

        def first_call(*args):
            with _compile_lock():
                out = dispatcher(*args)
            _compiled[fn] = dispatcher  # later calls go straight to numba
            return out

        _compiled[fn] = first_call
    return _compiled[fn]


@contextlib.contextmanager
def _compile_lock():
    """An exclusive lock on a file in the temporary folder (POSIX; elsewhere no lock)."""
    try:
        import fcntl
    except ImportError:  # Windows: two processes may both compile, which is only slower
        yield
        return
    import os
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"tinydecoder-numba-{os.getuid()}.lock")
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # the lock goes with the file's closing


def _kernel():
    return compiled(_rows_times_rows)


def _rows_times_rows(x, wt, out):  # pragma: no cover - runs compiled by numba
    """out[m, n] = x[m] . wt[n] for x [M, K], wt [N, K] (both C-contiguous)."""
    M, K = x.shape
    N = wt.shape[0]
    pairs = N // 2 if M >= PAIR_ROWS else 0  # with PAIR_ROWS or more rows, outputs go two at a time
    for p in prange(pairs):  # two outputs x four rows: eight running sums per step of k
        n = 2 * p
        a, b = wt[n], wt[n + 1]
        m = 0
        while m + 4 <= M:
            x0, x1, x2, x3 = x[m], x[m + 1], x[m + 2], x[m + 3]
            a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
            for k in range(K):
                u, v = a[k], b[k]
                y0, y1, y2, y3 = x0[k], x1[k], x2[k], x3[k]
                a0 += y0 * u
                a1 += y1 * u
                a2 += y2 * u
                a3 += y3 * u
                b0 += y0 * v
                b1 += y1 * v
                b2 += y2 * v
                b3 += y3 * v
            out[m, n], out[m + 1, n], out[m + 2, n], out[m + 3, n] = a0, a1, a2, a3
            out[m, n + 1], out[m + 1, n + 1], out[m + 2, n + 1], out[m + 3, n + 1] = b0, b1, b2, b3
            m += 4
        while m < M:  # the rows left over (M not a multiple of 4)
            y = x[m]
            a0 = b0 = np.float32(0.0)
            for k in range(K):
                a0 += y[k] * a[k]
                b0 += y[k] * b[k]
            out[m, n], out[m, n + 1] = a0, b0
            m += 1
    for n in prange(2 * pairs, N):  # one output at a time: fewer than PAIR_ROWS rows, or N odd
        col = wt[n]
        m = 0
        while m + 4 <= M:
            x0, x1, x2, x3 = x[m], x[m + 1], x[m + 2], x[m + 3]
            s0 = s1 = s2 = s3 = np.float32(0.0)
            for k in range(K):
                c = col[k]
                s0 += x0[k] * c
                s1 += x1[k] * c
                s2 += x2[k] * c
                s3 += x3[k] * c
            out[m, n], out[m + 1, n], out[m + 2, n], out[m + 3, n] = s0, s1, s2, s3
            m += 4
        while m + 2 <= M:
            x0, x1 = x[m], x[m + 1]
            s0 = s1 = np.float32(0.0)
            for k in range(K):
                c = col[k]
                s0 += x0[k] * c
                s1 += x1[k] * c
            out[m, n], out[m + 1, n] = s0, s1
            m += 2
        if m < M:
            y = x[m]
            s0 = np.float32(0.0)
            for k in range(K):
                s0 += y[k] * col[k]
            out[m, n] = s0
    return out
