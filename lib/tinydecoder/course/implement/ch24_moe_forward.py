"""Chapter 24's second exercise: the forward pass of a mixture-of-experts layer.

    moe_forward(x [T, D], router_logits [T, E], experts, k) -> [T, D]

experts: E functions, each [n, D] -> [n, D] (run one on the rows of the tokens that chose it).
Route: softmax of each token's router logits over the E experts; keep its k most probable
experts; renormalise their k probabilities to sum to 1 (the gates); the token's output is the
gate-weighted sum of those k experts' outputs on it, in the token's own row. The library's
answer: `algorithms.moe.moe_forward`.
"""
from __future__ import annotations

import numpy as np

from ...algorithms.moe import moe_forward
from .case import Case
from .compare import keeps_float32, rng, same


def _scalers(E):
    return [lambda h, c=e + 1.0: h * np.asarray(c, np.asarray(h).dtype) for e in range(E)]


def _shifters(E, D):
    return [lambda h, e=e: h + np.asarray(np.arange(D) * (e + 1), np.asarray(h).dtype) for e in range(E)]


def _linear(seed, E, D, dtype=np.float64):
    r = rng(seed)
    ws = [r.standard_normal((D, D)).astype(dtype) * 0.5 for _ in range(E)]
    return [lambda h, w=w: np.tanh(h @ w) for w in ws]


def _by_hand(fn) -> bool:  # probabilities .1 .2 .3 .4, k = 2, expert e multiplies by e + 1
    x = rng(230).standard_normal((1, 4))
    y = fn(x, np.log([[0.1, 0.2, 0.3, 0.4]]), _scalers(4), 2)
    return same(y, moe_forward(x, np.log([[0.1, 0.2, 0.3, 0.4]]), _scalers(4), 2))


def _gates_sum_to_one(fn) -> bool:  # every expert the identity: the output is x
    x = rng(231).standard_normal((5, 4))
    logits = rng(232).standard_normal((5, 6)) * 2
    return same(fn(x, logits, [lambda h: h] * 6, 2), x)


def _only_chosen(fn) -> bool:  # k = 1: the most probable expert alone, with gate 1
    x = rng(233).standard_normal((4, 3))
    logits = np.array([[0.0, 1.0, 0.5], [2.0, 0.0, 1.0], [0.0, 0.2, 0.9], [1.0, 1.5, 0.0]])
    return same(fn(x, logits, _scalers(3), 1), x * (np.argmax(logits, axis=1) + 1.0)[:, None])


def _own_rows(fn) -> bool:  # token t picks expert T-1-t: routed in the reverse of their order
    T = 5
    x = rng(234).standard_normal((T, 4))
    logits = np.full((T, T), -5.0)
    logits[np.arange(T), T - 1 - np.arange(T)] = 5.0
    return same(fn(x, logits, _shifters(T, 4), 2), moe_forward(x, logits, _shifters(T, 4), 2))


def _random(fn, seed, T, E, D, k, dtype=np.float64) -> bool:
    x = rng(seed).standard_normal((T, D)).astype(dtype)
    logits = (rng(seed + 1).standard_normal((T, E)) * 2).astype(dtype)
    out = fn(x, logits, _linear(seed + 2, E, D, dtype), k)
    if dtype == np.float32:
        keeps_float32(out)
    return same(out, moe_forward(x, logits, _linear(seed + 2, E, D, dtype), k))


MOE_FORWARD = [
    Case("shape [T, D]", "one output row per token",
         lambda fn: np.shape(fn(np.ones((3, 4)), np.zeros((3, 5)), _scalers(5), 2)) == (3, 4)),
    Case("by hand: probabilities [.1 .2 .3 .4], k = 2", "softmax over the E experts, keep the k largest, "
         "weight each chosen expert's output by its gate", _by_hand),
    Case("the gates sum to 1", "renormalise the k kept probabilities per token (identity experts must give "
         "back x)", _gates_sum_to_one),
    Case("only the chosen experts count", "a token's output sums the k experts it chose, not all E",
         _only_chosen),
    Case("each token's output in its own row", "an expert's outputs belong to the rows of the tokens that "
         "chose it (y[rows] += ...), whatever order the experts run in", _own_rows),
    Case("random experts, k = 2 of 8, vs the library", "compare with algorithms.moe.moe_forward",
         lambda fn: _random(fn, 235, 10, 8, 6, 2)),
    Case("k = 3, float32 in, float32 out", "keep x's dtype; cast the gates to it",
         lambda fn: _random(fn, 238, 7, 5, 4, 3, np.float32)),
]

EXERCISES = {"moe_forward": MOE_FORWARD}
REFERENCES = {"moe_forward": moe_forward}
