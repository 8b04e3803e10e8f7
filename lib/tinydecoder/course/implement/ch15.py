"""Chapter 15's exercise: the speculative sampling rule for one guess.

    accept_or_resample(p [V], q [V], x, rng) -> (accepted: bool, token: int)

p: the target's distribution, q: the draft's, x: the draft's guess (drawn from q), rng: a
numpy Generator to draw from. Keep x with probability min(1, p(x) / q(x)); otherwise draw the
token from the residual norm(max(0, p - q)). The token is then distributed exactly as p. The
reference is the library's vectorised `speculative.accept_or_resample` with two uniforms from rng.

The distribution cases draw many times with fixed seeds and compare the counts with the exact
probabilities by a chi-square test at significance 0.001: a correct rule fails one seed in a
thousand, and the seeds are fixed, so it passes every time.
"""
from __future__ import annotations

import numpy as np

from ...decoding.speculative import accept_or_resample
from .case import Case

P = np.array([0.05, 0.30, 0.15, 0.25, 0.05, 0.20])  # the target
Q = np.array([0.30, 0.10, 0.15, 0.05, 0.35, 0.05])  # the draft
CHI2_0001 = {2: 13.816, 5: 20.515}  # chi-square critical values at 0.001, by degrees of freedom
DRAWS = 20_000


def reference(p, q, x, rng):
    """The library's rule on one guess: (accepted, token)."""
    tokens, kept = accept_or_resample(p, q, [x], [rng.random()], [rng.random()])
    return bool(kept[0]), int(tokens[0])


def _call(fn, p, q, x, rng):
    result = fn(p.copy(), q.copy(), x, rng)
    if not isinstance(result, tuple) or len(result) != 2:
        raise ValueError(f"return a pair (accepted, token), got {type(result).__name__}")
    accepted, token = result
    if not isinstance(accepted, (bool, np.bool_)):
        raise TypeError(f"accepted must be a bool, got {type(accepted).__name__}")
    if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
        raise TypeError(f"token must be an int, got {type(token).__name__}")
    if not 0 <= int(token) < len(p):
        raise ValueError(f"token {int(token)} is not in 0..{len(p) - 1}")
    if accepted and int(token) != x:
        raise ValueError("accepted is True but the token returned is not the guess x")
    return bool(accepted), int(token)


def chi_square(counts, probs) -> float:
    expected = np.asarray(probs) * np.sum(counts)
    nonzero = expected > 0
    if np.any(np.asarray(counts)[~nonzero]):
        return float("inf")  # a token of probability 0 came out
    return float(np.sum((counts[nonzero] - expected[nonzero]) ** 2 / expected[nonzero]))


def _types(fn) -> bool:
    _call(fn, P, Q, 1, np.random.default_rng(0))
    return True


def _kept_when_p_covers_q(fn) -> bool:
    """p(x) >= q(x): min(1, p/q) = 1, the guess is always kept."""
    rng = np.random.default_rng(1)
    return all(_call(fn, P, Q, x, rng) == (True, x) for x in (1, 3, 5, 2) for _ in range(50))


def _never_kept_when_p_is_zero(fn) -> bool:
    p = np.array([0.0, 0.5, 0.5, 0.0])
    q = np.array([0.7, 0.1, 0.1, 0.1])
    rng = np.random.default_rng(2)
    return all(not _call(fn, p, q, 0, rng)[0] for _ in range(200))


def _acceptance_probability(fn) -> bool:
    """x = 4: p/q = 0.05/0.35 = 1/7. Kept in about 1/7 of DRAWS tries (5 standard errors)."""
    rng = np.random.default_rng(3)
    kept = sum(_call(fn, P, Q, 4, rng)[0] for _ in range(DRAWS))
    rate = 0.05 / 0.35
    return abs(kept / DRAWS - rate) < 5 * np.sqrt(rate * (1 - rate) / DRAWS)


def _resampled_from_the_residual(fn) -> bool:
    """x = 0 (p/q = 1/6): the rejected draws must follow norm(max(0, p - q)) = tokens 1, 3, 5 only."""
    rng = np.random.default_rng(4)
    tokens = [t for kept, t in (_call(fn, P, Q, 0, rng) for _ in range(DRAWS)) if not kept]
    residual = np.maximum(P - Q, 0)
    residual /= residual.sum()
    counts = np.bincount(tokens, minlength=6)
    if np.any(counts[residual == 0]):
        return False  # a token the residual never gives (resampling from p or q does)
    support = residual > 0
    return chi_square(counts[support], residual[support]) < CHI2_0001[int(support.sum()) - 1]


def _distributed_as_p(fn) -> bool:
    """x drawn from q, then the rule: the tokens that come out follow p (chi-square, 5 d.o.f.)."""
    rng = np.random.default_rng(5)
    guesses = rng.choice(6, size=DRAWS, p=Q)
    counts = np.bincount([_call(fn, P, Q, int(x), rng)[1] for x in guesses], minlength=6)
    return chi_square(counts, P) < CHI2_0001[5]


ACCEPT_OR_RESAMPLE = [
    Case("returns (bool, int)", "return (accepted, token): a bool, and the token id as an int "
         "(the guess itself when accepted)", _types),
    Case("kept when p(x) >= q(x)", "the acceptance probability is min(1, p(x) / q(x)): 1 when the target "
         "likes the guess at least as much as the draft", _kept_when_p_covers_q),
    Case("never kept when p(x) = 0", "a guess the target gives probability 0 must always be rejected",
         _never_kept_when_p_is_zero),
    Case("accepted with probability p(x) / q(x)", "keep x when a uniform draw u < p(x) / q(x) (not q / p)",
         _acceptance_probability),
    Case("resampled from max(0, p - q)", "after a rejection draw from the residual max(0, p - q), "
         "renormalised: not from p, not from q", _resampled_from_the_residual),
    Case("output distributed as p (chi-square)", "guesses from q through the rule must come out as p: "
         "check the acceptance ratio and the residual", _distributed_as_p),
]

EXERCISES = {"accept_or_resample": ACCEPT_OR_RESAMPLE}
REFERENCES = {"accept_or_resample": reference}
