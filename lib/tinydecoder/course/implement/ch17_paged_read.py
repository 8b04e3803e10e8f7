"""Chapter 17's second exercise: one decode query's attention, read through a block table.

    paged_decode_attention(q [Hq, d], pool_k, pool_v, block_table, length) -> [Hq, d]

pool_k, pool_v: [n_blocks, B, Hkv, d], one layer's pool shared by every sequence. The sequence's
positions 0..length-1 lie in its logical blocks 0, 1, ...: logical block i (positions i*B ..
i*B+B-1) is the pool's physical block block_table[i]. Only the first length - i*B rows of the
last block hold positions; the rest of it (and every block not in the table) is someone else's
data. The query sits at position length - 1 and sees every position; query head h reads KV
head h // (Hq / Hkv); scores are scaled by 1/sqrt(d). The library's answer:
`algorithms.paged_attention.paged_decode_attention`.
"""
from __future__ import annotations

import numpy as np

from ...algorithms.paged_attention import paged_decode_attention
from ...core import ops
from .case import Case
from .compare import keeps_float32, rng, same


def _setup(seed, length, B=4, Hq=4, Hkv=2, d=8, spare=3, shuffle=True, dtype=np.float64):
    r = rng(seed)
    n = -(-length // B)
    table = r.permutation(n + spare)[:n] if shuffle else np.arange(n)
    k_seq, v_seq = (r.standard_normal((length, Hkv, d)).astype(dtype) for _ in range(2))
    pool_k, pool_v = ((r.standard_normal((n + spare, B, Hkv, d)) * 30).astype(dtype) for _ in range(2))
    for pool, seq in ((pool_k, k_seq), (pool_v, v_seq)):
        for i, b in enumerate(table):
            rows = seq[i * B:(i + 1) * B]
            pool[b, :len(rows)] = rows
    q = r.standard_normal((Hq, d)).astype(dtype)
    want = ops.attention(q[None], k_seq, v_seq).reshape(Hq, d)  # contiguous K/V: the answer
    return (q, pool_k, pool_v, [int(b) for b in table], length), want


def _check(fn, seed, length, **kw) -> bool:
    args, want = _setup(seed, length, **kw)
    return same(fn(*args), want)


PAGED_DECODE_ATTENTION = [
    Case("shape [Hq, d]", "one query row per head comes out",
         lambda fn: np.shape(fn(*_setup(170, 8)[0])) == (4, 8)),
    Case("blocks in order, every block full", "visit the logical blocks 0, 1, ... of the table; scale "
         "by 1/sqrt(d); head h reads KV head h // (Hq / Hkv)",
         lambda fn: _check(fn, 171, 8, shuffle=False, spare=0)),
    Case("a partly filled last block", "the last block holds only length - i*B positions; its other rows "
         "are someone else's", lambda fn: _check(fn, 172, 10, shuffle=False, spare=0)),
    Case("a shuffled block table", "logical block i lies in physical block block_table[i], wherever that "
         "is in the pool", lambda fn: _check(fn, 173, 8, spare=4)),
    Case("one position", "length 1: a single row of one block", lambda fn: _check(fn, 174, 1, spare=2)),
    Case("blocks of one position", "B = 1: every position its own block",
         lambda fn: _check(fn, 175, 6, B=1)),
    Case("random pools vs the library", "compare with algorithms.paged_attention.paged_decode_attention",
         lambda fn: same(fn(*_setup(176, 23, B=5, Hq=6, Hkv=3)[0]),
                         paged_decode_attention(*_setup(176, 23, B=5, Hq=6, Hkv=3)[0]))),
    Case("float32 in, float32 out", "keep the pool's dtype",
         lambda fn: keeps_float32(fn(*_setup(177, 9, dtype=np.float32)[0])) and _check(fn, 177, 9, dtype=np.float32)),
]

EXERCISES = {"paged_decode_attention": PAGED_DECODE_ATTENTION}
REFERENCES = {"paged_decode_attention": paged_decode_attention}
