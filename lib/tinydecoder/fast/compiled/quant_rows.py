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

Per block, sum_j x_j (d q_j + m) = sum_j x_j (d q_j) + m * sum_j x_j, and sum_j x_j (the block's
sum of the input row) depends on the row only: the kernels compute it once per row and call, not
once per output. d * q_j is exact in float32 (an 11-bit times a 4- or 8-bit integer), so the
products equal x @ dequantised(W).T up to the order of float32 sums (the tests bound it). The
float16 scales are decoded in the kernel from their two bytes (x86's F16C conversion), so nothing
but the file's bytes is read: no scale arrays.

`QuantMatrix` wraps such a tensor as tinydecoder's [in, out] weight: `x @ w` in the reference
(it dequantises, see `QuantMatrix.__array__`), `fast.project` hands it to `product`. Several
tensors that a model fuses (Q, K and V; gate and up) stay separate views of the file, `parts`,
each writing its outputs to its own columns (`cols`), which also undoes llama.cpp's Q/K row order
without moving a byte. Its transpose `.T` is the embedding table view: `table[ids]` dequantises
just those rows.

Kernels (compiled by jit.compiled, every core): up to ROWS_UP_TO rows (a decode step, a
speculative check, a small batch), `_rows`: each thread walks its share of the output rows. One
input row against Q4_1 blocks (a decode step's layers) runs quant_dots' `outputs` kernel: OUTPUTS
output rows a call, read in the file's order with the memory asked for ahead, several blocks' sums
in flight, each output summed in registers (the weights picked from a table of 16 where the CPU has
AVX-512). Q8_0 blocks (the head) and two to eight rows run quant_dots' `dots` (Q8_0's `outputs`
streamed the 30 MB head from memory at half the speed, measured): per block the 32 weights are decoded once into registers and
multiplied with each input row (up to 4 a call) into 32 lane-wise sums per row. More rows (a
prefill), `_tiles`: each task dequantises 6 output rows into a small float32 buffer (in cache) and
runs tiles.py's register tile over every block of 16 packed rows, as tiles.py does for float32;
from DENSE_FROM_ROWS rows a matrix is dequantised whole into float32 first (`_dequantize_all`) and
tiles.py's own product runs on it (a little faster, see DENSE_FROM_ROWS).

Measured (SmolLM2, December 2026, 2 vCPUs of an AMD EPYC Zen 5 VM): one thread, one input row,
Q4_1 at K = 576 (18 blocks a row), 4.2 cycles a block when each output row was its own call
and summed its 32 lanes after it, 2.4-2.6 with `outputs` (in cache and from memory alike); the
30 MB Q8_0 head 1.5 ms. Whole decode steps (`bench`, q4_1 and f32 alternating in one run): 212-222
against f32's 69-76 tokens/s at context 128 (2.9-3.1x; before `outputs` and the prefetch, 177
against 76). A pass over several rows stays arithmetic-bound: 8 rows cost 4.1 decode steps
(float32: 1.2). Prefill 1-4% slower than f32's (its products give f32's tiles' numbers bit for
bit, plus the dequantising).
"""
from __future__ import annotations

import numpy as np

from . import jit

BLOCK = 32  # weights per block (both types)
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}
ROWS_UP_TO = 8  # up to this many rows: `_rows`; more: `_tiles`
TILE_OUTPUTS = 6  # output rows a `_tiles` task dequantises (tiles.OUTPUTS)
# From this many rows (a prefill), a matrix of at most DENSE_UP_TO_WEIGHTS weights is dequantised
# whole, once, into float32 and multiplied by tiles.py's float32 product (`_dense`); a larger one
# (the 28M-weight head over every row) runs `_tiles` without the copy. SmolLM2, 2 threads, q4_1 then
# f32 alternating (medians of 15 and 7): prefill of 100 tokens 0.109 s in `_tiles`, 0.1055 dense,
# f32 0.1023; 300 tokens 0.308, 0.3025, f32 0.294.
DENSE_FROM_ROWS = 16
DENSE_UP_TO_WEIGHTS = 1 << 22

prange = range  # numba.prange once compiled (jit.compiled)
INLINE = ("_block_sums", "_dots", "compiled.tiles.tile", "compiled.tiles.tile8", "compiled.quant_dots.q41_dequant",
          "compiled.quant_dots.q80_dequant",
          *(f"compiled.quant_dots.q41_outputs{R}" for R in (1, 2, 3, 4)), "_outputs",
          *(f"compiled.quant_dots.q{t}_dots{R}" for t in ("41", "80") for R in (1, 2, 3, 4)))  # compiled into the kernels
tile = tile8 = None  # tiles.py's register tiles, bound by jit.compiled (tiles imports numba)
q41_dots1 = q41_dots2 = q41_dots3 = q41_dots4 = None  # quant_dots' intrinsics, bound by jit.compiled
q80_dots1 = q80_dots2 = q80_dots3 = q80_dots4 = q41_dequant = q80_dequant = None
q41_outputs1 = q41_outputs2 = q41_outputs3 = q41_outputs4 = None
OUTPUTS = 4  # quant_dots.OUTPUTS: output rows per call of the one-row kernels


class QuantMatrix:
    """A weight [in K, out N] (`x @ w`) whose outputs are GGUF rows of blocks, read in place.

    parts: [(raw, cols)]: raw [n_i, K / 32 * block bytes] uint8 (a view of the file: one row per
    output, its blocks in order), cols [n_i] int: the output column each of its rows gives.
    kind: "Q4_1" or "Q8_0". transposed: the [N, K] table view (`.T`; `table[ids]` -> rows)."""

    dtype = np.dtype(np.float32)  # what it computes in and gives (the compute type, not the storage)
    ndim = 2

    def __init__(self, parts, kind: str, K: int, transposed: bool = False):
        if kind not in BLOCK_BYTES:
            raise ValueError(f"kind must be one of {sorted(BLOCK_BYTES)}, got {kind!r}")
        if K <= 0 or K % BLOCK:
            raise ValueError(f"K (inputs per output) must be a positive multiple of {BLOCK}, got {K}")
        row_bytes = K // BLOCK * BLOCK_BYTES[kind]
        checked = []
        for raw, cols in parts:
            raw, cols = np.asarray(raw), np.ascontiguousarray(cols, np.int64)
            if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != row_bytes or not raw.flags.c_contiguous:
                raise ValueError(f"a {kind} part with K={K} is a C-contiguous uint8 [rows, {row_bytes}] array, "
                                 f"got {raw.dtype}{list(raw.shape)}")
            if cols.shape != (raw.shape[0],):
                raise ValueError(f"cols must give one column per row: {raw.shape[0]}, got {list(cols.shape)}")
            checked.append((raw, cols))
        self.parts, self.kind, self.K, self.transposed = tuple(checked), kind, K, transposed
        self.raws, self.cols = tuple(r for r, _ in checked), tuple(c for _, c in checked)  # as the kernels take them
        self.N = sum(len(c) for _, c in checked)
        every = np.sort(np.concatenate([c for _, c in checked])) if checked else np.zeros(0, np.int64)
        if not np.array_equal(every, np.arange(self.N)):
            raise ValueError(f"the parts' cols must name each output column 0..{self.N - 1} once")

    @classmethod
    def from_blocks(cls, raw, kind: str, K: int) -> QuantMatrix:
        """One tensor: raw [N, K/32 * block bytes] (or its flat bytes), output n = row n."""
        raw = np.asarray(raw)
        row_bytes = K // BLOCK * BLOCK_BYTES.get(kind, 0) if K % BLOCK == 0 else 0
        if raw.ndim == 1 and row_bytes and raw.size % row_bytes == 0:
            raw = raw.reshape(-1, row_bytes)
        return cls([(raw, np.arange(raw.shape[0] if raw.ndim == 2 else 0))], kind, K)

    @property
    def shape(self) -> tuple:
        return (self.N, self.K) if self.transposed else (self.K, self.N)

    @property
    def size(self) -> int:
        return self.N * self.K

    @property
    def nbytes(self) -> int:
        """Bytes of blocks a product reads (the file's, not float32's)."""
        return sum(raw.nbytes for raw, _ in self.parts)

    @property
    def T(self) -> QuantMatrix:
        return QuantMatrix(self.parts, self.kind, self.K, not self.transposed)

    def __repr__(self) -> str:
        return f"QuantMatrix({self.kind}, shape={self.shape}, parts={len(self.parts)}, {self.nbytes:,} bytes)"

    def rows(self, outputs) -> np.ndarray:
        """Outputs' weight rows dequantised: [len(outputs), K] float32 (W[n, :] for each n)."""
        outputs = np.asarray(outputs)
        if outputs.dtype.kind not in "iu":
            raise ValueError(f"rows are chosen by integer ids, got {outputs.dtype}")
        flat = outputs.reshape(-1)
        if flat.size and (flat.min() < -self.N or flat.max() >= self.N):
            raise IndexError(f"ids must lie in [0, {self.N}), got {int(flat.min())}..{int(flat.max())}")
        flat = flat % self.N
        out = np.empty((flat.size, self.K), np.float32)
        for raw, cols in self.parts:
            where = np.full(self.N, -1, np.int64)
            where[cols] = np.arange(len(cols))
            mine = where[flat]
            hit = mine >= 0
            if hit.any():
                out[hit] = dequantize_rows(raw[mine[hit]], self.kind)
        return out.reshape(*outputs.shape, self.K)

    def dequantize(self) -> np.ndarray:
        """The whole matrix as float32, shaped as this view is ([K, N], or [N, K] transposed)."""
        w = self.rows(np.arange(self.N))  # [N, K]
        return w if self.transposed else w.T

    def __array__(self, dtype=None, copy=None):
        """numpy's view of it (np.asarray, `x @ w`): the dequantised float32 matrix. The reference
        forward pass computes with it so, slowly but in plain numpy."""
        w = self.dequantize()
        return w if dtype is None else w.astype(dtype)

    def __getitem__(self, key):
        """Table view [N, K]: `table[ids]` -> dequantised rows. Matrix view [K, N]: `w[:, a:b]` ->
        the outputs a..b-1 (whole parts only: Q, K and V of a fused matrix)."""
        if self.transposed:
            return self.rows(key)
        if (isinstance(key, tuple) and len(key) == 2 and key[0] == slice(None)
                and isinstance(key[1], slice) and key[1].step in (None, 1)):
            a, b, _ = key[1].indices(self.N)
            parts = []
            for raw, cols in self.parts:
                inside = (cols >= a) & (cols < b)
                if inside.all():
                    parts.append((raw, cols - a))
                elif inside.any():
                    raise ValueError(f"columns {a}:{b} cut a part of this QuantMatrix; take whole parts")
            return QuantMatrix(parts, self.kind, self.K)
        raise TypeError(f"a QuantMatrix [in, out] takes w[:, a:b] (whole parts), got {key!r}; "
                        f"np.asarray(w) dequantises it")


def dequantize_rows(raw: np.ndarray, kind: str) -> np.ndarray:
    """Rows of blocks [n, K/32 * bytes] uint8 -> [n, K] float32 (numpy; a few rows at a time)."""
    raw = np.asarray(raw, np.uint8)
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, BLOCK_BYTES[kind])  # [n, K/32, bytes]
    d = blocks[..., 0:2].copy().view("<f2").astype(np.float32)  # [n, K/32, 1]
    if kind == "Q4_1":
        m = blocks[..., 2:4].copy().view("<f2").astype(np.float32)
        codes = blocks[..., 4:20]
        q = np.concatenate([codes & 0x0F, codes >> 4], axis=-1).astype(np.float32)  # [n, K/32, 32]
        return (d * q + m).reshape(n, -1)
    q = blocks[..., 2:34].view(np.int8).astype(np.float32)
    return (d * q).reshape(n, -1)


# ----------------------------------------------------------------------------- products

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
    x = np.ascontiguousarray(x)
    M = x.shape[0]
    if M == 0:
        return out
    threads = jit.threads()
    if M <= ROWS_UP_TO:
        jit.compiled(_rows)(x, w.raws, w.cols, w.kind == "Q4_1", out, threads)  # every part in one call
        return out
    from . import tiles

    if M >= DENSE_FROM_ROWS and w.N * w.K <= DENSE_UP_TO_WEIGHTS:  # float32 [N, K] once, tiles.py's product
        dense = np.empty((w.N, w.K), np.float32)
        jit.compiled(_dequantize_all)(w.raws, w.cols, w.kind == "Q4_1", dense, threads)
        return tiles.product(x, dense.T, out, work)
    K = w.K
    tail = M % tiles.ROWS if M % tiles.ROWS <= 8 else 0
    blocks, lasts = -(-(M - tail) // tiles.ROWS), int(tail > 0)
    if work is None or work.size < tiles.work_numbers(M, K):
        work = np.empty(tiles.work_numbers(M, K), np.float32)
    full = work[:blocks * K * tiles.ROWS].reshape(blocks, K, tiles.ROWS)
    last = work[blocks * K * tiles.ROWS:(blocks * tiles.ROWS + lasts * 8) * K].reshape(lasts, K, 8)
    jit.compiled(tiles._pack)(x, full, last, threads)
    jit.compiled(_tiles)(full, last, M, w.raws, w.cols, w.kind == "Q4_1", out, threads)  # every part in one call
    return out


def _block_sums(x, sx):  # pragma: no cover - runs compiled by numba
    M, K = x.shape
    for r in range(M):
        for b in range(K // 32):
            s = np.float32(0.0)
            for j in range(32):
                s += x[r, 32 * b + j]
            sx[r, b] = s


def _rows(x, raws, colss, q4_1, out, threads):  # pragma: no cover - runs compiled by numba
    """out[:, cols[n]] = x @ W[n] for each row n of blocks in each part (raws[p], colss[p]; Q4_1
    or Q8_0): each thread takes a contiguous share of each part's rows, and each output row runs
    against the input rows 4 at a time (quant_dots: the blocks decoded in registers, 32 lane-wise
    sums per input row)."""
    M, K = x.shape
    nb = K // 32
    sx = np.empty((M, nb), np.float32)  # each row's block sums (Q4_1's m term)
    if q4_1:
        _block_sums(x, sx)
    for t in prange(threads):
        acc = np.empty((4, 33), np.float32)
        acc_o = np.empty(4 * OUTPUTS, np.float32)
        for p in range(len(raws)):
            raw, cols = raws[p], colss[p]
            N, row_bytes = raw.shape
            n0, n1 = t * N // threads, (t + 1) * N // threads
            if q4_1:  # OUTPUTS output rows a call against up to 4 input rows, summed in registers
                while n0 + OUTPUTS <= n1:
                    m0 = 0
                    while m0 < M:  # the next input rows against the same blocks, now in cache
                        R = min(4, M - m0)
                        _outputs(R, raw, n0 * row_bytes, x, m0 * K, K, sx, m0 * nb, acc_o)
                        for o in range(OUTPUTS):
                            for r in range(R):
                                out[m0 + r, cols[n0 + o]] = acc_o[o * R + r]
                        m0 += R
                    n0 += OUTPUTS
            for n in range(n0, n1):
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


def _outputs(R, raw, w_start, x, x_start, K, sx, sx_start, acc):  # pragma: no cover - compiled only
    """quant_dots' Q4_1 `outputs` intrinsic for R (1-4) input rows."""
    if R == 4:
        q41_outputs4(raw, w_start, x, x_start, K, sx, sx_start, acc)
    elif R == 3:
        q41_outputs3(raw, w_start, x, x_start, K, sx, sx_start, acc)
    elif R == 2:
        q41_outputs2(raw, w_start, x, x_start, K, sx, sx_start, acc)
    else:
        q41_outputs1(raw, w_start, x, x_start, K, sx, sx_start, acc)


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
    tiles.pack_rows packs them (`full` [blocks, K, 16], `last` [0 or 1, K, 8]): a task is 6 output
    rows of one part, each thread a contiguous share of all parts' tasks (one parallel call for
    the matrix); a task dequantises its rows into `w6` and runs the tile over every block of rows
    while they sit in cache."""
    blocks = full.shape[0]
    K = full.shape[1] if blocks else last.shape[1]
    total = 0
    for p in range(len(raws)):
        total += -(-raws[p].shape[0] // 6)
    for t in prange(threads):
        w6 = np.empty((6, K), np.float32)  # rows past a last task's few stay unused
        acc = np.empty((6, 16), np.float32)
        acc8 = np.empty((6, 8), np.float32)
        g0, g1 = t * total // threads, (t + 1) * total // threads
        base = 0
        for p in range(len(raws)):
            raw, cols = raws[p], colss[p]
            N, row_bytes = raw.shape
            tasks = -(-N // 6)
            for g in range(max(g0, base), min(g1, base + tasks)):
                n0 = 6 * (g - base)
                rows = min(6, N - n0)
                for r in range(rows):
                    if q4_1:
                        q41_dequant(raw, (n0 + r) * row_bytes, K, w6, r * K)
                    else:
                        q80_dequant(raw, (n0 + r) * row_bytes, K, w6, r * K)
                for b in range(blocks):
                    tile(w6, 0, full, b * K * 16, 16, K, acc)
                    m = 16 * b
                    for j in range(min(16, M - m)):
                        for r in range(rows):
                            out[m + j, cols[n0 + r]] = acc[r, j]
                if last.shape[0]:
                    tile8(w6, 0, last, 0, 8, K, acc8)
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
