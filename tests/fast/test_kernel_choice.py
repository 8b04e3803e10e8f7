"""`forward_pass.product_kernel` and `attention_kernel` name the kernel the pass runs (the
appendix notebook prints them): at and beside each threshold of tunables.py, and `project`
gives the product's numbers whichever kernel they name."""
import numpy as np
import pytest

from tinydecoder.fast import forward_pass as fp
from tinydecoder.fast import tunables
from tinydecoder.fast.compiled import jit

K, N = 64, 1 << 11  # K*N = 2^17 >= SKINNY_MIN_WEIGHTS: a matrix numba's kernels take
numba_only = pytest.mark.skipif(not jit.available(), reason="needs the fast extra (numba, threadpoolctl)")


def weight(order="F", dtype=np.float32, k=K, n=N):
    return np.asarray(np.random.default_rng(0).standard_normal((k, n)), dtype=dtype, order=order)


@numba_only
@pytest.mark.parametrize("rows", [1, tunables.SWEEPS_UP_TO_ROWS, tunables.SWEEPS_UP_TO_ROWS + 1, 16])
def test_numba_products_switch_from_few_rows_to_tiles_at_the_threshold(rows):
    w = weight()
    x = np.random.default_rng(rows).standard_normal((rows, K)).astype(np.float32)
    want = "few_rows" if rows <= tunables.SWEEPS_UP_TO_ROWS else "tiles"
    assert fp.product_kernel(x, w) == want
    out = np.empty((rows, N), np.float32)
    np.testing.assert_allclose(fp.project(x, w, out), x.astype(np.float64) @ w, rtol=0, atol=1e-4)


@pytest.mark.parametrize("rows, want", [(1, "matmul"), (2, "gemv"), (3, "gemv"), (4, "padded"), (7, "padded"),
                                        (8, "matmul"), (20, "matmul")])
def test_numpy_products_for_weights_numba_does_not_take(rows, want):
    w = weight(order="C", dtype=np.float64)  # float64, C order: never numba's
    x = np.ones((rows, K))
    assert fp.product_kernel(x, w) == want
    out = np.empty((rows, N))
    np.testing.assert_allclose(fp.project(x, w, out), x @ w, rtol=0, atol=1e-10)


def test_small_float32_matrices_stay_in_numpy():
    w = weight(k=8, n=8)  # 64 numbers < SKINNY_MIN_WEIGHTS
    assert fp.product_kernel(np.ones((1, 8), np.float32), w) == "matmul"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("S", [1, tunables.ATTEND_ROWS_UP_TO, tunables.ATTEND_ROWS_UP_TO + 1])
def test_attention_kernel_follows_the_thresholds(dtype, S):
    T = max(S, tunables.ONE_QUERY_GEMM_FROM)
    rng = np.random.default_rng(S)
    q = rng.standard_normal((S, 4, 8)).astype(dtype)
    k, v = (rng.standard_normal((T, 2, 8)).astype(dtype) for _ in range(2))
    if dtype == np.float32 and jit.available():
        want = "few_queries" if S <= tunables.ATTEND_ROWS_UP_TO else "prefill_attention"
    else:
        want = "attend_one_query" if S == 1 else "attend"
    assert fp.attention_kernel(q, k, v) == want
    if S == 1 and dtype == np.float64:
        assert fp.attention_kernel(q, k[: tunables.ONE_QUERY_GEMM_FROM - 1], v[: tunables.ONE_QUERY_GEMM_FROM - 1]) == "attend"
