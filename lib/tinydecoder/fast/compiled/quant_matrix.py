"""A weight matrix kept as the GGUF file's own blocks (Q4_1 or Q8_0), read in place: `QuantMatrix`,
the [in, out] weight that quant_rows' kernels multiply by (see quant_rows for the layouts and the
kernels), and `dequantize_rows`, numpy's dequantisation of a few rows. Plain numpy: no numba."""
from __future__ import annotations

import numpy as np

BLOCK = 32  # weights per block (both types)
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}


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
        self._where_cache = None  # `_where`'s map, made on first use
        self._planes = None  # quant_planes.planes': the parts in planes, or False where they do not apply
        self._scales = None  # quant_rows.scales': the parts' (d, m) as float32, or placeholders
        self.raws, self.cols = tuple(r for r, _ in checked), tuple(c for _, c in checked)  # as the kernels take them
        self.N = sum(len(c) for _, c in checked)
        every = np.sort(np.concatenate([c for _, c in checked])) if checked else np.zeros(0, np.int64)
        if not np.array_equal(every, np.arange(self.N)):
            raise ValueError(f"the parts' cols must name each output column 0..{self.N - 1} once")
        self._in_order = len(checked) == 1 and np.array_equal(checked[0][1], every)  # `rows` reads row n

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
        if self._in_order:  # one tensor, output n in row n (an embedding table): its rows as they lie
            return dequantize_rows(self.raws[0][flat], self.kind).reshape(*outputs.shape, self.K)
        out = np.empty((flat.size, self.K), np.float32)
        part, row = self._where()
        for p, (raw, _) in enumerate(self.parts):
            hit = part[flat] == p
            if hit.any():
                out[hit] = dequantize_rows(raw[row[flat[hit]]], self.kind)
        return out.reshape(*outputs.shape, self.K)

    def _where(self) -> tuple:
        """For each output column: which part holds it, and its row there (computed once: a
        decode step's embedding looks up one row of 49,152)."""
        if self._where_cache is None:
            part, row = np.empty(self.N, np.int64), np.empty(self.N, np.int64)
            for p, (_, cols) in enumerate(self.parts):
                part[cols], row[cols] = p, np.arange(len(cols))
            self._where_cache = (part, row)
        return self._where_cache

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


def block_scales(raw: np.ndarray) -> np.ndarray:
    """A Q4_1 part's (d, m) as float32, [rows, 2 * K/32] (d and m of block b at 2b and 2b + 1): the
    file's float16s converted once (exactly), so that a kernel loads them as they are used."""
    raw = np.asarray(raw, np.uint8)
    blocks = raw.reshape(raw.shape[0], -1, BLOCK_BYTES["Q4_1"])
    return np.ascontiguousarray(blocks[..., 0:4]).view("<f2").astype(np.float32).reshape(raw.shape[0], -1)


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
