"""Attention that reads a paged KV cache where it lies, through the block table, as a
paged-attention kernel (vLLM's PagedAttention) does, instead of first gathering the blocks into
one contiguous K/V copy (what `PagedSequence.append` hands the reference forward pass).

    out = paged_attention(q, pool_k, pool_v, block_table, length)    # [S, Hq, d]

q holds the queries of the last S of `length` positions; pool_k and pool_v are one layer's
pool, [n_blocks, B, Hkv, d]; logical block i of the sequence (positions i*B .. i*B+B-1) is
physical block block_table[i]. The loop visits the logical blocks in order, reads each one's
rows as a view of the pool (no copy), scores them, and folds them into a running softmax (the
online softmax of FlashAttention, `flash.online_update`). The result is causal grouped-query
attention, equal to `ops.attention` on the gathered K/V up to float rounding.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.ops import heads_per_kv
from ..core.validate import is_int
from .flash import online_update


def paged_attention(q, pool_k, pool_v, block_table, length: int):
    """Causal GQA of q [S, Hq, d] (the last S of `length` positions) over the sequence's K/V in
    pool_k, pool_v [n_blocks, B, Hkv, d], read block by block through `block_table`.
    Returns [S, Hq, d]."""
    q, pool_k, pool_v = np.asarray(q), np.asarray(pool_k), np.asarray(pool_v)
    if q.ndim != 3 or pool_k.ndim != 4 or pool_k.shape != pool_v.shape or pool_k.shape[3] != q.shape[2]:
        raise ValueError(f"paged_attention needs q [S, Hq, d] and pools [n_blocks, B, Hkv, d] of one shape; "
                         f"got q {q.shape}, pool_k {pool_k.shape}, pool_v {pool_v.shape}")
    S, Hq, d = q.shape
    n_blocks, B, Hkv, _ = pool_k.shape
    n_rep = heads_per_kv(Hq, Hkv)
    if not is_int(length) or not S <= length:
        raise ValueError(f"length must be an integer >= the {S} queries, got {length!r}")
    table = [int(b) for b in block_table]
    used = -(-int(length) // B)
    if len(table) < used or any(not 0 <= b < n_blocks for b in table[:used]):
        raise ValueError(f"{length} positions need {used} blocks in the table, each in 0..{n_blocks - 1}; "
                         f"got {table}")
    # query head h reads KV head h // n_rep: group the query rows by KV head, [Hkv, n_rep * S, d]
    qg = (q * q.dtype.type(1 / math.sqrt(d))).transpose(1, 0, 2).reshape(Hkv, n_rep * S, d)
    q_pos = np.tile(np.arange(length - S, length), n_rep)[:, None]  # [n_rep * S, 1] each row's position
    m = np.full((Hkv, n_rep * S, 1), -np.inf, q.dtype)
    row_sum = np.zeros((Hkv, n_rep * S, 1), q.dtype)
    acc = np.zeros((Hkv, n_rep * S, d), q.dtype)
    for i in range(used):
        n = min(B, length - i * B)  # rows of this block that hold positions
        k_block = pool_k[table[i], :n]  # [n, Hkv, d]: a view of the pool, nothing copied
        v_block = pool_v[table[i], :n]
        scores = qg @ k_block.transpose(1, 2, 0)  # [Hkv, n_rep * S, n]
        future = (i * B + np.arange(n))[None, :] > q_pos  # a key after the query: masked
        scores = np.where(future, -np.inf, scores)
        m, row_sum, acc, _ = online_update(m, row_sum, acc, scores, v_block.transpose(1, 0, 2))
    out = acc / row_sum  # every query sees at least itself, so row_sum > 0
    return out.reshape(Hkv, n_rep, S, d).reshape(Hq, S, d).transpose(1, 0, 2)


def paged_decode_attention(q, pool_k, pool_v, block_table, length: int):
    """One decode query q [Hq, d] at position length - 1 over the `length` positions that
    `block_table` maps into pool_k, pool_v [n_blocks, B, Hkv, d].  -> [Hq, d]"""
    q = np.asarray(q)
    if q.ndim != 2:
        raise ValueError(f"paged_decode_attention needs one query, q [Hq, d]; got shape {q.shape}")
    return paged_attention(q[None], pool_k, pool_v, block_table, length)[0]
