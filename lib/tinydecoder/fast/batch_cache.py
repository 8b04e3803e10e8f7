"""The fast path's batched KV cache: B sequences of equal length, stored [B, Hkv, T, d] per
layer, so that `fast.forward_batch` attends over all B in one call per layer instead of B.

    caches = [cache_a, cache_b]                      # KVCache each, same length
    batched = BatchKVCache.stack(caches)             # copies them side by side
    forward_batch(model, [[id_a], [id_b]], batched)  # one decode step for both
    batched.sequence(1)                              # sequence 1 as a KVCache again
"""
from __future__ import annotations

import numpy as np

from ..core.cache import KVCache, check_made_for, common_length
from ..core.config import Config
from ..core.validate import is_int


class BatchKVCache:
    """B sequences that always hold the same number of positions: per layer K and V of shape
    [B, Hkv, capacity, d], so that attention over all B runs as one batched matmul.

    It is the `caches` argument of `forward_batch` (one object for the whole batch); every
    call must feed each sequence the same number of new tokens."""

    def __init__(self, config: Config, dtype=np.float32, batch: int = 1, capacity: int = 16):
        if not is_int(batch) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        self.config, self.dtype, self.batch = config, np.dtype(dtype), int(batch)
        capacity = max(1, min(int(capacity), config.max_context))
        shape = (self.batch, config.n_kv_heads, capacity, config.head_dim)
        self.k = [np.zeros(shape, self.dtype) for _ in range(config.n_layers)]  # L x [B, Hkv, cap, d]
        self.v = [np.zeros(shape, self.dtype) for _ in range(config.n_layers)]
        self.lengths = [0] * config.n_layers

    @classmethod
    def stack(cls, caches, extra: int = 16) -> BatchKVCache:
        """One batched cache holding a copy of each per-sequence cache (all of equal length),
        with room for `extra` more positions."""
        caches = list(caches)
        if not caches:
            raise ValueError("stack needs at least one cache")
        lengths = [len(c) for c in caches]
        if len(set(lengths)) != 1:
            raise ValueError(f"a BatchKVCache holds sequences of equal length; got lengths {lengths}")
        first = caches[0]
        out = cls(first.config, first.dtype, len(caches), lengths[0] + extra)
        for layer in range(first.config.n_layers):
            for b, c in enumerate(caches):
                k, v = c.k[layer][:lengths[0]], c.v[layer][:lengths[0]]  # [T, Hkv, d]
                out.k[layer][b, :, :lengths[0]] = k.transpose(1, 0, 2)
                out.v[layer][b, :, :lengths[0]] = v.transpose(1, 0, 2)
        out.lengths = [lengths[0]] * first.config.n_layers
        return out

    def __len__(self) -> int:
        return common_length(self.lengths, "batched KV cache", "rebuild the cache")

    def check(self, config: Config, dtype=None) -> None:
        check_made_for("batched KV cache", self.config, self.dtype, config, dtype,
                       "make a new BatchKVCache for this model")

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def append(self, layer: int, k_new, v_new):
        """k_new, v_new: [B, S, Hkv, d]; return K, V for all T positions, [B, Hkv, T, d] (views)."""
        start = self.lengths[layer]
        end, capacity = start + k_new.shape[1], self.k[layer].shape[2]
        if end > capacity:  # double (never past the context limit)
            grown = max(end, min(2 * capacity, self.config.max_context))
            for store in (self.k, self.v):
                new = np.zeros(store[layer].shape[:2] + (grown,) + store[layer].shape[3:], self.dtype)
                new[:, :, :start] = store[layer][:, :, :start]
                store[layer] = new
        self.k[layer][:, :, start:end] = k_new.transpose(0, 2, 1, 3)
        self.v[layer][:, :, start:end] = v_new.transpose(0, 2, 1, 3)
        self.lengths[layer] = end
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def truncate(self, length: int) -> None:
        if not 0 <= length <= len(self):
            raise ValueError(f"cannot truncate a cache of {len(self)} positions to {length}")
        self.lengths = [length] * self.config.n_layers

    def sequence(self, b: int) -> KVCache:
        """Sequence b's positions as an ordinary KVCache (a copy)."""
        T = len(self)
        out = KVCache(self.config, self.dtype, capacity=max(1, T))
        for layer in range(self.config.n_layers):
            out.k[layer][:T] = self.k[layer][b, :, :T].transpose(1, 0, 2)
            out.v[layer][:T] = self.v[layer][b, :, :T].transpose(1, 0, 2)
        out.lengths = [T] * self.config.n_layers
        return out
