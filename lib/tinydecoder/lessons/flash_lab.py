"""Counters for notebook 12 (FlashAttention): the bytes a tiled standard attention and a tiled
FlashAttention move between slow memory (HBM) and an on-chip memory of a given size, the
multiply-adds flash_attention's tile loop performs, and the peak memory numpy allocates during
one call. None of them computes attention; `algorithms/flash.py` does.

What the counts show together: blocking changes where the scores live (and so the memory and
the bytes moved), not how many scores are computed. The FLOPs of attention over S queries and
T keys stay Theta(S * T) - Theta(S^2) for a prefill - in every variant; only the memory held at
once becomes linear in S.
"""
from __future__ import annotations

import tracemalloc

from ..algorithms.flash import _check_int


def peak_memory(fn, *args, **kwargs):
    """(fn(*args, **kwargs), peak bytes allocated during the call above what was allocated before).

    Measured with tracemalloc, to which numpy reports its array buffers; the peak includes the
    result itself. Nested use is refused (tracemalloc has one peak)."""
    if tracemalloc.is_tracing():
        raise RuntimeError("peak_memory cannot run while tracemalloc is already tracing")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = fn(*args, **kwargs)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    return result, peak


def flash_matmul_flops(S: int, T: int, n_heads: int, head_dim: int, block_size: int = 64) -> int:
    """FLOPs of the two products (scores = q k^T and p v) that `flash_attention`'s tile loop
    computes for S causal queries (the last S of T positions), 2 per multiply-add: each query
    block meets every key block up to its last query's position (later ones are skipped).
    The plain count for all S x T scores is 4 * S * T * n_heads * head_dim."""
    S, T = _check_int("S", S, minimum=1), _check_int("T", T, minimum=1)
    n_heads, head_dim = _check_int("n_heads", n_heads, minimum=1), _check_int("head_dim", head_dim, minimum=1)
    block_size = _check_int("block_size", block_size, minimum=1)
    if S > T:
        raise ValueError(f"S={S} queries cannot be the last S of only T={T} positions")
    scores = 0
    for a in range(0, S, block_size):
        rows = min(block_size, S - a)
        scores += rows * min(T, T - S + a + rows)  # keys 0 .. the block's last query position
    return 4 * scores * n_heads * head_dim  # q k^T and p v: 2 FLOPs per multiply-add each


# --- bytes moved between slow memory (HBM) and on-chip memory (SRAM) ----------------------------
def _tiles(n, size):
    """Sizes of the tiles that cut n rows into blocks of `size` (the last one may be shorter)."""
    return [min(size, n - start) for start in range(0, n, size)]


def _block_shape(n, d, sram, per_row, key_tiles):
    """(Br, Bc): a key block of Bc = min(n, d, sram // 4d) rows (FlashAttention's choice, at least
    1), and the largest query block of Br rows whose working set fits in `sram` elements:
    Br * (per_row + Bc) + key_tiles * Bc * d <= sram. Bc shrinks if no Br >= 1 fits."""
    block_cols = min(n, d, max(1, sram // (4 * d)))
    while True:
        block_rows = min(n, (sram - key_tiles * block_cols * d) // (per_row + block_cols))
        if block_rows >= 1 or block_cols == 1:
            break
        block_cols -= 1
    if block_rows < 1:
        need = per_row + 1 + key_tiles * d
        raise ValueError(f"sram_elements={sram} cannot hold one query row, one key row and their "
                         f"state (d={d}): this tiling needs at least {need}")
    return block_rows, block_cols


def attention_traffic(n, d, sram_elements, itemsize=4):
    """Bytes moved between slow memory and an on-chip memory of `sram_elements` numbers, for one
    head of non-causal attention over n positions (the FlashAttention paper's setting), counted
    tile by tile.

    standard: three kernels, each reading its inputs from slow memory and writing its output back:
      S = Q K^T (a block of Br queries stays on chip while the keys stream past in blocks of Bc),
      P = softmax(S) row by row (one read if a row fits on chip, else three: max, sum, normalise),
      O = P V (a block of Br output rows accumulates on chip while P's and V's blocks stream past).
    flash: one kernel; a block of Br queries, its accumulator and (m, l) stay on chip while K and V
      stream past in blocks of Bc; S and P live on chip only; O and the lse are written once.
    returns {"standard_bytes", "flash_bytes", "standard_reads", "standard_writes", "flash_reads",
             "flash_writes" (bytes), "standard_blocks", "flash_blocks" ((Br, Bc))}."""
    n = _check_int("n", n, minimum=1)
    d = _check_int("d", d, minimum=1)
    sram = _check_int("sram_elements", sram_elements, minimum=1)
    itemsize = _check_int("itemsize", itemsize, minimum=1)

    # standard: S = Q K^T, then P = softmax(S), then O = P V; counted in elements
    br, bc = _block_shape(n, d, sram, per_row=d, key_tiles=1)  # Q (or O) rows + K (or V) rows + S tile
    key_rows = sum(_tiles(n, bc))  # the rows one pass over K (or V), block by block, brings in
    reads = writes = 0
    for rows in _tiles(n, br):  # S = Q K^T
        reads += rows * d + key_rows * d  # Q_i once, then every K_j
        writes += rows * key_rows  # S_ij for every j
    passes = 1 if n <= sram else 3  # a row of S fits on chip, or max / sum / normalise passes
    reads += passes * n * n  # P = softmax(S)
    writes += n * n
    for rows in _tiles(n, br):  # O = P V
        reads += rows * key_rows + key_rows * d  # every P_ij and V_j
        writes += rows * d  # O_i, once
    standard = (reads * itemsize, writes * itemsize)
    standard_blocks = (br, bc)

    # flash: per query block, Q_i + acc (d each) + m, l (1 each) per row; K_j and V_j stream
    br, bc = _block_shape(n, d, sram, per_row=2 * d + 2, key_tiles=2)
    key_rows = sum(_tiles(n, bc))
    reads = writes = 0
    for rows in _tiles(n, br):
        reads += rows * d + 2 * key_rows * d  # Q_i once, then every K_j and V_j
        writes += rows * d + rows  # O_i and lse_i, once
    flash = (reads * itemsize, writes * itemsize)
    return {"standard_bytes": sum(standard), "flash_bytes": sum(flash),
            "standard_reads": standard[0], "standard_writes": standard[1],
            "flash_reads": flash[0], "flash_writes": flash[1],
            "standard_blocks": standard_blocks, "flash_blocks": (br, bc)}
