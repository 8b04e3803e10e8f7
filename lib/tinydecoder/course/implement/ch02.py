"""Chapter 02's exercises: softmax and one head of causal attention, written by the learner.

    softmax(x)                        over the last axis; stable for logits up to +-1e4; -inf -> 0
    causal_attention(q, k, v)         q, k, v [T, d] -> [T, d], scaled by 1/sqrt(d), causal
"""
from __future__ import annotations

import numpy as np

from ...core import ops
from .case import Case
from .compare import keeps_float32, rng, same


# -- softmax --------------------------------------------------------------------------------
def _softmax_random(fn) -> bool:
    x = rng(0).standard_normal((4, 7)) * 3
    return same(fn(x.copy()), ops.softmax(x))


def _softmax_last_axis(fn) -> bool:
    x = rng(1).standard_normal((2, 3, 5))
    out = fn(x.copy())
    return same(out, ops.softmax(x))


def _softmax_large(fn) -> bool:
    x = np.array([[1e4, 1e4 - 1.0, 1e4 - 3.0, -1e4]])
    return same(fn(x.copy()), ops.softmax(x))


def _softmax_very_negative(fn) -> bool:
    x = np.array([[-1e4, -1e4 - 1.0, -1e4 - 2.0]])
    return same(fn(x.copy()), ops.softmax(x))


def _softmax_minus_inf(fn) -> bool:
    x = np.array([[0.5, -np.inf, 1.5, -np.inf], [-np.inf, 2.0, -np.inf, -np.inf]])
    out = np.asarray(fn(x.copy()))
    return same(out, ops.softmax(x)) and bool(np.all(out[np.isinf(x)] == 0.0))


def _softmax_input_unchanged(fn) -> bool:
    x = rng(2).standard_normal((3, 4))
    seen = x.copy()
    fn(seen)
    return bool(np.array_equal(seen, x))


def _softmax_float32(fn) -> bool:
    x = rng(3).standard_normal((3, 6)).astype(np.float32)
    out = fn(x.copy())
    return keeps_float32(out) and same(out, ops.softmax(x))


SOFTMAX = [
    Case("random rows", "exp(x) divided by the sum of exp over the same row (the last axis)", _softmax_random),
    Case("last axis of a 3-d array", "sum over axis=-1 with keepdims=True, not over the whole array",
         _softmax_last_axis),
    Case("large logits (1e4)", "exp(1e4) overflows: subtract the row's max first; it does not change the result",
         _softmax_large),
    Case("very negative logits (-1e4)", "exp(-1e4) underflows to 0 for every entry, and 0/0 is NaN: "
         "subtracting the max fixes this too", _softmax_very_negative),
    Case("-inf gives exactly 0", "a masked entry (-inf) must get weight 0; the row's max is finite as long "
         "as one entry is", _softmax_minus_inf),
    Case("input left unchanged", "work on a new array (x - max), not in place on the caller's x",
         _softmax_input_unchanged),
    Case("float32 in, float32 out", "keep the input's dtype: a float64 numpy scalar or np.float64 array "
         "promotes the result", _softmax_float32),
]


# -- causal attention, one head ---------------------------------------------------------------
def _reference(q, k, v):
    """The library's attention on one head: [T, d] -> [T, d]."""
    return ops.attention(q[:, None, :], k[:, None, :], v[:, None, :]).reshape(q.shape)


def _qkv(seed, T=5, d=8, scale=1.0, dtype=np.float64):
    g = rng(seed)
    return tuple((g.standard_normal((T, d)) * scale).astype(dtype) for _ in range(3))


def _att_shape(fn) -> bool:
    q, k, v = _qkv(10, T=6, d=4)
    return np.shape(fn(q, k, v)) == (6, 4)


def _att_random(fn) -> bool:
    q, k, v = _qkv(11)
    return same(fn(q, k, v), _reference(q, k, v))


def _att_first_row(fn) -> bool:
    q, k, v = _qkv(12)
    return same(np.asarray(fn(q, k, v))[0], v[0])


def _att_no_future(fn) -> bool:
    q, k, v = _qkv(13)
    k2, v2 = k.copy(), v.copy()
    k2[-1] += 5.0
    v2[-1] -= 7.0
    a, b = np.asarray(fn(q, k, v)), np.asarray(fn(q, k2, v2))
    return same(a[:-1], b[:-1], rtol=1e-9, atol=1e-12)


def _att_rows_sum_to_one(fn) -> bool:
    q, k, _ = _qkv(14)
    ones = np.ones_like(q)
    return same(fn(q, k, ones), ones)


def _att_scale(fn) -> bool:
    q, k, v = _qkv(15, T=4, d=64)
    return same(fn(q, k, v), _reference(q, k, v))


def _att_large(fn) -> bool:
    q, k, v = _qkv(16, scale=40.0)  # scores of a few thousand
    return same(fn(q, k, v), _reference(q, k, v))


def _att_float32(fn) -> bool:
    q, k, v = _qkv(17, dtype=np.float32)
    out = fn(q, k, v)
    return keeps_float32(out) and same(out, _reference(q, k, v))


CAUSAL_ATTENTION = [
    Case("shape [T, d]", "scores q k^T are [T, T]; weights times v gives one row of width d per query",
         _att_shape),
    Case("random q, k, v", "softmax(q k^T / sqrt(d) + mask) v, with the mask -inf above the diagonal",
         _att_random),
    Case("first query sees only itself", "query 0 may see key 0 only, so its output is exactly v[0]: "
         "is the mask there?", _att_first_row),
    Case("no peeking at the future", "changing the last key and value must not change any earlier row: "
         "mask every key j > i", _att_no_future),
    Case("weights sum to 1 (mask before softmax)", "with v all ones the output must be all ones: add -inf "
         "to the future scores BEFORE the softmax, not zero the weights after it", _att_rows_sum_to_one),
    Case("scaled by 1/sqrt(d) (d = 64)", "divide the scores by sqrt(d), the head width q.shape[-1]",
         _att_scale),
    Case("large scores (stable softmax)", "scores in the thousands overflow exp: subtract each row's max",
         _att_large),
    Case("float32 in, float32 out", "keep the input's dtype: np.sqrt(d) is a float64 scalar and promotes; "
         "use math.sqrt(d) or cast", _att_float32),
]

EXERCISES = {"softmax": SOFTMAX, "causal_attention": CAUSAL_ATTENTION}
REFERENCES = {"softmax": ops.softmax, "causal_attention": _reference}
