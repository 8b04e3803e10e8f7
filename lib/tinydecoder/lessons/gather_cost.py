"""What attention over a paged cache costs here (notebook 17): our `forward` asks a paged
sequence for each layer's K and V, and the sequence answers by gathering its blocks into one
contiguous [T, Hkv, d] copy (numpy fancy indexing). A paged-attention kernel (vLLM's) never
makes that copy: it reads each block's rows from the pool through the block table inside the
attention loop, as the fast path does on float32 models with numba when a block holds a multiple
of 8 positions (`fast.paged_reads`: a pass over a few rows copies nothing). `GatherCount` wraps
a sequence and counts the bytes of those copies.

    seq = GatherCount(pool.new_sequence())      # use it wherever the sequence was used
    forward(model, prompt, seq)
    seq.copied, seq.written                     # bytes gathered (K and V of every position, every
                                                # layer, every call), bytes of new rows written
"""
from __future__ import annotations

import numpy as np


class GatherCount:
    """A paged sequence with counters: every attribute is the sequence's, and `append` also adds
    the bytes of the K and V it returns to `copied` (when they are copies, not views of the
    pool) and the bytes of the new rows to `written`; `calls` counts the appends."""

    def __init__(self, seq):
        self.seq = seq
        self.copied = 0
        self.written = 0
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.seq, name)

    def __len__(self) -> int:
        return len(self.seq)

    def append(self, layer, k_new, v_new):
        k_all, v_all = self.seq.append(layer, k_new, v_new)
        pool = self.seq.pool
        for out, store in ((k_all, pool.k[layer]), (v_all, pool.v[layer])):
            if not np.shares_memory(out, store):
                self.copied += out.nbytes
        self.written += np.asarray(k_new).nbytes + np.asarray(v_new).nbytes
        self.calls += 1
        return k_all, v_all

    def __repr__(self) -> str:
        return f"GatherCount({self.seq!r}, copied={self.copied}, written={self.written})"


def gather_bytes(kv_bytes_per_token: int, positions) -> int:
    """Bytes one forward pass gathers: K and V of every position of every sequence, in every
    layer (kv_bytes_per_token already counts K and V of all layers) = sum(positions) x that."""
    return int(kv_bytes_per_token) * int(np.sum(positions))
