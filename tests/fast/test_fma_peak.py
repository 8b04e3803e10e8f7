"""fast.compiled.fma_peak: the cores' multiply-add roof that bench's pass floors divide by."""
import numpy as np
import pytest

from tinydecoder.fast.compiled import jit

pytestmark = pytest.mark.skipif(not jit.available(), reason="needs numba")


def _expected(n):
    """The chains' lane 0 summed, computed by numpy in float32: each chain c starts at 0.001 c and
    runs v = v * 0.9999 + 1e-4 n times."""
    from tinydecoder.fast.compiled.fma_peak import CHAINS

    v = np.float32(0.001) * np.arange(CHAINS, dtype=np.float32)
    for _ in range(n):
        v = v * np.float32(0.9999) + np.float32(1e-4)
    return float(v.sum(dtype=np.float32))


@pytest.mark.parametrize("n", [0, 1, 7, 300])
def test_chains_compute_the_recurrence(n):
    from tinydecoder.fast.compiled import fma_peak

    out = np.empty(jit.threads(), np.float32)
    jit.compiled(fma_peak._run)(n, jit.threads(), out)
    assert out == pytest.approx(_expected(n), rel=1e-5)  # a fused multiply-add rounds once, numpy twice


def test_fma_gflops_counts_every_threads_work():
    from tinydecoder.fast.compiled import fma_peak
    from tinydecoder.perf.machine import measure_fma_peak

    one = fma_peak.fma_gflops(seconds=0.01, repeat=1)
    assert np.isfinite(one) and one > 1.0  # GFLOP/s: even a slow core retires more than a billion
    assert measure_fma_peak() > 1.0
