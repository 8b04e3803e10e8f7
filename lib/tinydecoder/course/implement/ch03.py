"""Chapter 03's exercise: the wiring of a pre-norm decoder block.

    pre_norm_block(x [S, D], attn_norm, attention, ffn_norm, mlp) -> [S, D]

The four arguments are functions [S, D] -> [S, D]: the two norms and the two sublayers. Each
sublayer reads a normalised copy of the residual stream and adds its output to the stream; the
stream itself is never normalised. The library's answer: `core.residual.pre_norm_block`.
"""
from __future__ import annotations

import numpy as np

from ...core.ops import rmsnorm
from ...core.residual import pre_norm_block
from .case import Case
from .compare import keeps_float32, rng, same


def _parts(seed, D=8, dtype=np.float64, scale=0.5):
    r = rng(seed)
    w_att, w_mlp = (r.standard_normal((D, D)).astype(dtype) * scale for _ in range(2))
    g1, g2 = (1 + 0.3 * r.standard_normal(D)).astype(dtype), (1 + 0.3 * r.standard_normal(D)).astype(dtype)
    return (lambda x: rmsnorm(x, g1), lambda h: h @ w_att, lambda x: rmsnorm(x, g2), lambda z: np.tanh(z @ w_mlp))


def _x(seed, S=5, D=8, dtype=np.float64, scale=1.0):
    return (rng(seed).standard_normal((S, D)) * scale).astype(dtype)


def _shape(fn) -> bool:
    x = _x(30, S=3)
    return np.shape(fn(x, *_parts(31))) == (3, 8)


def _zero_sublayers(fn) -> bool:  # both sublayers add nothing: the block passes the stream through
    zero = lambda h: np.zeros_like(h)  # noqa: E731
    x = _x(32, scale=3.0)
    return same(fn(x.copy(), rmsnorm, zero, rmsnorm, zero), x)


def _sublayers_see_normalised(fn) -> bool:  # attention and mlp get their norm's output
    seen = {}

    def attention(h):
        seen["attention"] = np.array(h)
        return 0.1 * h

    def mlp(z):
        seen["mlp"] = np.array(z)
        return 0.1 * z

    x = _x(33, scale=20.0)
    fn(x.copy(), rmsnorm, attention, rmsnorm, mlp)
    rms = [np.sqrt(np.mean(seen[k] ** 2, axis=-1)) for k in ("attention", "mlp") if k in seen]
    return len(rms) == 2 and all(same(r, np.ones(len(x)), rtol=1e-3) for r in rms)


def _mlp_reads_attention_residual(fn) -> bool:  # the mlp reads x + attention(...), not attention(...)
    seen = {}
    attn_norm, attention, _, _ = _parts(34)

    def mlp(z):
        seen["mlp"] = np.array(z)
        return z

    x = _x(35)
    fn(x.copy(), attn_norm, attention, lambda v: v, mlp)  # an identity ffn_norm shows the stream itself
    return "mlp" in seen and same(seen["mlp"], x + attention(attn_norm(x)))


def _large_stream(fn) -> bool:  # a large residual stream keeps its size: no norm on the stream
    x = _x(36, scale=100.0)
    out = np.asarray(fn(x.copy(), *_parts(37)))
    return same(out, pre_norm_block(x, *_parts(37)))


def _random(fn) -> bool:
    x = _x(38)
    return same(fn(x.copy(), *_parts(39)), pre_norm_block(x, *_parts(39)))


def _float32(fn) -> bool:
    x = _x(40, dtype=np.float32)
    out = fn(x.copy(), *_parts(41, dtype=np.float32))
    return keeps_float32(out) and same(out, pre_norm_block(x, *_parts(41, dtype=np.float32)))


PRE_NORM_BLOCK = [
    Case("shape [S, D]", "the block maps the stream to a stream of the same shape", _shape),
    Case("sublayers that add nothing", "when attention and mlp both return zeros, what should reach the "
         "output? Each sublayer's output is added to the stream", _zero_sublayers),
    Case("the sublayers read normalised rows", "pre-norm: a norm sits before each sublayer, on its input "
         "(not after the addition)", _sublayers_see_normalised),
    Case("the mlp reads the stream after attention", "the second sublayer's norm reads the stream with "
         "attention's output already added", _mlp_reads_attention_residual),
    Case("a large stream keeps its size", "the norms make copies for the sublayers; the stream that is added "
         "to is the unnormalised x", _large_stream),
    Case("random sublayers vs the library", "compare with core.residual.pre_norm_block", _random),
    Case("float32 in, float32 out", "add in x's dtype (no float64 constants)", _float32),
]

EXERCISES = {"pre_norm_block": PRE_NORM_BLOCK}
REFERENCES = {"pre_norm_block": pre_norm_block}
