"""The KV cache: each layer's keys and values of every position already seen."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from .config import Config
from .validate import layer_index


@runtime_checkable
class Cache(Protocol):
    """What a forward pass needs of a cache (KVCache, QuantizedKVCache, SinkCache, a paged
    sequence): its length, a check that it suits the model, and per-layer appends that return
    the layer's keys and values for every visible position."""

    def __len__(self) -> int: ...

    def check(self, config: Config, dtype) -> None: ...

    def append(self, layer: int, k_new, v_new): ...


_CACHE_METHODS = ("__len__", "check", "append")  # what isinstance(x, Cache) asks of x (check_cache asks it
# directly: Python 3.11's isinstance against a Protocol costs ~4 us, a step's pass asks once)


def common_length(lengths, what: str, remedy: str) -> int:
    """The number of positions every layer holds; a clear error if the layers disagree."""
    first = lengths[0]
    if any(n != first for n in lengths):
        raise ValueError(f"{what} is inconsistent: per-layer lengths {lengths} differ. Every layer "
                         f"must hold the same positions; {remedy}.")
    return first


def check_made_for(what: str, made_for: Config, holds, config: Config, dtype, remedy: str) -> None:
    """Raise unless a cache made for (made_for, holds dtype) may serve a model (config, dtype)."""
    if config is not made_for and config != made_for:
        diff = {f: (getattr(made_for, f), getattr(config, f)) for f in config.to_dict()
                if getattr(made_for, f) != getattr(config, f)}
        raise ValueError(f"{what} was made for another model: config fields differ ({what}, model): "
                         f"{diff}. {remedy}.")
    if dtype is not None and np.dtype(dtype) != holds:
        raise ValueError(f"{what} holds {holds} but the model computes in {np.dtype(dtype)}; {remedy}.")


class LayerKV:
    """One layer of a cache, as a decoder block sees it: `append(k, v)` stores this layer's new
    rows and returns all of them. Works over any cache with `append(layer, k, v)`."""

    def __init__(self, cache, index: int, config: Config):
        self.cache, self.index, self.config = cache, index, config

    def append(self, k_new, v_new):
        return self.cache.append(self.index, k_new, v_new)  # [T, Hkv, d] each


def check_cache(cache, config: Config, dtype):
    """`cache` if it can serve a model (config, dtype); a clear error otherwise."""
    if not all(hasattr(cache, name) for name in _CACHE_METHODS):  # isinstance(cache, Cache), asked directly
        raise TypeError(f"cache must be a KV cache (a KVCache, a paged sequence, ... with __len__, check and "
                        f"append) or None, got {type(cache).__name__}")
    cache.check(config, dtype)
    return cache


class HeldBytes:
    """`nbytes` and `allocated_nbytes` of a cache whose K and V are per-layer arrays in `self.k`
    and `self.v` (rows = positions), with a `config`, a `dtype` and a length."""

    @property
    def nbytes(self) -> int:
        """Bytes of the K and V rows held: len * 2 * L * Hkv * d * itemsize."""
        return len(self) * self.config.kv_bytes_per_token(self.dtype.itemsize)

    @property
    def allocated_nbytes(self) -> int:
        """Bytes reserved, including rows not holding a position yet."""
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)


class KVCache(HeldBytes):
    """Per layer, K and V of shape [T, Hkv, d], stored after RoPE (when the model uses it).

    Storage is preallocated and grows geometrically (doubling), so appending one decode
    step's row is O(1) amortised instead of copying the whole cache every step. The cache
    remembers the config it was made for and refuses to serve a model of another shape."""

    def __init__(self, config: Config, dtype=np.float32, capacity: int = 16):
        self.config = config
        self.dtype = np.dtype(dtype)
        capacity = max(1, min(int(capacity), config.max_context))
        shape = (capacity, config.n_kv_heads, config.head_dim)
        self.k = [np.zeros(shape, self.dtype) for _ in range(config.n_layers)]  # L x [cap, Hkv, d]
        self.v = [np.zeros(shape, self.dtype) for _ in range(config.n_layers)]
        self.lengths = [0] * config.n_layers  # filled rows per layer

    def __len__(self) -> int:
        """Positions held (the same in every layer; a cache whose layers disagree is broken)."""
        return common_length(self.lengths, "KV cache", "rebuild the cache (e.g. prefill again)")

    def check(self, config: Config, dtype=None) -> None:
        """Raise unless this cache was made for `config` (and `dtype`, when given)."""
        check_made_for("KV cache", self.config, self.dtype, config, dtype,
                       "make a new cache for this model with model.new_cache()")

    def layer(self, index: int) -> LayerKV:
        """Layer `index` of this cache, for `decoder_block`."""
        return LayerKV(self, layer_index(index, self.config.n_layers), self.config)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[0]

    def append(self, layer: int, k_new, v_new):
        """Store S new rows for `layer`; return that layer's K, V for all T positions (views)."""
        layer = layer_index(layer, self.config.n_layers)
        n, start = k_new.shape[0], self.lengths[layer]
        end = start + n
        capacity = self.k[layer].shape[0]
        if end > capacity:  # double (never past the context limit): O(1) amortised per row
            self._grow(layer, max(end, min(2 * capacity, self.config.max_context)))
        self.k[layer][start:end] = k_new
        self.v[layer][start:end] = v_new
        self.lengths[layer] = end
        return self.k[layer][:end], self.v[layer][:end]  # [T, Hkv, d]

    def reserve(self, layer: int, n: int):
        """Hold n more positions in `layer` and return (k, v, start): the layer's whole arrays
        [capacity, Hkv, d] (grown if needed) and the first of the n rows the caller must fill
        (`fast.fused` writes them from compiled code). Like `append`, without the copy."""
        layer = layer_index(layer, self.config.n_layers)
        start = self.lengths[layer]
        end = start + n
        if end > self.k[layer].shape[0]:
            if end > self.config.max_context:
                raise ValueError(f"{end} positions do not fit the context of {self.config.max_context}")
            self._grow(layer, max(end, min(2 * self.k[layer].shape[0], self.config.max_context)))
        self.lengths[layer] = end
        return self.k[layer], self.v[layer], start

    def _grow(self, layer: int, capacity: int) -> None:
        for store in (self.k, self.v):
            old = store[layer]
            new = np.zeros((capacity,) + old.shape[1:], self.dtype)
            new[: self.lengths[layer]] = old[: self.lengths[layer]]
            store[layer] = new

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (e.g. to branch from a shared prompt)."""
        if not 0 <= length <= len(self):
            raise ValueError(f"cannot truncate a cache of {len(self)} positions to {length}")
        self.lengths = [length] * self.config.n_layers

    def copy(self, extra: int = 0) -> KVCache:
        """An independent copy, with room for `extra` more positions before it must grow."""
        other = KVCache(self.config, self.dtype, capacity=max(1, len(self) + extra))
        for layer in range(self.config.n_layers):
            n = self.lengths[layer]
            other.k[layer][:n], other.v[layer][:n] = self.k[layer][:n], self.v[layer][:n]
        other.lengths = list(self.lengths)
        return other
