"""The fast path's tunables: every constant chosen by measuring, each with its reason in one line.
The measurements behind them (machine, month, numbers) are in docs/fast_path.md. On another CPU
the best values may differ; the results never do (tests prove the fast path equal to the
reference at, and away from, every threshold)."""
from __future__ import annotations

# A long prefill attends in blocks of this many queries, each against only the keys it may see.
QUERY_BLOCK = 64

# Without numba, one query over at least this many keys attends in two GEMMs over all KV heads.
ONE_QUERY_GEMM_FROM = 320

# With numba, up to this many new rows of a sequence attend in `few_queries`, more in `prefill_attention`.
ATTEND_ROWS_UP_TO = 8

# With numba, up to this many rows go to `few_rows`' sweeps (weights read once), more to `tiles`.
SWEEPS_UP_TO_ROWS = 4
# ... and only matrices of at least this many numbers: a toy model's are faster in one BLAS call.
SKINNY_MIN_WEIGHTS = 1 << 16

# LLVM's locality hint for data used once (the next task's weights, the keys ahead): 1 = into L2 only.
STREAM_PREFETCH = 1

# Without numba, 2-3 rows run as matrix-vector products; 4-7 rows are padded to 8 (OpenBLAS's kernel).
GEMV_ROWS = (2, 3)
PAD_ROWS_TO = 8

# `machine.settle`: how long OpenBLAS's idle threads spin after a product (numba runs slower meanwhile).
BLAS_SPIN_SECONDS = 0.2

# `machine.keep_freed_memory`: glibc keeps this much freed heap, and serves allocations below MMAP_BYTES from it.
TRIM_BYTES = 256 << 20
MMAP_BYTES = 32 << 20
