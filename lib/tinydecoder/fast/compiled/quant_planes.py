"""One row times a Q4_1 matrix by table lookups: a decode step's products, faster than reading the
file's blocks (quant_rows), for the same numbers.

A Q4_1 block's dot product with inputs x is d sum_k q_k x_k + m sum_k x_k, with codes q_k in 0..15.
Write each code in bits, q = q0 + 2 q1 + 4 q2 + 8 q3, and take the inputs 4 at a time: for the 4
inputs x_4g..x_4g+3 and a bit p, the weights' bits p pick one of the 16 subsets of those inputs,
and its sum is one entry of a table T[g] of the 16 subset sums, built once per input row:

    sum_k q_k x_k = sum_p 2^p sum_g T[g, (bit p of q_4g..q_4g+3)]

T depends only on the input, so one lookup serves every output row: x86's vpermps picks 16 rows'
entries at once (each lane's low 4 bits are its index). That needs the weights' bits, not their
codes, side by side: `pack` lays a matrix's rows out in groups of 16 ("planes": per block of 32
inputs, 4 planes x 16 rows of 32-bit words, nibble j of row r's word p holding bits p of its
weights 4j..4j+3, then the 16 rows' d and m), once, from the file's blocks (66 MB for SmolLM2's
layers, beside the file's 98 MB, which prefill and batches read). The idea is T-MAC's (Wei et al.,
2024), here with float32 tables, so the products equal the float32 model's up to float32 rounding.

`product(x, w, out)` for one input row: the table (`_tables`), then every part's groups shared
between the threads, each group by plane_dots' `lookup16`. Where it applies (`applies`: numba, a
CPU with AVX-512, Q4_1, parts of whole groups of 16 rows), a decode step runs it (quant_rows.product
and fused_quant); more rows run quant_rows' kernels on the file's blocks.

Measured (SmolLM2, 2 vCPUs of an AMD EPYC Zen 5 VM, December 2026; docs/fast_path.md): a gate and
up matrix in cache, 2 threads, 17.9 us by lookup against 29.7 from the blocks (0.57 ns a block on
one thread against ~1.05); a decode step's 120 products streamed from memory 1.50-1.54 ms against
1.92-2.02 (43-44 GB/s: near what the machine reads); whole decode steps 5-13% shorter.
"""
from __future__ import annotations

import numpy as np

from . import jit
from .quant_matrix import BLOCK_BYTES, QuantMatrix

GROUP = 16  # output rows a lookup serves (plane_dots.GROUP)
GROUP_BYTES = 320  # a block of a group's rows in `pack`'s layout (plane_dots.GROUP_BYTES)

prange = range  # numba.prange once compiled (jit.compiled)
INLINE = ("_tables", "compiled.plane_dots.lookup16", "compiled.plane_dots.lookup2", "compiled.llvm.prefetch",
          "compiled.plane_dots.PREFETCH_BYTES")
lookup16 = lookup2 = prefetch = None  # plane_dots' and llvm's intrinsics, bound by jit.compiled
# Input rows `product` takes (a decode step's one, a speculative check of one guess): two rows share
# the planes' indices (plane_dots.make_lookup); three keep 24 tables and 8 indices live and spill.
# SmolLM2's 120 layer products, 2 threads, medians of 9 alternating rounds (Zen 5, December 2026),
# lookups against quant_rows' blocks: 1 row 2.05 / 2.34 ms, 2 rows 2.77 / 3.35, 3 rows 5.49 / 3.44.
ROWS_UP_TO = 2
PREFETCH_BYTES = 0  # plane_dots.PREFETCH_BYTES, bound by jit.compiled


def applies(w, rows: int = 1) -> bool:
    """Whether `product` takes x [rows, K] @ w: 1 to ROWS_UP_TO rows, numba, AVX-512 (vpermps on 16
    lanes, as quant_dots.TABLE), and a Q4_1 QuantMatrix [in, out] whose parts have whole groups of 16 rows."""
    if not (1 <= rows <= ROWS_UP_TO and jit.available() and isinstance(w, QuantMatrix) and not w.transposed
            and w.kind == "Q4_1" and all(raw.shape[0] % GROUP == 0 for raw in w.raws)):
        return False
    from .quant_decode import TABLE  # imports numba: only once the rest holds

    return TABLE


def subset_sums(x4) -> np.ndarray:
    """The table of 4 inputs: [16] float32, entry s = the sum of x4[i] over the bits i of s (0 for
    s = 0, x4[0] + x4[1] for s = 3, ...), added as the kernels add them: (x0 or 0) + (x1 or 0), plus
    (x2 or 0) + (x3 or 0)."""
    x0, x1, x2, x3 = np.asarray(x4, np.float32)
    zero = np.float32(0.0)
    low = np.array([zero, x0, x1, x0 + x1], np.float32)  # s & 3
    high = np.array([zero, x2, x3, x2 + x3], np.float32)  # s >> 2
    s = np.arange(16)
    return low[s & 3] + high[s >> 2]


def plane_index(codes4, p: int) -> int:
    """The table entry that bit p of 4 weights' codes picks: sum_i (bit p of codes4[i]) 2^i."""
    return int(sum(((int(q) >> p) & 1) << i for i, q in enumerate(codes4)))


def dot_by_lookup(codes, x) -> float:
    """sum_k codes[k] x[k] for codes in 0..15 (a multiple of 4 of them), as the kernel computes it:
    for each bit p, one lookup per 4 inputs in their table, summed; the four sums weighted by 2^p."""
    codes, x = np.asarray(codes), np.asarray(x, np.float32)
    tables = [subset_sums(x[k:k + 4]) for k in range(0, len(x), 4)]
    per_plane = [sum(float(t[plane_index(codes[4 * g:4 * g + 4], p)]) for g, t in enumerate(tables))
                 for p in range(4)]
    return sum(2 ** p * s for p, s in enumerate(per_plane))


def pack_reference(raw: np.ndarray) -> np.ndarray:
    """A Q4_1 part's rows of blocks [N, K/32 * 20] (N a multiple of 16) in planes: uint8
    [N/16, K/32, GROUP_BYTES] (module docstring). Plain numpy, for reading; `pack` is fast."""
    N = raw.shape[0]
    blocks = np.asarray(raw, np.uint8).reshape(N, -1, BLOCK_BYTES["Q4_1"])  # [N, nb, 20]
    nb = blocks.shape[1]
    codes = blocks[..., 4:]
    q = np.concatenate([codes & 15, codes >> 4], axis=-1).astype(np.uint32).reshape(N, nb, 8, 4)  # [N, nb, j, i]
    words = np.zeros((N, nb, 4), np.uint32)
    for p in range(4):
        nibbles = sum(((q[..., i] >> p) & 1) << i for i in range(4))  # [N, nb, 8]: bits p of weights 4j..4j+3
        words[..., p] = sum(nibbles[..., j] << (4 * j) for j in range(8))
    out = np.empty((N // GROUP, nb, GROUP_BYTES), np.uint8)
    by_group = words.reshape(N // GROUP, GROUP, nb, 4).transpose(0, 2, 3, 1)  # [G, nb, p, r]
    out[..., :256] = np.ascontiguousarray(by_group).view(np.uint8).reshape(N // GROUP, nb, 256)
    dm = blocks[..., :4].reshape(N // GROUP, GROUP, nb, 2, 2).transpose(0, 2, 3, 1, 4)  # [G, nb, d|m, r, 2 bytes]
    out[..., 256:] = dm.reshape(N // GROUP, nb, 64)
    return out


def pack(raw: np.ndarray) -> np.ndarray:
    """`pack_reference`'s planes, compiled (SmolLM2's 30 layers: 39 ms, against 0.67 s in numpy)."""
    N, row_bytes = raw.shape
    out = np.empty((N // GROUP, row_bytes // BLOCK_BYTES["Q4_1"], GROUP_BYTES), np.uint8)
    jit.compiled(_pack)(np.ascontiguousarray(raw).view(np.uint32), out.view(np.uint32), out.view(np.uint16),
                        jit.threads())
    return out


def planes(w: QuantMatrix) -> tuple | None:
    """w's parts in planes where `applies(w)`, else None: packed on first use and kept with w, as
    is the answer (a decode step asks for each of its 120 matrices)."""
    if w._planes is None:
        w._planes = tuple(pack(raw) for raw in w.raws) if applies(w) else False
    return w._planes or None


def product(x: np.ndarray, w: QuantMatrix, out: np.ndarray) -> np.ndarray:
    """out = x @ w for x [M, K] float32 where `applies(w, M)`; out [M, N] float32, C-contiguous."""
    if not applies(w, x.shape[0]):
        raise ValueError(f"quant_planes.product takes 1-{ROWS_UP_TO} rows times a Q4_1 QuantMatrix of whole groups of "
                         f"{GROUP} rows (with numba and AVX-512), got {x.shape[0]} rows times {w!r}")
    jit.compiled(_plane_rows)(np.ascontiguousarray(x), planes(w), w.cols, out, jit.threads())
    return out


def _pack(raw32, out32, out16, threads):  # pragma: no cover - runs compiled by numba
    """pack_reference, word by word: raw32 [N, 5 nb] (a block: d | m << 16, then its 16 code bytes
    as 4 words), out32 / out16: the planes' [G, nb, 80] / [G, nb, 160] views."""
    N = raw32.shape[0]
    nb = raw32.shape[1] // 5
    G = N // 16
    for t in prange(threads):
        for g in range(t * G // threads, (t + 1) * G // threads):
            for b in range(nb):
                for r in range(16):
                    n = 16 * g + r
                    dm = raw32[n, 5 * b]
                    out16[g, b, 128 + r] = np.uint16(dm & 0xFFFF)
                    out16[g, b, 144 + r] = np.uint16(dm >> 16)
                    for p in range(4):
                        word = np.uint32(0)
                        for j in range(8):  # weights 4j..4j+3: bytes 4(j % 4).. of the codes, low nibbles, then high
                            c = np.uint64(raw32[n, 5 * b + 1 + j % 4]) >> np.uint64(4 * (j // 4) + p)
                            bits = c & np.uint64(0x01010101)  # bit p of the 4 codes, at bits 0, 8, 16, 24
                            nibble = ((bits * np.uint64(0x204081)) >> np.uint64(21)) & np.uint64(15)  # gathered at 21-24
                            word |= np.uint32(nibble) << np.uint32(4 * j)
                        out32[g, b, 16 * p + r] = word


def _tables(x, T, sx):  # pragma: no cover - compiled into _plane_rows
    """T[g, s] = the sum of x[0, 4g + i] over the bits i of s ((x0 or 0) + (x1 or 0) + ((x2 or 0)
    + (x3 or 0)) as lo + hi); sx[b] = the sum of block b's 32 inputs."""
    K = x.shape[1]
    zero = np.float32(0.0)
    for g in range(K // 4):
        x0, x1, x2, x3 = x[0, 4 * g], x[0, 4 * g + 1], x[0, 4 * g + 2], x[0, 4 * g + 3]
        x01, x23 = x0 + x1, x2 + x3
        for s in range(16):
            lo = s & 3
            hi = s >> 2
            a = zero if lo == 0 else (x0 if lo == 1 else (x1 if lo == 2 else x01))
            c = zero if hi == 0 else (x2 if hi == 1 else (x3 if hi == 2 else x23))
            T[g, s] = a + c
    for b in range(K // 32):
        s = np.float32(0.0)
        for k in range(32):
            s += x[0, 32 * b + k]
        sx[b] = s


def _plane_rows(x, planes, colss, out, threads):  # pragma: no cover - runs compiled by numba
    """out[m, cols[n]] = x[m] . W[n] for each of x's 1-2 rows and every row n of each part (planes[p],
    colss[p]): each row's tables once, then each thread a contiguous share of all parts' groups of
    16 rows."""
    M, K = x.shape
    nb = K // 32
    T = np.empty((M, K // 4, 16), np.float32)
    sx = np.empty((M, nb), np.float32)
    for m in range(M):
        _tables(x[m:m + 1], T[m], sx[m])
    total = 0
    for p in range(len(planes)):
        total += planes[p].shape[0]
    for t in prange(threads):
        acc = np.empty((M, 16), np.float32)
        g0, g1 = t * total // threads, (t + 1) * total // threads
        base = 0
        for p in range(len(planes)):  # the first bytes of each part's share asked for at once, before any
            if max(g0, base) < min(g1, base + planes[p].shape[0]):  # lookup (the lookups prefetch only ahead)
                prefetch(planes[p], (max(g0, base) - base) * nb * GROUP_BYTES, PREFETCH_BYTES)
            base += planes[p].shape[0]
        base = 0
        for p in range(len(planes)):
            pl, cols = planes[p], colss[p]
            G = pl.shape[0]
            for g in range(max(g0, base), min(g1, base + G)):
                if M == 1:
                    lookup16(pl, (g - base) * nb * GROUP_BYTES, T, sx, nb, acc)
                else:
                    lookup2(pl, (g - base) * nb * GROUP_BYTES, T, sx, nb, acc)
                for m in range(M):
                    for r in range(16):
                        out[m, cols[16 * (g - base) + r]] = acc[m, r]
            base += G
