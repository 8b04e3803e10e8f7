"""Arrays whose first byte sits on a 64-byte boundary: a cache line, and one AVX-512 vector.

numpy's allocations start on 16-byte boundaries (large ones at 16 bytes past a page), so a kernel
that loads 64 bytes at a time from such a row reads two cache lines for every vector. From
memory that costs nothing (the stream is the same lines); from cache it halves the loads a cycle
can make, and the kernels that reuse a few input rows against every weight are bound by exactly
those loads. Measured (SmolLM2's 120 layer products, 2 vCPUs of an AMD EPYC, Zen 5, December
2026, medians of 7-9 alternating rounds; docs/fast_path.md): Q4_1 blocks against 3 / 4 / 8 input
rows 3.43 / 4.00 / 6.75 ms with the rows 64-byte aligned against 4.23 / 5.23 / 10.00 at 16 bytes
past a line; float32 sweeps over 2 / 3 rows 8.7 / 9.1 ms against 10.4 / 11.4.

    x = empty64((rows, K))         # like np.empty, float32 unless told
    x = on64(x)                    # x itself where it is aligned and C-contiguous, else an aligned copy
"""
from __future__ import annotations

import math

import numpy as np

LINE = 64  # bytes


def empty64(shape, dtype=np.float32) -> np.ndarray:
    """np.empty(shape, dtype), C-contiguous, its data starting on a LINE-byte boundary."""
    dtype = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    buf = np.empty(nbytes + LINE, np.uint8)
    start = -buf.ctypes.data % LINE
    return buf[start:start + nbytes].view(dtype).reshape(shape)


def is64(a: np.ndarray) -> bool:
    """Whether a's data starts on a LINE-byte boundary."""
    return a.ctypes.data % LINE == 0


def on64(a: np.ndarray) -> np.ndarray:
    """a where it is C-contiguous and starts on a line, else a C-contiguous copy that does."""
    if a.flags.c_contiguous and is64(a):
        return a
    out = empty64(a.shape, a.dtype)
    out[...] = a
    return out
