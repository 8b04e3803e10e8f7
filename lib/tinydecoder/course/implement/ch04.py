"""Chapter 04's exercise: rotary position embedding, rotate-half layout.

    apply_rope(x [T, H, d], positions [T], base=10000.0) -> [T, H, d]

Pair i is (x[..., i], x[..., i + d/2]), turned by the angle positions * base^(-2i/d): the layout
the reference path uses for SmolLM2 (ops.apply_rope with layout="halves").
"""
from __future__ import annotations

import numpy as np

from ...core import ops
from .case import Case
from .compare import keeps_float32, rng, same


def _x(seed, T=4, H=3, d=8, dtype=np.float64):
    return rng(seed).standard_normal((T, H, d)).astype(dtype)


def _shape(fn) -> bool:
    x = _x(20, T=3, H=2, d=6)
    return np.shape(fn(x.copy(), np.arange(3))) == (3, 2, 6)


def _position_zero(fn) -> bool:
    x = _x(21, T=1)
    return same(fn(x.copy(), np.array([0])), x)


def _random(fn) -> bool:
    x, pos = _x(22), np.arange(4)
    return same(fn(x.copy(), pos), ops.apply_rope(x, pos))


def _layout(fn) -> bool:
    x, pos = _x(23, T=2, H=1, d=8), np.array([1, 2])
    return same(fn(x.copy(), pos), ops.apply_rope(x, pos, layout="halves"))


def _positions_given(fn) -> bool:
    x, pos = _x(24, T=3), np.array([7, 8, 9])
    return same(fn(x.copy(), pos), ops.apply_rope(x, pos))


def _decode_row(fn) -> bool:
    x, pos = _x(25, T=1), np.array([17])
    return same(fn(x.copy(), pos), ops.apply_rope(x, pos))


def _base(fn) -> bool:
    x, pos = _x(26, T=3, d=16), np.array([3, 40, 500])
    return same(fn(x.copy(), pos, base=500000.0), ops.apply_rope(x, pos, base=500000.0))


def _length_kept(fn) -> bool:
    x, pos = _x(27), np.array([2, 5, 11, 29])
    out = np.asarray(fn(x.copy(), pos))
    return same(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1))


def _float32(fn) -> bool:
    x, pos = _x(28, dtype=np.float32), np.arange(4)
    out = fn(x.copy(), pos)
    return keeps_float32(out) and same(out, ops.apply_rope(x, pos))


APPLY_ROPE = [
    Case("shape [T, H, d]", "the rotation changes values, not the shape", _shape),
    Case("position 0 is unchanged", "the angle at position 0 is 0: cos = 1, sin = 0", _position_zero),
    Case("random x, positions 0..T-1", "pair i turns by positions * base**(-2i/d), i = 0 .. d/2 - 1",
         _random),
    Case("rotate-half layout", "pair x[..., i] with x[..., i + d/2] (the two halves), not x[2i] with "
         "x[2i+1] (interleaved)", _layout),
    Case("the positions given, not 0..T-1", "use the positions argument: a chunk or a decode step "
         "does not start at 0", _positions_given),
    Case("one decode row at position 17", "a single new token sits at its true position, not at 0 "
         "or one off", _decode_row),
    Case("another base (500000)", "the frequencies come from the base argument, not a constant 10000",
         _base),
    Case("length of each pair kept", "a rotation keeps length: new_a = a cos - b sin, new_b = a sin + "
         "b cos (check the signs)", _length_kept),
    Case("float32 in, float32 out", "compute cos and sin, then cast them to x.dtype before multiplying",
         _float32),
]

EXERCISES = {"apply_rope": APPLY_ROPE}
REFERENCES = {"apply_rope": ops.apply_rope}
