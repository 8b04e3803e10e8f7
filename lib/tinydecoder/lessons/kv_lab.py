"""Measurements for notebook 13 (a quantised KV cache): the log-likelihood of a fixed text read
back through a cache, token by token, and how much of a difference between two caches is noise.

A perplexity over N scored tokens is exp of the mean negative log-likelihood (NLL). Two caches
scored on the same tokens give paired NLLs; the difference of their means has the standard error
std(per-token difference) / sqrt(N). A difference smaller than about two standard errors says
nothing about which cache is better: another text of the same length could reverse it.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.validate import is_int


def chunked_log_probs(model, token_ids, cache=None, prefix: int = 32, chunk: int = 32) -> np.ndarray:
    """log p(token_ids[i] | token_ids[:i]) for i = prefix .. N-1, float64 [N - prefix], run
    through `cache`: the first `prefix` tokens are prefilled, the rest fed `chunk` tokens at a
    time, so every later token attends to keys and values read back from the cache."""
    from ..core.validate import check_token_ids
    from ..fast import forward  # the same numbers as the reference forward (tests prove it), faster

    ids = check_token_ids(model.config, token_ids)
    if not 1 <= prefix < len(ids):
        raise ValueError(f"prefix must be in 1..{len(ids) - 1} (tokens before the first scored one), got {prefix}")
    if not is_int(chunk) or chunk < 1:
        raise ValueError(f"chunk must be an integer >= 1, got {chunk!r}")
    cache = model.new_cache(len(ids)) if cache is None else cache
    if len(cache):
        raise ValueError(f"the cache must be empty (it holds {len(cache)} positions): the text is prefilled into it")
    rows = [forward(model, ids[:prefix], cache, last_only=True)]  # predicts ids[prefix]
    for start in range(prefix, len(ids) - 1, chunk):
        rows.append(forward(model, ids[start:min(start + chunk, len(ids) - 1)], cache))
    logits = np.concatenate(rows).astype(np.float64)  # [N - prefix, V]
    targets = ids[prefix:]
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted[np.arange(len(targets)), targets] - np.log(np.exp(shifted).sum(axis=1))


def chunked_perplexity(model, token_ids, cache=None, prefix: int = 32, chunk: int = 32) -> float:
    """Perplexity of token_ids[prefix:] given what comes before, run through `cache`
    (exp of minus the mean of `chunked_log_probs`)."""
    return float(np.exp(-chunked_log_probs(model, token_ids, cache, prefix, chunk).mean()))


def paired_difference(log_probs, baseline) -> tuple:
    """(mean NLL change per token, its standard error) of `log_probs` against `baseline`, scored on
    the same tokens: positive = worse than the baseline. Both [N] float, N >= 2."""
    a, b = np.asarray(log_probs, np.float64), np.asarray(baseline, np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size < 2:
        raise ValueError(f"need two 1-D arrays of the same length >= 2 (log-probs of the same tokens), "
                         f"got shapes {a.shape} and {b.shape}")
    diff = b - a  # NLL(a) - NLL(b)
    return float(diff.mean()), float(diff.std(ddof=1) / math.sqrt(diff.size))


def verdict(change: float, stderr: float, noise: float = 2.0, clear: float = 4.0) -> str:
    """Words for a paired change of the mean NLL and its standard error: 'noise' when
    |change| < noise * stderr, 'worse' / 'better' when it exceeds clear * stderr, 'unclear'
    between (a band so that a rerun with other rounding cannot move a verdict across it
    unless the change itself moves by about a standard error)."""
    if stderr < 0 or noise <= 0 or clear < noise:
        raise ValueError(f"need stderr >= 0 and 0 < noise <= clear, got {stderr}, {noise}, {clear}")
    if abs(change) < noise * stderr:
        return "noise"
    if abs(change) > clear * stderr:
        return "worse" if change > 0 else "better"
    return "unclear"
