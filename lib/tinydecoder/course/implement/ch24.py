"""Chapter 24's exercise: the router's top-k gating of a mixture of experts.

    top_k_gating(router_logits [T, E], k) -> (experts [T, k], gates [T, k])

Softmax over the E experts, keep the k most probable (largest first; a tie goes to the lower
expert id), and renormalise their probabilities to sum to 1 per token.
"""
from __future__ import annotations

import numpy as np

from ...algorithms import moe
from .case import Case
from .compare import as_array, rng, same


def _logits(seed, T=6, E=8, scale=2.0):
    return rng(seed).standard_normal((T, E)) * scale


def _compare(fn, logits, k) -> bool:
    experts, gates = fn(logits, k)
    want_e, want_g = moe.top_k_gating(logits, k)
    experts = as_array(experts, "experts")
    if experts.shape != want_e.shape:
        raise ValueError(f"experts has shape {experts.shape}, expected {want_e.shape}")
    return bool(np.array_equal(experts, want_e)) and same(gates, want_g)


def _by_hand(fn) -> bool:
    experts, gates = fn(np.log(np.array([[1.0, 2.0, 3.0, 4.0]])), 2)  # softmax [.1 .2 .3 .4]
    return as_array(experts).tolist() == [[3, 2]] and same(gates, [[4 / 7, 3 / 7]])


def _sum_to_one(fn) -> bool:
    _, gates = fn(_logits(231), 3)
    return same(np.sum(as_array(gates, "gates"), axis=1), np.ones(6))


def _largest_first(fn) -> bool:
    experts, _ = fn(np.array([[0.0, 3.0, 1.0, 2.0]]), 3)
    return as_array(experts).tolist() == [[1, 3, 2]]


def _ties(fn) -> bool:
    experts, gates = fn(np.zeros((2, 5)), 2)
    return as_array(experts).tolist() == [[0, 1], [0, 1]] and same(gates, np.full((2, 2), 0.5))


def _large_logits(fn) -> bool:
    return _compare(fn, _logits(232) * 500, 2)


def _k_equals_e(fn) -> bool:
    logits = _logits(233, E=4)
    experts, gates = fn(logits, 4)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    return same(np.take_along_axis(probs, as_array(experts), 1), gates)


TOP_K_GATING = [
    Case("by hand: probabilities [.1 .2 .3 .4], k = 2", "softmax, keep the 2 largest (experts 3 then 2), "
         "divide each by their sum: 4/7 and 3/7", _by_hand),
    Case("gates sum to 1", "renormalise: divide the kept probabilities by their sum, per token", _sum_to_one),
    Case("largest first", "sort the experts by probability, largest first (np.argsort of -p)", _largest_first),
    Case("ties go to the lower id", "a stable sort keeps the lower expert id first among equal "
         "probabilities (np.argsort(..., kind='stable'))", _ties),
    Case("large logits", "subtract each row's max before exp, or the softmax overflows", _large_logits),
    Case("k = E: every expert, gates = probabilities", "with every expert kept, the gates are the "
         "softmax itself", _k_equals_e),
    Case("random logits, k = 2 of 8", "softmax over E, top k, renormalise",
         lambda fn: _compare(fn, _logits(234), 2)),
]

EXERCISES = {"top_k_gating": TOP_K_GATING}
REFERENCES = {"top_k_gating": moe.top_k_gating}
