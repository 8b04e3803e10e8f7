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
product of a contiguous weight row with every input row. A task takes OUTPUTS = 8 weight rows
at once: they are loaded into cache once and stay there while every input row passes, and each
input value loaded serves eight running sums (eight independent FMA chains, and eight streams
from memory in flight). The tasks are split between threads.

(tunables.py records what was measured.)

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


def threads() -> int:
    """How many threads numba's kernels use: numba's setting, else 1."""
    if not available():
        return 1
    import numba

    return int(numba.get_num_threads())


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
    return product(x, w, out)


def product(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`rows_times` without its checks, for a caller that has made them (`fast.project`)."""
    _kernel()(np.ascontiguousarray(x), w.T, out)  # w.T: [N, K], one contiguous row per output
    return out


OUTPUTS = 8  # outputs computed together: each loaded input value serves eight weight rows
prange = range  # numba.prange once compiled (see `compiled`): the loops it marks are split between threads
_compiled = {}


def compiled(fn, parallel: bool = True):
    """`fn` compiled by numba (fastmath, cached on disk; parallel unless said), once per process.
    The functions it compiles are plain Python in this package whose module binds `prange = range`;
    compiled in parallel, their `prange` loops run on numba's threads (starting them costs a few
    microseconds a call: small work is compiled serial). The first call compiles (seconds) or
    loads numba's disk cache, under a lock shared by this user's processes: two processes
    starting at once (two notebooks, two test workers) compile once, and the second loads."""
    key = (fn, parallel)
    if key not in _compiled:
        import numba

        fn.__globals__["prange"] = numba.prange  # the name the function's module reads
        dispatcher = numba.njit(parallel=parallel, fastmath=True, cache=True)(fn)

        def first_call(*args):
            with _compile_lock():
                out = dispatcher(*args)
            _compiled[key] = dispatcher  # later calls go straight to numba
            return out

        _compiled[key] = first_call
    return _compiled[key]


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
    blocks = N // OUTPUTS
    for p in prange(blocks):  # eight outputs (eight weight rows) per task
        n = OUTPUTS * p
        w0, w1, w2, w3, w4, w5, w6, w7 = wt[n], wt[n + 1], wt[n + 2], wt[n + 3], wt[n + 4], wt[n + 5], wt[n + 6], wt[n + 7]
        for m in range(M):  # the eight rows stay in cache while every input row passes
            y = x[m]
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
            for k in range(K):
                v = y[k]
                s0 += v * w0[k]
                s1 += v * w1[k]
                s2 += v * w2[k]
                s3 += v * w3[k]
                s4 += v * w4[k]
                s5 += v * w5[k]
                s6 += v * w6[k]
                s7 += v * w7[k]
            out[m, n], out[m, n + 1], out[m, n + 2], out[m, n + 3] = s0, s1, s2, s3
            out[m, n + 4], out[m, n + 5], out[m, n + 6], out[m, n + 7] = s4, s5, s6, s7
    for n in prange(OUTPUTS * blocks, N):  # the last N % 8 outputs, one at a time
        col = wt[n]
        for m in range(M):
            y = x[m]
            s = np.float32(0.0)
            for k in range(K):
                s += y[k] * col[k]
            out[m, n] = s
    return out
