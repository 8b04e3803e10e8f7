"""What a pass over every layer in ONE compiled call takes (`fused.run_layers`): the layers' blocks,
and each layer's K and V rows of the cache, as numba typed lists, made once and kept.

A compiled call checks the type of every argument it is given, and for a tuple of 30 layers'
blocks (each a NamedTuple of arrays and tuples) that costs ~90 us, as much as calling once a layer
did (~18 us a layer in a SmolLM2 Q4_1 decode step, 13% of it: the Python between the calls runs
from memory after each layer's weights have streamed through the caches). A typed list is checked
in ~1 us whatever it holds, but filling one from Python costs ~1.5 us an item, so both lists are
kept (timings: 2 vCPUs of an AMD EPYC, Zen 5, December 2026; docs/fast_path.md):

- `blocks(model, kind, make)`: the list of `make(config, layer)` over the model's layers, kept per model
  and kind while the layers' weights are the same objects (checked each pass, ~5 us);
- `layer_rows(cache, rows, stop)`: the cache's rows for the pass in layers 0 .. stop-1 (taken: a
  KVCache's `reserve`, a paged sequence's `layer_rows`; no copy, no gather), and the lists of their
  K and V arrays, kept per cache (a KVCache) or pool (a paged sequence's) while its arrays are the
  same (a KVCache's change when it grows).
"""
from __future__ import annotations

import weakref
from operator import is_

from ..core.cache import KVCache
from .compiled import few_queries

_by_model = {}  # id(model) -> (weakref to it, its weights when kept, {kind: typed list, or None})
_by_cache = weakref.WeakKeyDictionary()  # KVCache or pool -> (the arrays, typed list of K, of V)


def _weights(model) -> list:
    """Every array or matrix the blocks are made of, and the config they are shaped by."""
    return [model.config] + [a for w in model.layers
                             for a in (w.w_qkv, w.wo, w.w_gate_up, w.w_down, w.attn_norm, w.ffn_norm)]


def blocks(model, kind, make):
    """A numba typed list of make(config, layer) for each of the model's layers, kept per model
    and kind; None (kept too) where one is None (that layer does not fit) or the blocks are not
    all of one numba type."""
    weights = _weights(model)
    kept = _by_model.get(id(model))
    if kept is None or kept[0]() is not model:  # this model's first pass: forget it when it goes
        weakref.finalize(model, _by_model.pop, id(model), None)
        kept = None
    if kept is None or not all(map(is_, weights, kept[1])):  # new, or a layer's weight replaced
        kept = _by_model[id(model)] = (weakref.ref(model), weights, {})
    if kind not in kept[2]:
        kept[2][kind] = _typed_list([make(model.config, w) for w in model.layers])
    return kept[2][kind]


def _typed_list(items):
    """items as a numba typed List, or None if one is None or their numba types differ."""
    import numba
    from numba.typed import List

    if not items or any(item is None for item in items):
        return None
    kind = numba.typeof(items[0])
    if any(numba.typeof(item) != kind for item in items[1:]):
        return None
    out = List.empty_list(kind)
    for item in items:
        out.append(item)
    return out


def layer_rows(cache, rows: int, stop: int) -> tuple:
    """`rows` new positions in layers 0 .. stop-1 of `cache` (a KVCache, or a paged sequence:
    `layer_rows` over a range), taken -> (typed list of the K arrays, of the V arrays, block table,
    block, first new position): position t of layer l in row table[t // block] * block + t % block
    of ks[l] and vs[l] (few_queries._row; a KVCache's table is [0], its arrays one block)."""
    if type(cache) is KVCache:
        ks, vs = [], []
        for l in range(stop):
            k, v, start = cache.reserve(l, rows)
            ks.append(k)
            vs.append(v)
        table, block, owner = few_queries.ONE_BLOCK, min(k.shape[0] for k in ks), cache
    else:
        ks, vs, table, block, start = cache.layer_rows(range(stop), rows)
        owner = cache.pool
    arrays = ks + vs
    kept = _by_cache.get(owner)
    if kept is None or len(kept[0]) != len(arrays) or not all(map(is_, arrays, kept[0])):
        kept = _by_cache[owner] = (arrays, _typed_list(ks), _typed_list(vs))
    return kept[1], kept[2], table, block, start
