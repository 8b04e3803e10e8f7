"""How the next token is chosen from the last position's logits.

    logits [V] --(temperature)--> logits / T --(top-k)--> keep the k best
               --(top-p)--> keep the smallest head of the sorted distribution with mass >= p
               --> renormalise --> draw one id with a seeded numpy Generator

Rules, in one place:
- temperature None or 0 without top-k/top-p is greedy; temperature 0 is greedy even with them
  (the best token is in every kept set, and T -> 0 puts all mass on it). temperature None with
  top-k or top-p means T = 1.
- The filters run in that order (temperature, then top-k, then top-p on what top-k kept), as in
  Hugging Face's generation warpers.
- Ties: tokens are ranked by logit, equal logits by the lower token id first (`np.argsort`
  with kind="stable" on -logits). Greedy returns the lowest id among the best; top-k keeps
  exactly min(k, finite tokens) tokens, so a tie at the k-th place keeps the lower ids.
- A logit of -inf is a token that can never be drawn (probability exactly 0); NaN and +inf
  are rejected. At least one logit must be finite.
- Everything is computed in float64 from the input logits (float32 logits are widened once),
  so the distribution does not depend on the logits' dtype beyond their values.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.ops import softmax
from ..core.validate import is_int, is_real


def check_sampling_params(temperature=None, top_k=None, top_p=None) -> None:
    """Raise ValueError/TypeError naming the bad parameter and what is allowed."""
    if temperature is not None:
        if not is_real(temperature):
            raise TypeError(f"temperature must be a number >= 0 (or None for greedy), got {temperature!r}")
        if not math.isfinite(float(temperature)) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 or None = greedy), got {temperature!r}")
    if top_k is not None:
        if not is_int(top_k):
            raise TypeError(f"top_k must be an integer >= 1 (or None for no top-k), got {top_k!r}")
        if top_k < 1:
            raise ValueError(f"top_k must be an integer >= 1 (or None for no top-k), got {top_k!r}")
    if top_p is not None:
        if not is_real(top_p):
            raise TypeError(f"top_p must be a number in (0, 1] (or None for no top-p), got {top_p!r}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (or None for no top-p), got {top_p!r}")


def check_logits(logits) -> np.ndarray:
    """Validate one position's logits; return them as a float64 vector [V]."""
    arr = np.asarray(logits)
    if arr.ndim == 2 and arr.shape[0] == 1:  # forward(..., last_only=True) gives [1, V]
        arr = arr[0]
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"logits must be one position's vector [V] (or [1, V]), got shape {arr.shape}")
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"logits must be real numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if np.isnan(arr).any() or np.isposinf(arr).any():
        bad = int(np.flatnonzero(np.isnan(arr) | np.isposinf(arr))[0])
        raise ValueError(f"logit of token {bad} is {arr[bad]}: logits must be finite, or -inf for a "
                         f"token that may never be chosen")
    if not np.isfinite(arr).any():
        raise ValueError("every logit is -inf: no token can be chosen")
    return arr


def rank_tokens(logits) -> np.ndarray:
    """Token ids from best to worst: by logit, equal logits by the lower id first.  -> [V]"""
    return np.argsort(-np.asarray(logits, dtype=np.float64), kind="stable")


def best_tokens(logits, m: int) -> np.ndarray:
    """rank_tokens(logits)[:m] without sorting the whole vocabulary: partition to find the m-th
    best logit, then sort only the tokens at or above it (ties there included, so the tie rule
    is exact).  -> [min(m, V)] ids, best first."""
    logits = np.asarray(logits, dtype=np.float64)
    V = logits.size
    if m >= V:
        return rank_tokens(logits)
    finite = np.flatnonzero(logits > -np.inf)  # -inf entries would slow the partition down
    values = logits[finite]
    if finite.size <= m:  # all finite ones, then -inf ids in increasing order
        ranked = finite[np.argsort(-values, kind="stable")]
        return np.concatenate([ranked, np.flatnonzero(logits == -np.inf)[:m - ranked.size]])
    threshold = np.partition(values, finite.size - m)[finite.size - m]  # the m-th largest value
    ids = finite[values >= threshold]  # increasing ids, at least m of them
    return ids[np.argsort(-logits[ids], kind="stable")][:m]


def greedy(logits) -> int:
    """The best token: the highest logit, the lowest id among ties."""
    return int(np.argmax(logits))  # argmax returns the first maximum


def apply_temperature(logits, temperature):
    """logits / T: T < 1 sharpens the distribution, T > 1 flattens it.  [V] -> [V] float64.

    T = 0 is the greedy limit and is handled by `sampling_distribution`, not by dividing."""
    check_sampling_params(temperature=temperature)
    if not temperature > 0:
        raise ValueError("apply_temperature needs temperature > 0; temperature 0 means greedy "
                         "(use sampling_distribution or make_sampler)")
    return np.asarray(logits, dtype=np.float64) / float(temperature)


def top_k_filter(logits, k):
    """Keep the k best tokens (ties: lower id first); the others become -inf.  [V] -> [V] float64.

    k larger than the number of finite logits keeps them all."""
    check_sampling_params(top_k=k)
    logits = np.asarray(logits, dtype=np.float64)
    out = np.full_like(logits, -np.inf)
    best = best_tokens(logits, k)  # [min(k, V)]
    out[best] = logits[best]  # -inf stays -inf even if ranked among the k
    return out


def probabilities(logits) -> np.ndarray:
    """softmax in float64: -inf logits get probability exactly 0.  [V] -> [V]"""
    return softmax(np.asarray(logits, dtype=np.float64))


def top_p_filter(logits, p):
    """Nucleus filter: keep the smallest set of best tokens whose probability mass is >= p;
    the others become -inf.  [V] -> [V] float64.

    Tokens are taken in rank order (ties: lower id first) until the running mass reaches p; the
    token that crosses p is kept. p = 1 keeps every token of nonzero probability."""
    check_sampling_params(top_p=p)
    logits = np.asarray(logits, dtype=np.float64)
    if p >= 1:  # no filter; the running sum could round to 1.0 before the tiniest tokens
        return logits.copy()
    probs = probabilities(logits)
    m = 64
    while True:  # the nucleus is a head of the ranking: rank only a head big enough to hold it
        order = best_tokens(logits, m)
        mass = probs[order]  # best first
        if m >= logits.size or mass.sum() >= p:
            break
        m *= 4
    before = np.cumsum(mass) - mass  # mass of the better tokens
    keep = order[(before < p) & (mass > 0)]  # the first token always has before == 0 < p
    out = np.full_like(logits, -np.inf)
    out[keep] = logits[keep]
    return out


def is_greedy(temperature=None, top_k=None, top_p=None) -> bool:
    """Whether these settings reduce to taking the best token."""
    check_sampling_params(temperature, top_k, top_p)
    if temperature == 0:
        return True
    return temperature is None and top_k is None and top_p is None


def sampling_distribution(logits, temperature=None, top_k=None, top_p=None) -> np.ndarray:
    """The distribution a sampler with these settings draws from.  [V] -> probs [V] float64.

    Greedy settings give a one-hot vector on the best token. Otherwise: temperature, then
    top-k, then top-p, then softmax over what is kept (zeros elsewhere)."""
    logits = check_logits(logits)
    check_sampling_params(temperature, top_k, top_p)
    if is_greedy(temperature, top_k, top_p):
        probs = np.zeros_like(logits)
        probs[np.argmax(logits)] = 1.0  # the first maximum: the lowest id among ties
        return probs
    scaled = apply_temperature(logits - logits.max(), 1.0 if temperature is None else temperature)
    if top_k is not None:
        scaled = top_k_filter(scaled, top_k)
    if top_p is not None:
        scaled = top_p_filter(scaled, top_p)
    return probabilities(scaled)


def kept_tokens(logits, temperature=None, top_k=None, top_p=None) -> np.ndarray:
    """Ids a sampler with these settings can return, best first."""
    probs = sampling_distribution(logits, temperature, top_k, top_p)
    order = rank_tokens(check_logits(logits))
    return order[probs[order] > 0]


def draw(probs, rng: np.random.Generator) -> int:
    """One id from `probs` by inverting the cumulative distribution with a uniform draw.

    Only tokens of nonzero probability can come out, whatever the rounding."""
    support = np.flatnonzero(probs > 0)  # ids in increasing order
    cdf = np.cumsum(probs[support])
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(support[min(i, support.size - 1)])


class Sampler:
    """A sampler `generate` accepts: call it with logits [V], get a token id.

    The random stream is a `np.random.Generator` seeded once; the same seed and the same logits
    give the same tokens. `reset()` rewinds to the seed. Greedy settings never touch the stream."""

    def __init__(self, temperature=None, top_k=None, top_p=None, seed=None):
        check_sampling_params(temperature, top_k, top_p)
        if seed is not None and not isinstance(seed, np.random.Generator) and (
                not is_int(seed) or seed < 0):
            raise ValueError(f"seed must be an integer >= 0, a numpy Generator, or None, got {seed!r}")
        self.temperature, self.top_k, self.top_p, self.seed = temperature, top_k, top_p, seed
        self.greedy = is_greedy(temperature, top_k, top_p)
        self.reset()

    def reset(self) -> None:
        """Start the random stream again from the seed."""
        self.rng = self.seed if isinstance(self.seed, np.random.Generator) else np.random.default_rng(self.seed)

    def distribution(self, logits) -> np.ndarray:
        return sampling_distribution(logits, self.temperature, self.top_k, self.top_p)

    def __call__(self, logits) -> int:
        if self.greedy:
            return greedy(check_logits(logits))
        return draw(self.distribution(logits), self.rng)

    def __repr__(self) -> str:
        if self.greedy:
            return "Sampler(greedy)"
        parts = [f"{name}={value!r}" for name, value in (("temperature", self.temperature), ("top_k", self.top_k),
                                                          ("top_p", self.top_p)) if value is not None]
        seed = "Generator" if isinstance(self.seed, np.random.Generator) else repr(self.seed)
        return f"Sampler({', '.join(parts)}, seed={seed})"


def make_sampler(temperature=None, top_k=None, top_p=None, seed=None) -> Sampler:
    """A callable logits -> token id for `generate(..., sampler=...)`.

    make_sampler() is greedy; make_sampler(temperature=0.8, top_k=50, top_p=0.95, seed=0)
    samples reproducibly. Bad settings raise a ValueError saying what is allowed."""
    return Sampler(temperature, top_k, top_p, seed)
