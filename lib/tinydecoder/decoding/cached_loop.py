"""The cached generation loop, written out: prefill once, then one token per step.

    step(ids, positions) -> logits [len(ids), V]     # runs the model on new rows and appends
                                                     # their K/V to its cache
    new = cached_greedy(step, prompt, max_new_tokens)

Round 1 feeds the whole prompt at positions 0..P-1; round i > 1 feeds only the token chosen in
round i-1, at position P + i - 2 (right after everything the cache holds). The last chosen token
is not fed: n new tokens take n forward calls. `generate.generate` is this loop with samplers,
processors and bookkeeping; `model_step(model)` makes a `step` from a model and a fresh cache.
"""
from __future__ import annotations

import numpy as np

from ..core.validate import is_int


def cached_greedy(step, prompt, max_new_tokens: int) -> list:
    """Greedy continuation of `prompt` by `step` (see the module docstring): n new token ids."""
    tokens = [int(t) for t in prompt]
    if not tokens:
        raise ValueError("the prompt must hold at least one token")
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    new, fed = [], 0  # fed: positions the cache holds
    for _ in range(int(max_new_tokens)):
        rows = tokens[fed:]  # the whole prompt in round 1, then the one token chosen last
        logits = np.asarray(step(rows, np.arange(fed, fed + len(rows))))
        fed += len(rows)
        token = int(np.argmax(logits[-1]))
        tokens.append(token)
        new.append(token)
    return new


def model_step(model, cache=None, kernels=None):
    """A `step(ids, positions)` running `model` (the reference forward pass) on a cache of its own
    (or `cache`); `kernels` as for reference.forward."""
    from ..core import reference
    from ..core.kernels import LIBRARY

    cache = model.new_cache() if cache is None else cache

    def step(ids, positions):
        return reference.forward(model, ids, cache, positions=positions, kernels=kernels or LIBRARY)

    step.cache = cache
    return step
