"""Chapter 09's exercise: the nucleus (top-p) filter on a probability vector.

    top_p_filter(probs [V], p) -> [V]

Keep the smallest set of most likely tokens whose probability reaches p (the token that crosses
p is kept), set the others to 0, renormalise so the kept ones sum to 1. Ties in probability are
not tested (libraries break them differently).
"""
from __future__ import annotations

import numpy as np

from ...decoding import sampling
from .case import Case
from .compare import as_array, rng, same


def _reference(probs, p):
    with np.errstate(divide="ignore"):
        logits = np.log(np.asarray(probs, dtype=np.float64))
    return sampling.probabilities(sampling.top_p_filter(logits, p))


def _random_probs(seed, V=50):
    x = rng(seed).standard_normal(V) * 2.0
    e = np.exp(x - x.max())
    return e / e.sum()


def _compare(fn, probs, p) -> bool:
    return same(fn(np.array(probs, dtype=np.float64), p), _reference(probs, p), rtol=1e-6, atol=1e-9)


def _sums_to_one(fn) -> bool:
    out = as_array(fn(_random_probs(41), 0.7))
    return bool(abs(out.sum() - 1.0) < 1e-6)


def _input_unchanged(fn) -> bool:
    probs = _random_probs(42)
    seen = probs.copy()
    fn(seen, 0.5)
    return bool(np.array_equal(seen, probs))


TOP_P_FILTER = [
    Case("shape [V]", "one probability per token, zeros for the tokens filtered out",
         lambda fn: np.shape(fn(_random_probs(43), 0.5)) == (50,)),
    Case("random distribution, p = 0.9", "sort from most to least likely, keep the head whose running mass "
         "reaches p, zero the rest, renormalise", lambda fn: _compare(fn, _random_probs(44), 0.9)),
    Case("the boundary token is kept", "keep tokens until the running sum reaches p: the token that "
         "crosses p belongs to the set (cumsum < p alone drops it)",
         lambda fn: _compare(fn, [0.4, 0.3, 0.2, 0.1], 0.6)),
    Case("unsorted input", "sort to decide, but write the kept probabilities back at their original "
         "token ids", lambda fn: _compare(fn, [0.1, 0.4, 0.05, 0.3, 0.15], 0.6)),
    Case("renormalised", "divide the kept probabilities by their sum so they add up to 1", _sums_to_one),
    Case("best token alone when it holds p", "if the most likely token already has mass >= p, it is "
         "the whole set", lambda fn: _compare(fn, [0.05, 0.92, 0.03], 0.9)),
    Case("p = 1 keeps every token", "with p = 1 nothing is removed (beware the running sum rounding "
         "below 1)", lambda fn: _compare(fn, _random_probs(45, V=1000), 1.0)),
    Case("zero-probability tokens stay 0", "a token of probability 0 is never kept, even at p = 1",
         lambda fn: _compare(fn, [0.5, 0.0, 0.3, 0.2, 0.0], 1.0)),
    Case("input left unchanged", "build a new array; do not zero the caller's probs in place",
         _input_unchanged),
]

EXERCISES = {"top_p_filter": TOP_P_FILTER}
REFERENCES = {"top_p_filter": _reference}
