"""The primitives the reference forward pass takes from one replaceable set.

A learner who writes `softmax`, `attention` or `rope` (the build-it-yourself exercises) hands
them to the real model as an argument, not by patching the library:

    mine = td.Kernels(attention=gqa_attention)
    td.generate(model, ids, 8, kernels=mine).tokens     # SmolLM2 on the learner's attention

Every field left None is the library's own (`ops`). Signatures (numpy in, numpy out):
    softmax(x)                          over the last axis
    attention(q, k, v)                  q [Tq, Hq, d], k and v [Tk, Hkv, d] -> [Tq, Hq, d], causal,
                                        the queries being the last Tq of the Tk positions
    rope(x, positions, base=10000.0)    x [T, H, d], positions [T] -> [T, H, d], the rotate-half
                                        ("halves") layout
The library's attention uses this set's softmax, so `Kernels(softmax=mine)` runs the learner's
softmax inside every head of every layer. Only the reference path reads Kernels; the fast path
is the library's own arithmetic, proven equal to the reference by tests.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import ops


@dataclass(frozen=True)
class Kernels:
    softmax: Callable | None = None
    attention: Callable | None = None
    rope: Callable | None = None

    def __post_init__(self):
        for name in ("softmax", "attention", "rope"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                raise TypeError(f"Kernels.{name} must be a function or None, got {type(fn).__name__}")

    @property
    def is_library(self) -> bool:
        """True when every primitive is the library's own."""
        return self.softmax is None and self.attention is None and self.rope is None

    def attend(self, q, k, v):
        """Attention of q [S, Hq, d] over k, v [T, Hkv, d].  -> [S, Hq, d]"""
        if self.attention is not None:
            return checked(self.attention(q, k, v), q.shape, "attention")
        return ops.attention(q, k, v, softmax=self.softmax or ops.softmax).reshape(q.shape)

    def rotate(self, x, positions, base: float, layout: str):
        """RoPE of x [S, H, d] at `positions`.  -> [S, H, d]"""
        if self.rope is None:
            return ops.apply_rope(x, positions, base, layout)
        if layout != "halves":
            raise ValueError(f"Kernels.rope implements the 'halves' (rotate-half) layout; this model uses {layout!r}")
        return checked(self.rope(x, positions, base), x.shape, "rope")


LIBRARY = Kernels()


def checked(out, shape, name):
    """A learner's result, refused with a one-line message when it has the wrong shape."""
    shape_of = getattr(out, "shape", None)
    if shape_of is None or tuple(shape_of) != tuple(shape):
        raise ValueError(f"Kernels.{name} returned shape {shape_of}, but the model needs {tuple(shape)}")
    return out
