"""The fast path: the same numbers as the reference forward pass (`core.reference`), faster.

    from tinydecoder import fast
    logits = fast.forward(model, ids, cache)                  # [S, V]
    fast.forward_batch(model, [ids_a, ids_b], [cache_a, cache_b])

Rooms: `forward_pass` (the pass: fewer, larger numpy calls, or compiled kernels where numba is
installed), `attention` (its attention in numpy), `batch_cache` (B sequences' K/V in one array),
`fused` and `fused_quant` (a few rows' decoder blocks, all in one compiled call; `stacks`, the typed
lists that call takes), `rope_tables` (RoPE's cos/sin
once per pass, rotated in place), `aligned` (work arrays on 64-byte lines), `tunables` (the measured
thresholds), and `compiled/` (the numba kernels and `compiled.jit`, which compiles and binds them).
Tests prove every path here equal to the reference on distinct weights.
"""
from .attention import QUERY_BLOCK, attend, attend_one_query
from .batch_cache import BatchKVCache
from .forward_pass import ATTEND_ROWS_UP_TO, ONE_QUERY_GEMM_FROM, forward, forward_batch, project, rmsnorm_into, swiglu_into

__all__ = ["BatchKVCache", "forward", "forward_batch", "project", "attend", "attend_one_query", "rmsnorm_into",
           "swiglu_into", "QUERY_BLOCK", "ONE_QUERY_GEMM_FROM", "ATTEND_ROWS_UP_TO"]
