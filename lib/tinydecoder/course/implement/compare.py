"""Small helpers the chapters' cases share: seeded random inputs and a comparison that says
what was wrong in one line (a shape or a dtype), never the expected values."""
from __future__ import annotations

import numpy as np


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def as_array(out, what: str = "the result") -> np.ndarray:
    if out is None:
        raise ValueError(f"{what} is None: did the function forget to return?")
    arr = np.asarray(out)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"{what} has dtype {arr.dtype}, expected numbers")
    return arr


def same(out, expected, *, rtol: float = 1e-4, atol: float = 1e-6) -> bool:
    """out has expected's shape and values (within a float32-friendly tolerance). A wrong shape
    raises ValueError naming both shapes; NaN anywhere is a mismatch."""
    arr = as_array(out)
    expected = np.asarray(expected)
    if arr.shape != expected.shape:
        raise ValueError(f"returned shape {arr.shape}, expected {expected.shape}")
    if not np.all(np.isfinite(arr[np.isfinite(expected)])):
        raise ValueError("the result holds NaN or inf")
    return bool(np.allclose(arr, expected, rtol=rtol, atol=atol))


def keeps_float32(out) -> bool:
    arr = as_array(out)
    if arr.dtype != np.float32:
        raise TypeError(f"float32 in, {arr.dtype} out")
    return True
