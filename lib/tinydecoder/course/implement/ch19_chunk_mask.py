"""Chapter 19's exercise: the attention mask of one prefill chunk over cached positions.

    chunk_mask(start, n_tokens) -> [n_tokens, start + n_tokens]

The chunk's queries sit at positions start .. start + n_tokens - 1; the keys are positions
0 .. start + n_tokens - 1 (start of them cached, then the chunk's own). Entry [i, j] is 0 where
query i may see key j and -inf where key j is after it. The library's answer:
`serving.chunked.chunk_mask`.
"""
from __future__ import annotations

import numpy as np

from ...serving.chunked import chunk_mask
from .case import Case
from .compare import as_array


def _mask(fn, start, n) -> np.ndarray:
    out = as_array(fn(start, n), "the mask")
    if out.shape != (n, start + n):
        raise ValueError(f"returned shape {out.shape}, expected (n_tokens, start + n_tokens) = {(n, start + n)}")
    return out


def _visible(mask) -> np.ndarray:
    return np.asarray(mask) == 0


def _matches(fn, start, n) -> bool:
    return bool(np.array_equal(_visible(_mask(fn, start, n)), _visible(chunk_mask(start, n))))


def _only_zero_and_minus_inf(fn) -> bool:
    m = _mask(fn, 3, 4).astype(np.float64)
    return bool(np.all((m == 0) | (m == -np.inf))) and bool(np.any(m == -np.inf))


CHUNK_MASK = [
    Case("shape [n_tokens, start + n_tokens]", "one row per query of the chunk, one column per key: the "
         "cached ones and the chunk's own", lambda fn: _mask(fn, 2, 3) is not None),
    Case("the first chunk (nothing cached)", "with start = 0 this is the ordinary causal mask",
         lambda fn: _matches(fn, 0, 5)),
    Case("every cached key is visible", "a query in the chunk comes after every cached position",
         lambda fn: bool(_visible(_mask(fn, 6, 3))[:, :6].all())),
    Case("a chunk after cached positions", "compare the key's position with the query's position in the "
         "whole sequence, not its index inside the chunk", lambda fn: _matches(fn, 5, 4)),
    Case("a decode step (one query)", "a single new token sees every key, itself included",
         lambda fn: _matches(fn, 9, 1)),
    Case("hidden keys are -inf, visible ones 0", "the mask is added to the scores before the softmax: 0 keeps "
         "a score, -inf removes it", _only_zero_and_minus_inf),
    Case("random chunks vs the library", "compare with serving.chunked.chunk_mask",
         lambda fn: all(_matches(fn, s, n) for s, n in ((3, 7), (16, 16), (1, 2), (30, 5)))),
]

EXERCISES = {"chunk_mask": CHUNK_MASK}
REFERENCES = {"chunk_mask": chunk_mask}
