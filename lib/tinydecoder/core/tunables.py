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
# 512, 1.8 ms at 1024. With numba, `one_query.attend_rows` at every length (at 2,048 keys: 7-10 ms
# a step for the 30 layers' attention, against ~15-30 ms for the GEMMs on one BLAS thread; its
# tasks walk blocks of positions in memory order: by KV head it took more).
ONE_QUERY_GEMM_FROM = 320

# With numba, up to this many new rows of one sequence (a decode step, guesses checked at once)
# attend in `one_query.attend_rows`, one compiled call; more (a prefill) in
# `prefill_attention.attend_prefill` (register tiles on every core; numpy's batched products,
# `fast.attend`, run on the one BLAS thread a pass leaves them). The 30 layers' attention, ms,
# numpy / tiles, S new rows over S positions (December 2026, the Zen 3 machine of
# SWEEPS_UP_TO_ROWS): 9 rows 1.8-2.7 / 1.9-2.9, 16: 2.5-3.6 / 2.4-3.7, 32: 5.5-8.6 / 3.4-11.6,
# 64: 13.6-18.1 / 8.1-17.8, 100: 26-30 / 12-19, 500: 283-371 / 167-230 (within noise up to 64
# rows, faster above). A whole 500-token prefill: 1.58-1.74 s before this kernel and tiles.py,
# 1.20-1.35 s with both (the same day, alternating processes). attend_rows against the numpy
# path on one BLAS thread (as in a pass), SmolLM2's shapes, per layer: 1 row 0.6-0.9x its time
# (at 16-512 keys; equal at 2,048), 2 rows 0.6-0.8x, 4 rows 0.75-1.0x, 8 rows 1.05-1.2x alone
# but, in SmolLM2 passes over 8 rows, 1.93-1.97 decode steps against 2.06-2.08 with numpy
# (contexts 512; equal at 128).
ATTEND_ROWS_UP_TO = 8

# `fast.project` with numba: float32 rows times an out-major weight, in one call for all rows:
# up to this many rows `skinny`'s sweeps (each weight row read alone, front to back, four input
# rows per sweep), more rows `tiles.py`'s register tiles (6 outputs x 16 rows, the next task's
# weights prefetched). SmolLM2's 121 matrices as distinct copies, nothing in cache, 2 threads,
# medians of 5, ms, sweeps / tiles (December 2026, on 2 vCPUs of an AMD EPYC of family 25,
# Zen 3): 1 row 21-26 / 46-53, 4 rows 28-29 / 42-48, 8 rows 44-57 / 44-59, 16 rows 71-87 /
# 46-48 (tiles without the prefetch: 54-67), 64 rows 180-207 / 155-164, 500 rows 1,546-1,603 /
# 1,127-1,163 (numpy's GEMM on 2 threads: 1,000-1,141). The 120 layer matrices alone at 500
# rows: tiles in one call 908, in blocks of 128 rows 902, of 64 rows 947, numpy's GEMM 911.
# Earlier, on the Zen 5 machine of MEASURED_ON, sweeps of two weight rows against four input
# rows took 65 ms at 16 rows and 183-231 at 64, and beat numpy's GEMM at every row count.
# Once a last block of 1-8 rows ran in an 8-row tile (tile8) instead of a padded 16-row one, the
# 121 matrices (the LM head included, cold), medians of 7, ms, sweeps / tiles, same machine and
# month: 1 row 22 / 33, 4 rows 27 / 35, 5 rows 27 / 29, 6 rows 33 / 31, 7 rows 37 / 31, 8 rows
# 43-44 / 32 (the sweeps' cost grows with the rows, the 8-row tile's barely): sweeps up to 5.
# Once a few rows' blocks ran as one compiled call (core/fused.py), whole SmolLM2 passes of one
# sequence, medians of 20 alternating passes, tiles' time / the sweeps', at contexts 128 and 512,
# three runs: 3 rows 1.11 / 1.06, 1.13 / 1.01, 0.99 / 1.06; 4 rows 1.12 / 0.95, 0.98 / 0.99,
# 0.94 / 0.93; 5 rows 0.92 / 0.87, 0.86 / 0.84, 0.98 / 0.85: sweeps up to 4. (4 rows later moved from
# the sweeps to skinny's k-vector tiles, kdots2x4: skinny.py has the measurements.)
SWEEPS_UP_TO_ROWS = 4
# ... and only for a weight matrix of at least this many numbers: a toy model's tiny matrices are
# faster in one BLAS call than in numba's threads (and a toy notebook then never imports numba).
SKINNY_MIN_WEIGHTS = 1 << 16

# The prefetches of intrinsics.py's loops that fetch data used once: the next task's weights in
# a product whose tasks each take one block of rows (at most 16 rows: a decode step's 5-8, a
# batch's step), and one_query's keys ahead. LLVM's locality hint 1, into L2 but not L1 (x86's
# prefetcht2), instead of 3 (prefetcht0, into every level). On the Zen 4 machine of the bench
# reports (2 vCPUs of an AMD EPYC of family 25 model 17, December 2026), SmolLM2's 121 matrices,
# nothing in cache, 2 threads, medians of 9, ms: 8 rows in the 8-row tile 24.6-26.2 -> 18.0-18.8
# (one row's sweeps beside them: 16-17); 16 rows 26.9-27.8 -> 24.0-24.2; one_query's 30 layers
# at 2,048 positions 6.5-7.2 -> 5.6-5.9. A prefill's tasks each reuse their weights for every
# block of 16 rows, and there hint 3 stays (with hint 1, 100-token prefills took 164-183 ms
# against 156-164, 500-token 836-971 against 833-840).
STREAM_PREFETCH = 1

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

TABLE = {"SWEEPS_UP_TO_ROWS": SWEEPS_UP_TO_ROWS, "SKINNY_MIN_WEIGHTS": SKINNY_MIN_WEIGHTS, "QUERY_BLOCK": QUERY_BLOCK,
         "ONE_QUERY_GEMM_FROM": ONE_QUERY_GEMM_FROM, "ATTEND_ROWS_UP_TO": ATTEND_ROWS_UP_TO, "GEMV_ROWS": GEMV_ROWS,
         "PAD_ROWS_TO": PAD_ROWS_TO, "BLAS_SPIN_SECONDS": BLAS_SPIN_SECONDS, "TRIM_BYTES": TRIM_BYTES, "MMAP_BYTES": MMAP_BYTES,
         "STREAM_PREFETCH": STREAM_PREFETCH}
