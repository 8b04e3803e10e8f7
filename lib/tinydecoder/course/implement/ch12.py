"""Chapter 12's exercise: attention over key blocks in one pass, with the online softmax.

    online_softmax_attention(q [Tq, d], k [Tk, d], v [Tk, d], block_size) -> (out [Tq, d], lse [Tq])

Non-causal, one head: every query sees every key. scores = q k^T / sqrt(d); out = softmax(scores) v;
lse = log(sum(exp(scores))) per query. The keys are visited block_size at a time (the last block
may be shorter), keeping per query a running max m, a running sum of exp(score - m) and an
accumulator of exp(score - m) * v, rescaled by exp(m_old - m_new) whenever the max grows.
The reference is `flash_attention` with one head and every key visible.
"""
from __future__ import annotations

import numpy as np

from ...algorithms.flash import flash_attention
from .case import Case


def reference(q, k, v, block_size):
    """(out [Tq, d], lse [Tq]) from the library's flash_attention, one head, no mask."""
    out, lse = flash_attention(q[:, None], k[:, None], v[:, None], block_size, query_start=k.shape[0])
    return out, lse[0]


def _inputs(seed, Tq=5, Tk=24, d=8, scale=1.0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((Tq, d)).astype(dtype) * scale, rng.standard_normal((Tk, d)).astype(dtype),
            rng.standard_normal((Tk, d)).astype(dtype))


def _pair(result):
    if not isinstance(result, tuple) or len(result) != 2:
        raise ValueError(f"return a pair (out, lse), got {type(result).__name__}")
    out, lse = (np.asarray(x) for x in result)
    if out.dtype.kind != "f" or lse.dtype.kind != "f":
        raise TypeError(f"out and lse must be float arrays, got {out.dtype} and {lse.dtype}")
    return out, lse


def _matches(fn, q, k, v, block_size, *, check_out=True, check_lse=True, rtol=1e-6, atol=1e-9) -> bool:
    out, lse = _pair(fn(q.copy(), k.copy(), v.copy(), block_size))
    want_out, want_lse = reference(q, k, v, block_size)
    if out.shape != want_out.shape or lse.shape != want_lse.shape:
        raise ValueError(f"returned out {out.shape} and lse {lse.shape}, expected [Tq, d] and [Tq]")
    if not (np.all(np.isfinite(out)) and np.all(np.isfinite(lse))):
        raise ValueError("the result holds NaN or inf")
    ok = True
    if check_out:
        ok &= bool(np.allclose(out, want_out, rtol=rtol, atol=atol))
    if check_lse:
        ok &= bool(np.allclose(lse, want_lse, rtol=rtol, atol=atol))
    return ok


def _shapes(fn) -> bool:
    q, k, v = _inputs(1)
    out, lse = _pair(fn(q, k, v, 8))
    if out.shape != (5, 8) or lse.shape != (5,):
        raise ValueError(f"returned out {out.shape} and lse {lse.shape}, expected (5, 8) and (5,)")
    return True


def _rising_max(fn) -> bool:
    """Each key block holds larger scores than the one before, so the max grows at every block."""
    q, k, v = _inputs(3, Tq=3, Tk=16)
    q = np.abs(q)
    k = np.abs(k) * np.repeat(np.arange(1, 5, dtype=np.float64), 4)[:, None]  # blocks of 4, growing
    return _matches(fn, q, k, v, 4, check_lse=False)


def _lse_has_the_max(fn) -> bool:
    """Scores around 30: the log-sum-exp is about 30 more than log(sum of exp(score - m))."""
    q, k, v = _inputs(4, scale=1.0)
    q = np.full_like(q, 30.0 / np.sqrt(q.shape[1]))  # every score = 30/sqrt(d) * sum(k_j) / sqrt(d)
    return _matches(fn, q, k, v, 8, check_out=False)


def _large_scores(fn) -> bool:
    """float32 scores in the hundreds: exp overflows unless the running max is subtracted."""
    q, k, v = _inputs(5, scale=60.0, dtype=np.float32)
    return _matches(fn, q, k, v, 8, rtol=1e-4, atol=1e-4)


def _float32_in_float32_out(fn) -> bool:
    q, k, v = _inputs(6, dtype=np.float32)
    out, lse = _pair(fn(q, k, v, 8))
    if out.dtype != np.float32 or lse.dtype != np.float32:
        raise TypeError(f"float32 in, {out.dtype} and {lse.dtype} out (a float64 scalar promotes everything)")
    return True


ONLINE_SOFTMAX_ATTENTION = [
    Case("shapes", "return (out [Tq, d], lse [Tq]): one output row and one log-sum-exp per query", _shapes),
    Case("random inputs, block_size divides Tk", "scores = q k^T / sqrt(d) for one key block at a time; "
         "at the end out = acc / (running sum) and lse = m + log(running sum)",
         lambda fn: _matches(fn, *_inputs(2), 8)),
    Case("block_size does not divide Tk", "the last key block is shorter: take k[start:start + block_size], "
         "which numpy cuts at Tk", lambda fn: _matches(fn, *_inputs(7, Tk=23), 5)),
    Case("one block, and one key per block", "block_size >= Tk is one ordinary softmax; block_size = 1 "
         "must give the same result", lambda fn: _matches(fn, *_inputs(8), 64) and _matches(fn, *_inputs(8), 1)),
    Case("the max grows in every block", "when a block raises the max from m to m_new, multiply the "
         "running sum AND the accumulator by exp(m - m_new) before adding the block's terms", _rising_max),
    Case("log-sum-exp includes the max", "the running sum holds exp(score - m), so "
         "log(sum exp(score)) = m + log(running sum)", _lse_has_the_max),
    Case("large float32 scores", "exp of a score in the hundreds overflows float32: always exponentiate "
         "score - (running max), never the score itself", _large_scores),
    Case("float32 stays float32", "use q.dtype for every array you create, and a scale of the same dtype",
         _float32_in_float32_out),
]

EXERCISES = {"online_softmax_attention": ONLINE_SOFTMAX_ATTENTION}
REFERENCES = {"online_softmax_attention": reference}
