"""Chunked prefill: feed a prompt to the model a few tokens at a time.

A prompt of S tokens need not go through the model in one pass. Cut it into chunks of at most
C tokens; chunk j covers positions a..b-1 and runs `forward` on those b - a rows with the cache
that already holds positions 0..a-1. Its queries see every cached key plus the keys of the
chunk up to themselves, so the mask of a chunk is a rectangle with a triangle cut:

    rows    = b - a            (the chunk's queries)
    columns = b                (a cached keys + the chunk's own b - a keys)
    mask[i, j] = 0  if j <= a + i  else -inf        (= ops.causal_mask(b - a, b))

Every query sees exactly the keys it would see in a one-shot prefill, so the logits are the
same for every chunk size (up to float rounding); the cache ends up the same too.

    from tinydecoder import toy_model
    from tinydecoder.serving.chunked import prefill_chunked, chunk_masks
    run = prefill_chunked(toy_model(), [0, 1, 2, 3, 4], chunk_size=2)
    run.logits.shape        # (5, 6): one row per prompt position, as fast.forward() gives
    run.spans               # [(0, 2), (2, 4), (4, 5)]
    [m.shape for m in chunk_masks(5, 2)]   # [(2, 2), (2, 4), (1, 5)]
    run.bytes_read          # per chunk: every weight + K/V of positions 0..b-1 (chunk_bytes)

Chunking keeps the query-key pairs the same but not the memory traffic: every forward call
reads every weight again, and the K/V of every position before it. `chunk_bytes` counts it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import fast
from ..core.model import Model
from ..core.ops import causal_mask
from ..core.validate import check_token_ids, is_int
from ..decoding.generate import work_counts


def _check_chunk_size(chunk_size) -> int:
    if not is_int(chunk_size) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    return int(chunk_size)


def chunk_spans(n_tokens: int, chunk_size: int, start: int = 0) -> list:
    """[(a, b), ...]: the positions start..n_tokens-1 cut into chunks of at most chunk_size.

    Every chunk is full except perhaps the last: chunk_spans(5, 2) == [(0, 2), (2, 4), (4, 5)]."""
    chunk_size = _check_chunk_size(chunk_size)
    if not is_int(n_tokens) or n_tokens < 0:
        raise ValueError(f"n_tokens must be an integer >= 0, got {n_tokens!r}")
    if not 0 <= start <= n_tokens:
        raise ValueError(f"start must be in 0..{n_tokens} (the tokens to cut), got {start!r}")
    return [(a, min(a + chunk_size, int(n_tokens))) for a in range(int(start), int(n_tokens), chunk_size)]


def chunk_masks(n_tokens: int, chunk_size: int, past: int = 0, dtype=np.float32) -> list:
    """The additive mask of every chunk: chunk j is [b - a, b] (rows: its queries, columns:
    every position 0..b-1 it may look at), 0 where visible, -inf in the cut-off triangle.

    `past` positions already cached (e.g. by prefix reuse) are seen by every row."""
    return [causal_mask(b - a, b, dtype) for a, b in chunk_spans(past + n_tokens, chunk_size, start=past)]


def chunk_mask(start: int, n_tokens: int, dtype=np.float32) -> np.ndarray:
    """The additive mask of one chunk of n_tokens queries at positions start..start+n_tokens-1
    over keys 0..start+n_tokens-1 (start cached, then the chunk's own): [n_tokens, start + n_tokens],
    0 where key j <= the query's absolute position start + i, -inf after it."""
    for name, value, low in (("start", start, 0), ("n_tokens", n_tokens, 1)):
        if not is_int(value) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return causal_mask(int(n_tokens), int(start) + int(n_tokens), dtype)


def one_shot_mask_from_chunks(masks) -> np.ndarray:
    """Stack chunk masks (each padded with -inf on the right to the last one's width) into one
    [S, S] matrix: for chunks that start at position 0 it equals causal_mask(S, S)."""
    width = masks[-1].shape[1]
    rows = [np.pad(m, ((0, 0), (0, width - m.shape[1])), constant_values=-np.inf) for m in masks]
    return np.concatenate(rows, axis=0)


def chunk_bytes(model: Model, a: int, b: int) -> int:
    """Bytes the forward call of chunk (a, b) must read at least: every weight once, and K and
    V of the b positions its queries attend to (a cached + its own b - a) in every layer.
    For b = a + 1 this is a decode step after a cached positions (bench.decode_step_bytes)."""
    if not (isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)) and 0 <= a < b):
        raise ValueError(f"a chunk is (a, b) with integers 0 <= a < b, got ({a!r}, {b!r})")
    return int(model.nbytes + int(b) * model.config.kv_bytes_per_token(model.dtype.itemsize))


@dataclass
class ChunkedPrefill:
    logits: np.ndarray  # [S, V]: every prompt position's logits, chunk after chunk
    spans: list  # [(a, b)] the positions of each chunk
    cache: object  # the cache after the last chunk (holds past + S positions)
    score_pairs: list  # query-key pairs scored per chunk, summed over layers and query heads
    bytes_read: list = field(default_factory=list)  # per chunk: chunk_bytes(model, a, b)

    @property
    def last_logits(self) -> np.ndarray:
        return self.logits[-1]  # [V]: what picks the first generated token


def prefill_chunked(model: Model, prompt, chunk_size: int, cache=None) -> ChunkedPrefill:
    """Prefill `prompt` into `cache` (a new one when None) chunk by chunk, one forward call per
    chunk. Returns every position's logits [S, V] (equal to fast.forward(model, prompt) up to float
    rounding), the chunk spans, the filled cache and the work and bytes read of each chunk.

    A cache passed in may already hold a prefix (positions 0..past-1); `prompt` then holds only
    the tokens after it, and spans count from `past`."""
    cfg = model.config
    ids = check_token_ids(cfg, prompt)
    chunk_size = _check_chunk_size(chunk_size)
    if cache is None:
        cache = model.new_cache(capacity=len(ids))
    past = len(cache)
    spans = chunk_spans(past + len(ids), chunk_size, start=past)
    logits, pairs = [], []
    for a, b in spans:
        logits.append(fast.forward(model, ids[a - past:b - past], cache))  # [b - a, V]
        pairs.append(work_counts(cfg, a, b - a)[1])
    return ChunkedPrefill(np.concatenate(logits, axis=0), spans, cache, pairs,
                          [chunk_bytes(model, a, b) for a, b in spans])
