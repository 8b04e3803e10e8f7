"""The pieces a paged KV cache is made of: chained block hashes (prefix reuse), pool statistics,
the error a full pool raises."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..core.config import Config
from ..core.validate import check_token_ids


class PoolExhaustedError(RuntimeError):
    """The block pool has fewer free blocks than an append (or reserve) needs."""


def block_hash(parent: str | None, tokens) -> str:
    """The name of a full block: sha256 over the parent block's hash and this block's token
    ids, cut to 16 hex digits (64 bits: a collision is astronomically unlikely here)."""
    h = hashlib.sha256((parent or "root").encode())
    h.update(np.asarray(list(tokens), dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def block_hashes(tokens, block_size: int) -> list:
    """Chained hashes of the full blocks of `tokens` (a trailing partial block has none)."""
    tokens = list(tokens)
    hashes, parent = [], None
    for i in range(len(tokens) // block_size):
        parent = block_hash(parent, tokens[i * block_size:(i + 1) * block_size])
        hashes.append(parent)
    return hashes


@dataclass(frozen=True)
class PoolStats:
    n_blocks: int
    block_size: int
    blocks_used: int  # reference count > 0
    blocks_free: int  # allocatable: never-cached free blocks + cached_free
    blocks_cached_free: int  # free but still holding a cached prefix block (LRU, reusable)
    blocks_shared: int  # reference count > 1
    sequences: int  # live (not released) sequences
    tokens: int  # positions held, summed over live sequences (shared ones counted per sequence)
    slots: int  # blocks_used * block_size
    filled_slots: int  # rows written in used blocks (a shared block counted once)
    waste: int  # slots - filled_slots: allocated rows holding no position
    prefix_hit_tokens: int  # prompt tokens reused from the prefix index, since the pool was made

    def to_dict(self) -> dict:
        return dict(vars(self))


def check_tokens(config: Config, token_ids) -> list:
    return [int(t) for t in check_token_ids(config, token_ids)]


def check_new_rows(config: Config, k_new, v_new) -> tuple:
    """Raise unless k_new and v_new are S new rows of K and V, [S, Hkv, d] each -> (Hkv, d)."""
    expect = (config.n_kv_heads, config.head_dim)
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        if np.ndim(x) != 3 or tuple(np.shape(x)[1:]) != expect or np.shape(x)[0] != np.shape(k_new)[0]:
            raise ValueError(f"{name} must have shape [S, {expect[0]}, {expect[1]}] (S new rows, "
                             f"Hkv, head_dim), the same S for K and V; got {np.shape(x)}")
    return expect
