"""Grouped-query attention, looked at head by head (notebook 05).

Hq query heads share Hkv key/value heads: query head h reads KV head h // (Hq // Hkv).
Hkv = Hq is multi-head attention (MHA), Hkv = 1 multi-query attention (MQA), anything in
between grouped-query attention (GQA). The KV cache stores only the Hkv heads, so it shrinks
by the group size; the queries, and so the heads' outputs, stay different.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..core.config import Config
from ..core.model import Model
from ..core.reference import decoder_block, layer_input
from ..core.validate import is_int, layer_index


def divisors(n: int) -> list:
    """The KV-head counts a model with n query heads can have: the divisors of n."""
    if not is_int(n) or n < 1:
        raise ValueError(f"the number of query heads must be a positive integer, got {n!r}")
    return [k for k in range(1, int(n) + 1) if n % k == 0]


def kv_head_map(n_heads: int, n_kv_heads: int) -> np.ndarray:
    """[Hq] ints: the KV head each query head reads, h // (Hq // Hkv)."""
    allowed = divisors(n_heads)
    if n_kv_heads not in allowed:
        raise ValueError(f"n_kv_heads must divide n_heads={n_heads} (each KV head serves the same "
                         f"number of query heads); allowed: {allowed}, got {n_kv_heads!r}")
    return np.arange(n_heads) // (n_heads // n_kv_heads)


def attention_kind(n_heads: int, n_kv_heads: int) -> str:
    """'MHA' (one KV head per query head), 'MQA' (one KV head in all) or 'GQA' (in between)."""
    kv_head_map(n_heads, n_kv_heads)  # validates
    if n_kv_heads == n_heads:
        return "MHA"
    return "MQA" if n_kv_heads == 1 else "GQA"


def with_kv_heads(config: Config, n_kv_heads: int) -> Config:
    """The same model shape with another number of KV heads (everything else unchanged)."""
    kv_head_map(config.n_heads, n_kv_heads)
    return dataclasses.replace(config, n_kv_heads=int(n_kv_heads))


def kv_cache_table(config: Config, itemsize: int = 4) -> list:
    """One row per possible KV-head count of `config`'s query heads, MHA first:
    kind, n_kv_heads, group (query heads per KV head), bytes_per_token, fraction of MHA's."""
    rows = []
    mha = with_kv_heads(config, config.n_heads).kv_bytes_per_token(itemsize)
    for n_kv in reversed(divisors(config.n_heads)):
        nbytes = with_kv_heads(config, n_kv).kv_bytes_per_token(itemsize)
        rows.append({"kind": attention_kind(config.n_heads, n_kv), "n_kv_heads": n_kv,
                     "group": config.n_heads // n_kv, "bytes_per_token": nbytes,
                     "fraction_of_mha": nbytes / mha})
    return rows


def layer_qkv(model: Model, token_ids, layer: int = 0):
    """Queries, keys and values of one layer for a prompt run from scratch (no cache).

    Returns q [S, Hq, d], k [S, Hkv, d], v [S, Hkv, d] exactly as that layer of `forward`
    computes them (after RoPE, when the model uses it): the earlier layers run first."""
    layer = layer_index(layer, model.config.n_layers)
    x = layer_input(model, token_ids, layer)  # [S, D]
    seen = {}
    decoder_block(model.layers[layer], x, np.arange(len(x)), model.new_cache(len(x)).layer(layer), record=seen)
    return seen["q"], seen["k"], seen["v"]


def split_heads(out, n_heads: int):
    """Attention output [S, Hq*d] -> [Hq, S, d]: one block per query head."""
    S, width = out.shape
    if width % n_heads:
        raise ValueError(f"output width {width} is not a multiple of n_heads={n_heads}")
    return out.reshape(S, n_heads, width // n_heads).transpose(1, 0, 2)
