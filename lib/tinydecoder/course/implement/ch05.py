"""Chapter 05's exercise: grouped-query attention for prefill, decode and chunks alike.

    gqa_attention(q [Tq, Hq, d], k [Tk, Hkv, d], v [Tk, Hkv, d]) -> [Tq, Hq, d]

Causal; the queries are the last Tq of the Tk positions, so query i sees keys 0 .. Tk - Tq + i.
Query head h reads KV head h // (Hq // Hkv). Scaled by 1/sqrt(d).
"""
from __future__ import annotations

import numpy as np

from ...core import ops
from .case import Case
from .compare import keeps_float32, rng, same


def _reference(q, k, v):
    return ops.attention(q, k, v).reshape(q.shape)


def _qkv(seed, Tq=5, Tk=5, Hq=6, Hkv=2, d=8, scale=1.0, dtype=np.float64):
    g = rng(seed)
    q = g.standard_normal((Tq, Hq, d)) * scale
    k = g.standard_normal((Tk, Hkv, d)) * scale
    v = g.standard_normal((Tk, Hkv, d))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _compare(fn, **shape) -> bool:
    q, k, v = _qkv(**shape)
    return same(fn(q, k, v), _reference(q, k, v))


def _shape(fn) -> bool:
    q, k, v = _qkv(30, Tq=2, Tk=7, Hq=4, Hkv=2, d=3)
    return np.shape(fn(q, k, v)) == (2, 4, 3)


def _head_mapping(fn) -> bool:
    q, k, _ = _qkv(31, Tq=3, Tk=3, Hq=6, Hkv=2)
    v = np.zeros((3, 2, 8))
    v[:, 0], v[:, 1] = 1.0, -1.0  # KV head 0 holds ones, head 1 minus ones
    out = np.asarray(fn(q, k, v))
    return same(out, _reference(q, k, v))


def _first_query(fn) -> bool:
    q, k, v = _qkv(32)
    out = np.asarray(fn(q, k, v))
    return same(out[0], np.repeat(v[0], 3, axis=0))


def _rows_sum_to_one(fn) -> bool:
    q, k, _ = _qkv(33)
    ones = np.ones((5, 2, 8))
    return same(fn(q, k, ones), np.ones((5, 6, 8)))


def _float32(fn) -> bool:
    q, k, v = _qkv(39, dtype=np.float32)
    out = fn(q, k, v)
    return keeps_float32(out) and same(out, _reference(q, k, v))


GQA_ATTENTION = [
    Case("shape [Tq, Hq, d]", "one output row per query and query head, each of width d", _shape),
    Case("prefill, 6 query heads on 2 KV heads", "softmax(q k^T / sqrt(d) + causal mask) v for every "
         "query head", lambda fn: _compare(fn, seed=34)),
    Case("head mapping h -> h // (Hq/Hkv)", "query heads 0..g-1 share KV head 0, the next g KV head 1 "
         "(g = Hq // Hkv); h % Hkv is another model's layout", _head_mapping),
    Case("first query sees only itself", "in a prefill, query 0 may see key 0 only", _first_query),
    Case("weights sum to 1 (mask before softmax)", "with v all ones the output is all ones: -inf before "
         "the softmax, not zeros after it", _rows_sum_to_one),
    Case("decode: 1 query after 6 keys", "the one query is the LAST position: it sees every key (query "
         "i sees keys 0 .. Tk - Tq + i)", lambda fn: _compare(fn, seed=35, Tq=1, Tk=7)),
    Case("chunk: 3 queries after 4 cached keys", "the mask is [Tq, Tk] with the triangle in its last Tq "
         "columns: query i sees keys 0 .. Tk - Tq + i", lambda fn: _compare(fn, seed=36, Tq=3, Tk=7)),
    Case("scaled by 1/sqrt(d) (d = 64)", "divide the scores by sqrt(d), d = q.shape[-1]",
         lambda fn: _compare(fn, seed=37, d=64)),
    Case("one KV head for all (MQA) and one each (MHA)", "Hq // Hkv query heads per KV head also when "
         "that is 1 or Hq", lambda fn: _compare(fn, seed=38, Hkv=1) and _compare(fn, seed=38, Hkv=6)),
    Case("large scores (stable softmax)", "scores in the thousands overflow exp: subtract each row's max",
         lambda fn: _compare(fn, seed=40, scale=12.0)),
    Case("float32 in, float32 out", "keep the input's dtype: np.sqrt(d) is a float64 scalar and "
         "promotes; use math.sqrt(d) or cast", _float32),
]

EXERCISES = {"gqa_attention": GQA_ATTENTION}
REFERENCES = {"gqa_attention": _reference}
