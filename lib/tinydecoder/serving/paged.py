"""A paged KV cache: fixed-size blocks in one preallocated pool, shared by many sequences.

A contiguous cache reserves one long array per request. A paged cache cuts every
sequence's K/V rows into blocks of `block_size` positions; the blocks live in one pool per
layer (K and V each [n_blocks, block_size, Hkv, d]), and each sequence keeps a *block
table*: logical block i (positions i*B .. i*B+B-1) lives in physical block table[i].

    pool  = PagedKVPool(model.config, n_blocks=64, block_size=4, dtype=model.dtype)
    # or:   PagedKVPool.for_model(model, n_blocks=64, block_size=4)

    seq   = pool.new_sequence()                  # an empty sequence: no blocks yet
    logits = forward(model, prompt, seq)         # seq is the `cache` argument (duck typing)
    logits = forward(model, [next_id], seq)      # blocks are taken on demand, one per B positions
    seq.block_table                              # (7, 3, ...) physical block of each logical block
    len(seq), seq.waste                          # positions held; allocated slots - positions

    child = seq.fork()                           # shares every block (reference count + 1)
    forward(model, [other_id], child)            # copy-on-write: the shared last block is copied
    seq.release(); child.release()               # reclaim: blocks go back to the free list at
                                                 # reference count 0 (release twice is a no-op)
    forward_batch(model, [ids_a, ids_b], [seq_a, seq_b])   # several sequences, one pool

    pool.stats()                                 # PoolStats(blocks_used, blocks_free, tokens, waste, ...)

Prefix reuse. A *full* block is named by a hash chained over its parent block's hash and
its own token ids, so equal hashes mean equal prefixes up to the end of that block (and the
same K/V rows, since a position's K/V depend only on the tokens up to it). The pool keeps a
prefix index hash -> physical block. Tell a sequence its tokens and it registers each block
as soon as the block is full:

    seq = pool.new_sequence(prompt)              # reuses the longest cached full-block prefix
    seq.n_cached                                 # prompt tokens found (a multiple of block_size)
    forward(model, seq.pending_tokens, seq)      # prefill only the rest: prompt[seq.n_cached:]
    seq.add_tokens([next_id]); forward(model, [next_id], seq)   # decoded tokens, if they should
                                                 # be shareable too (optional)
    pool.match_prefix(prompt)                    # the block ids a new sequence would reuse (no side effects)

At least one prompt token is always left to prefill (its logits pick the next token), so at
most (len(prompt) - 1) // block_size blocks are reused. Hashes are only trusted when the
tokens fed match the tokens declared (`new_sequence(prompt)` / `add_tokens`).

What happens to a cached block when its last sequence releases it (`cache_freed_blocks`):
True (default, as vLLM does): it is free (counted in blocks_free, allocatable) but keeps its
contents and its index entry in an LRU list; a later prompt with that prefix takes it back;
a new allocation takes never-cached free blocks first, then evicts the least recently freed
cached block (its index entry is dropped). False: it is returned to the free list and
forgotten at once (prefix reuse then works only between sequences alive at the same time).

Appends never write into a block another sequence also holds: a block with reference count
> 1 is copied first (all layers), so sharing is invisible in the logits. Running out of
blocks raises `PoolExhaustedError` *before* anything is written; `seq.blocks_needed(n)` and
`seq.reserve(n)` let a scheduler check or take the blocks for n more positions in advance
(do that for every sequence of a batch before `forward_batch`, so that no sequence is left
half-written). `backends.PagedKV` adapts the pool to the scheduler's backend interface:

    backend = PagedKV(model, n_blocks=64, block_size=16, cache_prefixes=True)
    run_schedule(model, requests, backend=backend); backend.pool.stats()

Memory on a request workload, with no model (notebook 17): `lessons.memory_replay`.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..core.config import Config
from ..core.validate import positive_int
from .block_allocator import BlockAllocator
from .blocks import PoolExhaustedError, PoolStats, block_hash, block_hashes, check_new_rows, check_tokens  # noqa: F401
from .paged_sequence import PagedSequence


class PagedKVPool:
    """Preallocated K/V blocks for every layer, a free list, reference counts, a prefix index.

    k[l], v[l]: [n_blocks, block_size, Hkv, d] for layer l. Make sequences with
    `new_sequence()`; each works as the `cache` of `forward` / `forward_batch`."""

    def __init__(self, config: Config, n_blocks: int, block_size: int = 16, dtype=np.float32,
                 cache_freed_blocks: bool = True):
        if not isinstance(config, Config):
            raise TypeError(f"config must be a tinydecoder Config, got {type(config).__name__}")
        self.n_blocks = positive_int("n_blocks", n_blocks)
        self.block_size = positive_int("block_size", block_size)
        try:
            self.dtype = np.dtype(dtype)
        except TypeError:
            raise ValueError(f"dtype must be a numpy floating-point type, got {dtype!r}") from None
        if self.dtype.kind != "f":
            raise ValueError(f"dtype must be a floating-point type, got {self.dtype}")
        self.config = config
        self.cache_freed_blocks = bool(cache_freed_blocks)
        shape = (self.n_blocks, self.block_size, config.n_kv_heads, config.head_dim)
        self.k = [np.zeros(shape, self.dtype) for _ in range(config.n_layers)]  # L x [N, B, Hkv, d]
        self.v = [np.zeros(shape, self.dtype) for _ in range(config.n_layers)]
        rows = (self.n_blocks * self.block_size, config.n_kv_heads, config.head_dim)
        self._rows = [(k.reshape(rows), v.reshape(rows)) for k, v in zip(self.k, self.v)]  # `layer_rows`' views
        self.blocks = BlockAllocator(self.n_blocks, self.block_size)  # free list and reference counts
        self.fill = np.zeros(self.n_blocks, np.int64)  # rows written in each block
        self.cached_free = OrderedDict()  # block -> None: free (parked) but cached, least recently freed first
        self.prefix_index = {}  # hash -> block
        self.block_hash = {}  # block -> hash (blocks in the prefix index)
        self.sequences = {}  # seq_id -> live PagedSequence
        self.prefix_hit_tokens = 0
        self.copies = 0  # copy-on-write copies made
        self._next_id = 0

    @classmethod
    def for_model(cls, model, n_blocks: int, block_size: int = 16, **kwargs) -> PagedKVPool:
        return cls(model.config, n_blocks, block_size, model.dtype, **kwargs)

    # --------------------------------------------------------------------- blocks
    @property
    def refcount(self) -> np.ndarray:
        """[n_blocks] holders of each block (the allocator's counts)."""
        return self.blocks.refcount

    @property
    def free_list(self) -> list:
        """Never-cached free blocks, in the order they will be taken."""
        return self.blocks.free_list

    @property
    def blocks_free(self) -> int:
        return len(self.free_list) + len(self.cached_free)

    @property
    def blocks_used(self) -> int:
        return int(np.count_nonzero(self.refcount))

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.config.kv_bytes_per_token(self.dtype.itemsize)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole preallocated pool (K and V, every layer)."""
        return self.n_blocks * self.bytes_per_block

    def _check_available(self, needed: int, what: str) -> None:
        if needed > self.blocks_free:
            raise PoolExhaustedError(
                f"KV block pool exhausted: {what} needs {needed} new block(s) but only "
                f"{self.blocks_free} of {self.n_blocks} are free (block_size {self.block_size}, "
                f"{len(self.sequences)} live sequences). Release finished sequences or make a larger pool.")

    def _allocate(self) -> int:
        if self.free_list:
            block = self.blocks.take()
        elif self.cached_free:
            block, _ = self.cached_free.popitem(last=False)  # evict the least recently freed
            self._unregister(block)
            self.blocks.revive(block)
        else:  # callers check first; this is a guard
            self._check_available(1, "an allocation")
        self.fill[block] = 0
        return block

    def _incref(self, block: int) -> None:
        if self.refcount[block] == 0:
            self.cached_free.pop(block)  # a cached free block comes back to life
            self.blocks.revive(block)
        else:
            self.blocks.share(block)

    def _decref(self, block: int) -> bool:
        """Drop one reference; True when the block became free (parked among the cached free
        blocks when it holds a cached prefix, else back on the free list)."""
        cached = block in self.block_hash and self.cache_freed_blocks
        if not self.blocks.drop(block, park=cached):
            return False
        if cached:
            self.cached_free[block] = None
        else:
            self._unregister(block)
            self.fill[block] = 0
        return True

    def _unregister(self, block: int) -> None:
        h = self.block_hash.pop(block, None)
        if h is not None:
            del self.prefix_index[h]

    def _register(self, block: int, h: str) -> None:
        if h not in self.prefix_index and block not in self.block_hash:
            self.prefix_index[h] = block
            self.block_hash[block] = h

    def _copy_block(self, src: int) -> int:
        dst = self._allocate()
        for store in (self.k, self.v):
            for layer_blocks in store:
                layer_blocks[dst] = layer_blocks[src]
        self.fill[dst] = self.fill[src]
        self.copies += 1
        return dst

    # ------------------------------------------------------------------ sequences
    def new_sequence(self, prompt=None) -> PagedSequence:
        """A new sequence. With a prompt, it starts holding the longest cached full-block prefix
        of the prompt (at most (len(prompt) - 1) // block_size blocks) and knows its tokens, so
        its own blocks are registered for later requests. Prefill `seq.pending_tokens` next."""
        seq = self._new(PagedSequence(self, self._next_id))
        if prompt is not None:
            tokens = check_tokens(self.config, prompt)
            hits = self.match_prefix(tokens)
            for block in hits:
                self._incref(block)
            n = len(hits) * self.block_size
            seq.block_table, seq.lengths, seq.tokens, seq.n_cached = list(hits), [n] * self.config.n_layers, tokens, n
            seq.hashes = block_hashes(tokens[:n], self.block_size)
            self.prefix_hit_tokens += n
        return seq

    def _new(self, seq: PagedSequence) -> PagedSequence:
        self._next_id += 1
        self.sequences[seq.seq_id] = seq
        return seq

    def match_prefix(self, prompt) -> list:
        """Physical blocks holding the longest cached full-block prefix of `prompt`, leaving at
        least one token to prefill. Changes nothing."""
        tokens = check_tokens(self.config, prompt)
        usable = (len(tokens) - 1) // self.block_size
        hits = []
        for h in block_hashes(tokens[:usable * self.block_size], self.block_size):
            block = self.prefix_index.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def _live(self, seq: PagedSequence) -> None:
        if not isinstance(seq, PagedSequence) or self.sequences.get(seq.seq_id) is not seq:
            raise ValueError(f"{seq!r} is not a live sequence of this pool; make one with pool.new_sequence()")

    def append(self, seq: PagedSequence, layer: int, k_new, v_new):
        """Write S new rows of `layer` into `seq`'s blocks (taking new blocks, or copying a shared
        one, as needed); return that layer's K, V for all T positions, [T, Hkv, d] each."""
        expect = check_new_rows(self.config, k_new, v_new)  # (Hkv, d)
        k, v, table, B, start = self.layer_rows(seq, layer, k_new.shape[0])
        end = start + k_new.shape[0]
        pos = np.arange(start, end)
        rows = table[pos // B] * B + pos % B
        k[rows], v[rows] = k_new, v_new
        used = table[:-(-end // B)]
        k_all = self.k[layer][used].reshape(len(used) * B, *expect)[:end]  # [T, Hkv, d] (a gather)
        v_all = self.v[layer][used].reshape(len(used) * B, *expect)[:end]
        return k_all, v_all

    def layer_rows(self, seq: PagedSequence, layer, n_new: int):
        """`append` for a pass that writes the K and V rows itself, before anything else reads the
        pool (`fast.fused`): blocks taken or copied, the length grown, no write, no gather ->
        (k, v, table, block_size, start): the layer's blocks as rows [n_blocks * block_size, Hkv, d],
        position t in row table[t // block_size] * block_size + t % block_size; the first new one.
        `layer` may be a range of layers that hold as many positions (a pass running them in one
        call): their bookkeeping at once, and k and v as lists of their rows."""
        self._live(seq)
        layers = range(layer, layer + 1) if isinstance(layer, (int, np.integer)) else layer
        L = self.config.n_layers
        if not (isinstance(layers, range) and layers.step == 1 and 0 <= layers.start < layers.stop <= L):
            raise ValueError(f"layer must be in 0..{L - 1} (or a range of them), got {layer!r}")
        if not (isinstance(n_new, (int, np.integer)) and n_new >= 0):
            raise ValueError(f"n_new must be a number of new positions >= 0, got {n_new!r}")
        start, B = seq.lengths[layers.start], self.block_size
        if any(seq.lengths[l] != start for l in layers):
            raise ValueError(f"{layers} of sequence {seq.seq_id} hold different numbers of positions: {seq.lengths}")
        end = start + int(n_new)
        self._make_writable(seq, start, end)
        for i in range(start // B, -(-end // B)):  # each block written: rows up to the last new one
            self.fill[seq.block_table[i]] = max(self.fill[seq.block_table[i]], min(end - i * B, B))
        seq.lengths[layers.start:layers.stop] = [end] * len(layers)
        if layers.stop == L:
            self._register_full_blocks(seq)
        table = np.asarray(seq.block_table, np.int64)
        k, v = [self._rows[l][0] for l in layers], [self._rows[l][1] for l in layers]
        return (k, v, table, B, start) if layers is layer else (k[0], v[0], table, B, start)

    def _blocks_for(self, seq: PagedSequence, start: int, end: int):
        """(new blocks, shared logical blocks to copy) that writing positions start..end-1 needs."""
        if end <= start:
            return 0, []
        last = (end - 1) // self.block_size
        new = max(0, last + 1 - len(seq.block_table))
        shared = [i for i in range(start // self.block_size, min(last + 1, len(seq.block_table)))
                  if self.refcount[seq.block_table[i]] > 1]
        return new, shared

    def _make_writable(self, seq: PagedSequence, start: int, end: int) -> None:
        new, shared = self._blocks_for(seq, start, end)
        if new or shared:
            self._check_available(new + len(shared), f"sequence {seq.seq_id} (positions {start}..{end - 1}: "
                                                     f"{new} new, {len(shared)} copy-on-write)")
        for i in shared:  # copy-on-write: this sequence gets its own copy; the others keep theirs
            old = seq.block_table[i]
            seq.block_table[i] = self._copy_block(old)
            self._decref(old)
        for _ in range(new):
            seq.block_table.append(self._allocate())

    def blocks_needed(self, seq: PagedSequence, n_new: int) -> int:
        """Blocks the pool must hand out to append `n_new` more positions to `seq` (new + copy-on-write)."""
        n = len(seq)
        new, shared = self._blocks_for(seq, n, n + int(n_new))
        return new + len(shared)

    def reserve(self, seq: PagedSequence, n_new: int) -> None:
        """Take now the blocks for `n_new` more positions of `seq` (raises PoolExhaustedError,
        changing nothing, if there are too few). Do it for every sequence of a batch before
        forward_batch so that a full pool never stops a pass half-way."""
        self._live(seq)
        n = len(seq)
        self._make_writable(seq, n, n + int(n_new))

    def _register_full_blocks(self, seq: PagedSequence) -> None:
        """Put each full block of `seq` whose tokens are known into the prefix index (once)."""
        if any(n != seq.lengths[0] for n in seq.lengths):
            return
        B = self.block_size
        full = min(seq.lengths[0], len(seq.tokens)) // B
        while len(seq.hashes) < full:
            i = len(seq.hashes)
            h = block_hash(seq.hashes[-1] if seq.hashes else None, seq.tokens[i * B:(i + 1) * B])
            seq.hashes.append(h)
            self._register(seq.block_table[i], h)

    def add_tokens(self, seq: PagedSequence, token_ids) -> None:
        """Declare the token ids of `seq`'s next positions (e.g. each decoded token fed), so that
        blocks they fill can be reused by later prompts. Optional."""
        self._live(seq)
        seq.tokens.extend(check_tokens(self.config, token_ids))
        self._register_full_blocks(seq)

    def fork(self, seq: PagedSequence) -> PagedSequence:
        """A second sequence with the same contents as `seq`, sharing every block (no copy yet)."""
        self._live(seq)
        n = len(seq)
        child = self._new(PagedSequence(self, self._next_id, list(seq.block_table), [n] * self.config.n_layers,
                                        list(seq.tokens), 0, list(seq.hashes)))
        for block in child.block_table:
            self._incref(block)
        return child

    def release(self, seq: PagedSequence) -> int:
        """Give every block of `seq` back (reference count - 1; at 0 a block is free again).
        Returns the number of blocks that became free. Releasing twice is a no-op."""
        if seq.released:
            return 0
        self._live(seq)
        freed = sum(self._decref(block) for block in seq.block_table)
        seq.block_table, seq.lengths, seq.released = [], [0] * self.config.n_layers, True
        del self.sequences[seq.seq_id]
        return freed

    def truncate(self, seq: PagedSequence, length: int) -> None:
        """Forget every position of `seq` from `length` on (blocks past it are released). Also
        repairs a sequence left inconsistent by an interrupted pass: truncate(min(seq.lengths))."""
        self._live(seq)
        if not 0 <= length <= min(seq.lengths):
            raise ValueError(f"cannot truncate paged sequence {seq.seq_id} (lengths {seq.lengths}) to {length}")
        B = self.block_size
        keep = -(-length // B)
        for block in seq.block_table[keep:]:
            self._decref(block)
        seq.block_table = seq.block_table[:keep]
        if length % B and keep:  # the last block becomes partial: it no longer names a full prefix
            last = seq.block_table[-1]
            if self.refcount[last] == 1:
                self._unregister(last)
                self.fill[last] = length % B
        seq.lengths = [length] * self.config.n_layers
        seq.hashes = seq.hashes[:length // B]
        seq.tokens = seq.tokens[:length]  # declared tokens past it are dropped too

    # ---------------------------------------------------------------------- views
    def stats(self) -> PoolStats:
        used = self.refcount > 0
        slots = int(used.sum()) * self.block_size
        filled = int(self.fill[used].sum())
        return PoolStats(
            n_blocks=self.n_blocks, block_size=self.block_size, blocks_used=int(used.sum()),
            blocks_free=self.blocks_free, blocks_cached_free=len(self.cached_free),
            blocks_shared=int(np.count_nonzero(self.refcount > 1)), sequences=len(self.sequences),
            tokens=sum(len(s) for s in self.sequences.values()), slots=slots, filled_slots=filled,
            waste=slots - filled, prefix_hit_tokens=self.prefix_hit_tokens)

    def block_table_matrix(self, sequences=None) -> np.ndarray:
        """[n_sequences, max logical blocks] physical block ids, -1 where a sequence has none
        (for a heatmap). Default: the live sequences, oldest first."""
        seqs = list(self.sequences.values()) if sequences is None else list(sequences)
        width = max([len(s.block_table) for s in seqs] + [1])
        out = np.full((len(seqs), width), -1, np.int64)
        for i, s in enumerate(seqs):
            out[i, :len(s.block_table)] = s.block_table
        return out

    def __repr__(self) -> str:
        return (f"PagedKVPool(n_blocks={self.n_blocks}, block_size={self.block_size}, "
                f"used={self.blocks_used}, free={self.blocks_free}, sequences={len(self.sequences)})")
