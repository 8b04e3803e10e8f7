"""Chapter 22's exercise: a tensor-parallel SwiGLU feed-forward over simulated shards.

    tensor_parallel_swiglu(x [T, D], w_gate [D, F], w_up [D, F], w_down [F, D], b_down [D] or None,
                           n_shards, all_reduce) -> [T, D]

It equals swiglu(x, w_gate, w_up) @ w_down + b_down. Shard r of n holds the hidden units
r*F/n .. (r+1)*F/n - 1: its columns of w_gate and w_up, its rows of w_down. all_reduce(parts)
takes one [T, D] array per shard and returns their sum (what every shard receives); call it once.
The library's answer: `algorithms.tensor_parallel.tensor_parallel_swiglu`.
"""
from __future__ import annotations

import numpy as np

from ...algorithms.tensor_parallel import all_reduce_sum, tensor_parallel_swiglu, unit_slices
from ...core.ops import swiglu
from .case import Case
from .compare import keeps_float32, rng, same


def _weights(seed, T=3, D=6, F=12, dtype=np.float64, bias=True):
    r = rng(seed)
    x = r.standard_normal((T, D)).astype(dtype)
    w_gate, w_up = (r.standard_normal((D, F)).astype(dtype) * 0.5 for _ in range(2))
    w_down = r.standard_normal((F, D)).astype(dtype) * 0.5
    b = r.standard_normal(D).astype(dtype) if bias else np.zeros(D, dtype)
    return x, w_gate, w_up, w_down, b


def _dense(x, w_gate, w_up, w_down, b):
    return swiglu(x, w_gate, w_up) @ w_down + (0 if b is None else b)


class _Traced:
    def __init__(self):
        self.calls = []

    def __call__(self, parts):
        parts = [np.array(p) for p in parts]
        self.calls.append(parts)
        return all_reduce_sum(parts)


def _run(fn, args, n):
    reduce = _Traced()
    return fn(*args, n, reduce), reduce.calls


def _vs_dense(fn, seed, n, **kw) -> bool:
    args = _weights(seed, **kw)
    return same(_run(fn, args, n)[0], _dense(*args))


def _one_allreduce(fn) -> bool:
    args = _weights(212, bias=False)
    _, calls = _run(fn, args, 3)
    return len(calls) == 1 and len(calls[0]) == 3 and all(p.shape == (3, 6) for p in calls[0])


def _partials(fn) -> bool:  # shard r's partial sum covers exactly its own units
    args = _weights(213)
    x, w_gate, w_up, w_down, b = args
    _, calls = _run(fn, args, 4)
    if len(calls) != 1:
        return False
    want = [swiglu(x, w_gate[:, f], w_up[:, f]) @ w_down[f] for f in unit_slices(12, 4)]
    return len(calls[0]) == 4 and all(same(p, w) for p, w in zip(calls[0], want))


def _no_bias(fn) -> bool:
    x, w_gate, w_up, w_down, _ = _weights(215)
    return same(_run(fn, (x, w_gate, w_up, w_down, None), 2)[0], _dense(x, w_gate, w_up, w_down, None))


def _float32(fn) -> bool:
    args = _weights(216, dtype=np.float32)
    out = _run(fn, args, 2)[0]
    return keeps_float32(out) and same(out, _dense(*args))


TENSOR_PARALLEL_SWIGLU = [
    Case("shape [T, D]", "the output is a row of the residual stream per token",
         lambda fn: np.shape(_run(fn, _weights(210), 2)[0]) == (3, 6)),
    Case("one shard = the dense feed-forward", "with n_shards = 1 shard 0 holds every unit",
         lambda fn: _vs_dense(fn, 211, 1, bias=False)),
    Case("one all-reduce, of [T, D] partial sums", "the column-parallel half needs no communication: each "
         "shard keeps its own slice of the hidden units until after w_down", _one_allreduce),
    Case("square weights (D = F), 3 shards", "gate and up are split along their output (column) axis, "
         "down along its input (row) axis", lambda fn: _vs_dense(fn, 214, 3, D=6, F=6, bias=False)),
    Case("each shard's partial covers its own units", "shard r: columns r*F/n .. (r+1)*F/n - 1 of gate "
         "and up, the same rows of down, nothing else added", _partials),
    Case("the bias is added once", "the all-reduce sums the shards: whatever each shard adds is counted "
         "n_shards times", lambda fn: _vs_dense(fn, 217, 4)),
    Case("no bias (None)", "b_down may be None: add nothing then", _no_bias),
    Case("random weights vs the library", "compare with algorithms.tensor_parallel.tensor_parallel_swiglu",
         lambda fn: same(_run(fn, _weights(218, T=5, D=8, F=16), 4)[0],
                         tensor_parallel_swiglu(*_weights(218, T=5, D=8, F=16), 4))),
    Case("float32 in, float32 out", "keep x's dtype", _float32),
]

EXERCISES = {"tensor_parallel_swiglu": TENSOR_PARALLEL_SWIGLU}
REFERENCES = {"tensor_parallel_swiglu": tensor_parallel_swiglu}
