"""A radix-tree prefix cache that holds real K/V: SGLang's layout on a model of this library.

K and V live in one pool of token slots per layer ([capacity, Hkv, d]); the radix tree
(`radix.RadixCache`) maps cached token sequences to their slots, one slot per token. A prompt
is served by matching its longest cached prefix, gathering those slots' rows into a fresh
KVCache, and prefilling only the rest; when the request finishes, its new rows are written to
free slots and its sequence is inserted, so the next request can find it.

    store = RadixKVStore(model, capacity_tokens=2048)
    step = store.prefill(prompt)             # Prefill(logits [S - cached, V], cached, cache)
    ...                                      # decode with step.cache, if you like
    store.finish(step, output_tokens)        # cache prompt + output for later requests

The logits of the prefilled rows equal a one-shot forward pass over the whole prompt up to
float rounding: the cached rows were computed by a pass of another shape.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import fast
from ..core.cache import KVCache
from ..core.model import Model
from ..core.validate import check_token_ids, positive_int
from .radix import RadixCache, RadixNode


@dataclass
class Prefill:
    prompt: list  # token ids
    cached: int  # prompt tokens whose K/V came from the tree
    logits: np.ndarray  # [len(prompt) - cached, V]
    cache: KVCache  # holds every prompt position (decode may extend it)
    node: RadixNode  # the locked end of the matched prefix
    slots: np.ndarray  # slots of the cached prefix (cached,)


class RadixKVStore:
    """A token-slot KV pool with a radix tree over it (capacity_tokens slots in all)."""

    def __init__(self, model: Model, capacity_tokens: int):
        if not isinstance(model, Model):
            raise TypeError(f"model must be a tinydecoder Model, got {type(model).__name__}")
        self.model = model
        self.capacity = positive_int("capacity_tokens", capacity_tokens)
        cfg = model.config
        shape = (self.capacity, cfg.n_kv_heads, cfg.head_dim)
        self.k = [np.zeros(shape, model.dtype) for _ in range(cfg.n_layers)]
        self.v = [np.zeros(shape, model.dtype) for _ in range(cfg.n_layers)]
        self.free = list(range(self.capacity))  # free slots, lowest first
        self.tree = RadixCache(self.capacity)
        self.hit_tokens = 0

    def prefill(self, prompt) -> Prefill:
        """Prefill `prompt`, reusing its longest cached prefix (at least one token is computed)."""
        ids = [int(t) for t in check_token_ids(self.model.config, prompt)]
        match = self.tree.match_prefix(ids[:-1])
        self.tree.lock(match.node)
        slots = np.zeros(0, np.int64) if match.values is None else match.values.astype(np.int64)
        cache = self.model.new_cache(capacity=len(ids))
        for layer in range(self.model.config.n_layers):
            cache.append(layer, self.k[layer][slots], self.v[layer][slots])  # a gather, as a paged kernel avoids
        logits = fast.forward(self.model, ids[match.length:], cache)
        self.hit_tokens += match.length
        return Prefill(ids, match.length, logits, cache, match.node, slots)

    def finish(self, step: Prefill, output=()) -> int:
        """Cache the finished sequence (prompt + output tokens whose K/V are in step.cache) and
        release its prefix. Returns the tokens newly cached."""
        seq = step.prompt + [int(t) for t in output]
        if len(step.cache) < len(seq):
            raise ValueError(f"the cache holds {len(step.cache)} positions but prompt + output has "
                             f"{len(seq)}: feed every output token before finish")
        own = len(seq) - step.cached
        evicted = self.tree.make_room(own)
        if evicted.values is not None:
            self.free.extend(int(s) for s in evicted.values)
            self.free.sort()
        new = np.asarray(self.free[:own], np.int64)
        del self.free[:own]
        for layer in range(self.model.config.n_layers):
            self.k[layer][new] = step.cache.k[layer][step.cached:len(seq)]
            self.v[layer][new] = step.cache.v[layer][step.cached:len(seq)]
        self.tree.release_room(own)
        present = self.tree.insert(seq, np.concatenate([step.slots, new]))
        if present > step.cached:  # already in the tree: our copies of those rows go back
            self.free.extend(int(s) for s in new[:present - step.cached])
            self.free.sort()
        self.tree.unlock(step.node)
        return len(seq) - present
