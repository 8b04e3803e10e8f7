"""Tensor parallelism of a SwiGLU feed-forward (Megatron-LM), simulated with numpy shards in one
process: a column-parallel half, then a row-parallel half, and one all-reduce.

    shard r of n holds units f_r = [r F/n, (r+1) F/n) of the F hidden units:
        w_gate[:, f_r], w_up[:, f_r]   (columns: column-parallel)      [D, F/n]
        w_down[f_r, :]                 (rows:    row-parallel)         [F/n, D]
    h_r = silu(x w_gate[:, f_r]) * (x w_up[:, f_r])     # [T, F/n]  no communication: each unit
                                                        #           needs only its own columns
    y_r = h_r w_down[f_r, :]                            # [T, D]    a partial sum over F/n units
    y   = all_reduce(y_0, ..., y_{n-1}) + b_down        # the sum of the partials; the bias once

The sum over shards is the sum over units, so y equals the unsharded swiglu(x) w_down + b_down
up to float rounding. `parallel/` runs the same split on real MPI ranks.
"""
from __future__ import annotations

import numpy as np

from ..core.ops import swiglu
from ..core.validate import is_int


def all_reduce_sum(parts) -> np.ndarray:
    """The simulated all-reduce: the elementwise sum of every shard's array (each shard gets it)."""
    parts = [np.asarray(p) for p in parts]
    if not parts or any(p.shape != parts[0].shape for p in parts):
        raise ValueError(f"all_reduce needs one or more arrays of one shape, got {[p.shape for p in parts]}")
    out = parts[0].copy()
    for p in parts[1:]:
        out += p
    return out


def unit_slices(n_units: int, n_shards: int) -> list:
    """[slice of shard 0, ...]: n_units cut into n_shards equal, contiguous ranges."""
    if not is_int(n_shards) or n_shards < 1 \
            or n_units % n_shards:
        raise ValueError(f"n_shards must be an integer >= 1 that divides the {n_units} hidden units, got {n_shards!r}")
    size = n_units // n_shards
    return [slice(r * size, (r + 1) * size) for r in range(int(n_shards))]


def tensor_parallel_swiglu(x, w_gate, w_up, w_down, b_down, n_shards: int, all_reduce=all_reduce_sum):
    """swiglu(x, w_gate, w_up) @ w_down + b_down over n_shards simulated shards (module docstring).
    x [T, D], w_gate and w_up [D, F], w_down [F, D], b_down [D] or None.  -> [T, D]"""
    x = np.asarray(x)
    partials = [swiglu(x, w_gate[:, f], w_up[:, f]) @ w_down[f] for f in unit_slices(np.shape(w_gate)[1], n_shards)]
    y = all_reduce(partials)
    return y if b_down is None else y + b_down
