"""fast.aligned: arrays on a 64-byte boundary, for the kernels that load a few rows again and again."""
import numpy as np
import pytest

from tinydecoder.fast.aligned import LINE, empty64, is64, on64


@pytest.mark.parametrize("shape, dtype", [((3, 576), np.float32), (7, np.float64), ((0, 5), np.float32),
                                          ((2, 3, 5), np.uint8)])
def test_empty64_starts_on_a_line_with_the_asked_shape(shape, dtype):
    for _ in range(5):  # numpy's own allocations land 16 bytes past a line often enough to see it
        a = empty64(shape, dtype)
        assert a.size == 0 or (a.ctypes.data % LINE == 0 and is64(a))  # an empty array has no bytes to place
        assert a.shape == ((shape,) if np.isscalar(shape) else shape) and a.dtype == dtype and a.flags.c_contiguous
        a[...] = 1  # writable, and its bytes are its own
        assert a.size == 0 or a.sum() == a.size


def test_on64_keeps_an_aligned_array_and_copies_the_rest():
    a = empty64((4, 8))
    a[:] = np.arange(32, dtype=np.float32).reshape(4, 8)
    assert on64(a) is a
    shifted = empty64(33)[1:].reshape(4, 8)  # 4 bytes past a line
    shifted[:] = a
    b = on64(shifted)
    assert b is not shifted and is64(b) and np.array_equal(b, a)
    strided = a[:, ::2]
    c = on64(strided)
    assert is64(c) and c.flags.c_contiguous and np.array_equal(c, strided)


def test_a_pass_works_on_lines():
    """fused.scratch's rows (the few-row kernels' inputs) start on lines, whatever numpy gives."""
    from tinydecoder.core.toy import toy_model
    from tinydecoder.fast import fused

    work = fused.scratch(toy_model(), 3, 16)
    assert all(is64(a) for a in work if a.size)
