"""The fast path's tunables: every constant chosen by measuring, in one table, with the machine
it was measured on. On another CPU or BLAS library the best values may differ; the results never
do (tests prove the fast path equal to the reference at, and away from, every threshold).

MEASURED_ON names the machine; each entry says what was timed there, so that a reader who
re-measures on their own machine knows what to compare.
"""
from __future__ import annotations

MEASURED_ON = ("2 vCPUs of an AMD EPYC (family 26, Zen 5) virtual machine, numpy 2.4 with its bundled OpenBLAS "
               "0.3.31 (2 threads), November 2026; the numba entries with numba 0.68, December 2026")

# A long prefill attends in blocks of this many queries, each block against only the keys its
# last query may see: the masked upper triangle of the S x T scores is mostly never computed,
# and a block's scores ([Hq, 64, T]) stay small. 32-128 were within noise of each other.
QUERY_BLOCK = 64

# Without numba, a single query over at least this many cached keys attends with
# `fast.attend_one_query` (two GEMMs over all KV heads at once) instead of per-KV-head batched
# products. SmolLM2 decode steps: 0.2 ms slower at 192-256 keys, 0.3 ms faster at 320, 0.8 ms at
# 512, 1.8 ms at 1024. With numba, `one_query.attend_last` at every length (at 2,048 keys: 4.5-5 ms
# a step for the 30 layers' attention, 14-21 GB/s, against ~15-30 ms for the GEMMs on one BLAS
# thread; its tasks walk blocks of positions in memory order: by KV head it took 6-8 ms).
ONE_QUERY_GEMM_FROM = 320

# `fast.project` with numba: float32 rows times an out-major weight run in `skinny.rows_times`, this
# many rows at a time (each block reads the weights once; its rows stay in cache). SmolLM2's
# matrices, all 30 layers and the head, 2 threads, in ms, the kernel against numpy's GEMM (split
# over two threads): 1 row 16 / 37, 8 rows 33 / 54, 32 rows 41 / 87, 64 rows 74 / 128, 100 rows
# 124 / 176, 500 rows 751 / 1053 in one block, 564 in blocks of 64 (128: 687, 256: 606).
# Against one row: 2 rows 1.1-1.2, 4 rows 1.2-1.4, 8 rows 1.5-1.7, 16 rows 2.1-2.5, 32 rows 3.1-3.8.
# Eight outputs at a time (skinny.OUTPUTS) against the kernel before it (one output, up to four
# rows at a time): 1 row 13-17 ms against 18-23, 8 rows 23-25 against 37-42, 32 rows 50-59
# against 79-90; 4 or 16 outputs at a time, or 2 rows at a time, were slower.
SKINNY_ROWS = 64
# ... and only for a weight matrix of at least this many numbers: a toy model's tiny matrices are
# faster in one BLAS call than in numba's threads (and a toy notebook then never imports numba).
SKINNY_MIN_WEIGHTS = 1 << 16

# `fast.project` without numba (or with C-ordered weights), a weight matrix times M rows. 2-3 rows cost less as 2-3 matrix-vector
# products (the layer's 1-7 MB matrix is still in cache for the second row) than as one GEMM;
# 4-7 rows cost ~15-30% less padded with zero rows to 8 (OpenBLAS's 8-row kernel) than as they are.
GEMV_ROWS = (2, 3)
PAD_ROWS_TO = 8

# `machine.settle`: OpenBLAS's idle threads spin this long after a multi-threaded product (its
# thread timeout, 2^28 cycles by default); numba kernels started meanwhile ran 2-6x slower, and
# normally again after 0.2 s.
BLAS_SPIN_SECONDS = 0.2

# `machine.keep_freed_memory` (opt-in: bench and the command line): glibc keeps up to this much
# freed heap, and serves allocations below MMAP_BYTES from it. A 500-token SmolLM2 prefill
# allocates ~300 MB of short-lived temporaries; without it, ~78,000 page faults (~0.25 s of
# system time) per prefill.
TRIM_BYTES = 256 << 20
MMAP_BYTES = 32 << 20

TABLE = {"SKINNY_ROWS": SKINNY_ROWS, "SKINNY_MIN_WEIGHTS": SKINNY_MIN_WEIGHTS, "QUERY_BLOCK": QUERY_BLOCK,
         "ONE_QUERY_GEMM_FROM": ONE_QUERY_GEMM_FROM, "GEMV_ROWS": GEMV_ROWS,
         "PAD_ROWS_TO": PAD_ROWS_TO, "BLAS_SPIN_SECONDS": BLAS_SPIN_SECONDS, "TRIM_BYTES": TRIM_BYTES, "MMAP_BYTES": MMAP_BYTES}
