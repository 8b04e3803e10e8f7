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
half-written). `PagedKV` adapts the pool to `tinydecoder.scheduler`'s backend interface:

    backend = PagedKV(model, n_blocks=64, block_size=16, cache_prefixes=True)
    run_schedule(model, requests, backend=backend); backend.pool.stats()

Memory on a request trace (notebook 09), no model needed: `request_trace(n, seed=...)` makes
seeded requests (arrival, prompt length, output length, limit); `trace_memory(trace, B)` replays
them through a real pool and through contiguous reservation (positions held, reserved, slots in
blocks, block tables and a slot map per step); `first_fit_replay(trace, slots)` and
`paged_replay(trace, n_blocks, B)` replay them in a fixed memory (rejections, fragmentation).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from ..core.cache import check_made_for, common_length
from ..core.config import Config


class PoolExhaustedError(RuntimeError):
    """The block pool has fewer free blocks than an append (or reserve) needs."""


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


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


class PagedKVPool:
    """Preallocated K/V blocks for every layer, a free list, reference counts, a prefix index.

    k[l], v[l]: [n_blocks, block_size, Hkv, d] for layer l. Make sequences with
    `new_sequence()`; each works as the `cache` of `forward` / `forward_batch`."""

    def __init__(self, config: Config, n_blocks: int, block_size: int = 16, dtype=np.float32,
                 cache_freed_blocks: bool = True):
        if not isinstance(config, Config):
            raise TypeError(f"config must be a tinydecoder Config, got {type(config).__name__}")
        self.n_blocks = _positive_int("n_blocks", n_blocks)
        self.block_size = _positive_int("block_size", block_size)
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
        self.refcount = np.zeros(self.n_blocks, np.int64)
        self.fill = np.zeros(self.n_blocks, np.int64)  # rows written in each block
        self.free_list = deque(range(self.n_blocks))  # never-cached free blocks, lowest id first
        self.cached_free = OrderedDict()  # block -> None: free but cached, least recently freed first
        self.prefix_index = {}  # hash -> block
        self.block_hash = {}  # block -> hash (blocks in the prefix index)
        self.sequences = {}  # seq_id -> live PagedSequence
        self.prefix_hit_tokens = 0
        self.copies = 0  # copy-on-write copies made
        self._next_id = 0

    @classmethod
    def for_model(cls, model, n_blocks: int, block_size: int = 16, **kwargs) -> "PagedKVPool":
        return cls(model.config, n_blocks, block_size, model.dtype, **kwargs)

    # --------------------------------------------------------------------- blocks
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
            block = self.free_list.popleft()
        elif self.cached_free:
            block, _ = self.cached_free.popitem(last=False)  # evict the least recently freed
            self._unregister(block)
        else:  # callers check first; this is a guard
            self._check_available(1, "an allocation")
        self.refcount[block] = 1
        self.fill[block] = 0
        return block

    def _incref(self, block: int) -> None:
        if self.refcount[block] == 0:
            self.cached_free.pop(block)  # a cached free block comes back to life
        self.refcount[block] += 1

    def _decref(self, block: int) -> bool:
        """Drop one reference; True when the block became free."""
        self.refcount[block] -= 1
        if self.refcount[block] > 0:
            return False
        if block in self.block_hash and self.cache_freed_blocks:
            self.cached_free[block] = None
        else:
            self._unregister(block)
            self.fill[block] = 0
            self.free_list.append(block)
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
    def new_sequence(self, prompt=None) -> "PagedSequence":
        """A new sequence. With a prompt, it starts holding the longest cached full-block prefix
        of the prompt (at most (len(prompt) - 1) // block_size blocks) and knows its tokens, so
        its own blocks are registered for later requests. Prefill `seq.pending_tokens` next."""
        seq = PagedSequence(self, self._next_id)
        self._next_id += 1
        if prompt is not None:
            tokens = _check_tokens(self.config, prompt)
            hits = self.match_prefix(tokens)
            for block in hits:
                self._incref(block)
            n = len(hits) * self.block_size
            seq.block_table = list(hits)
            seq.lengths = [n] * self.config.n_layers
            seq.tokens = tokens
            seq.n_cached = n
            seq._hashes = block_hashes(tokens[:n], self.block_size)
            self.prefix_hit_tokens += n
        self.sequences[seq.seq_id] = seq
        return seq

    def match_prefix(self, prompt) -> list:
        """Physical blocks holding the longest cached full-block prefix of `prompt`, leaving at
        least one token to prefill. Changes nothing."""
        tokens = _check_tokens(self.config, prompt)
        usable = (len(tokens) - 1) // self.block_size
        hits = []
        for h in block_hashes(tokens[:usable * self.block_size], self.block_size):
            block = self.prefix_index.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

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


def _check_tokens(config: Config, token_ids) -> list:
    from ..core.model import check_token_ids  # late import: model imports nothing from here
    return [int(t) for t in check_token_ids(config, token_ids)]


class PagedSequence:
    """One sequence's view of a pool: a block table and per-layer lengths. Use it as the
    `cache` argument of forward / forward_batch (it has check, __len__ and append)."""

    def __init__(self, pool: PagedKVPool, seq_id: int):
        self.pool = pool
        self.seq_id = seq_id
        self.config = pool.config
        self.dtype = pool.dtype
        self.block_table = []  # logical block i -> physical block
        self.lengths = [0] * pool.config.n_layers
        self.tokens = []  # token ids declared for positions 0.. (for prefix hashing)
        self.n_cached = 0  # positions taken from the prefix index at creation
        self.released = False
        self._hashes = []  # chained hashes of full blocks already registered (or tried)

    # ----------------------------------------------------------- cache interface
    def __len__(self) -> int:
        return common_length(self.lengths, f"paged sequence {self.seq_id}",
                             "truncate(min(lengths)) or release it and prefill again")

    def check(self, config: Config, dtype=None) -> None:
        """Raise unless this sequence's pool was made for `config` (and `dtype`, when given)."""
        self._check_live()
        check_made_for("paged KV pool", self.config, self.dtype, config, dtype,
                       "make a pool for this model with PagedKVPool.for_model(model, n_blocks, block_size)")

    def append(self, layer: int, k_new, v_new):
        """Write S new rows of `layer` into this sequence's blocks (taking new blocks, or copying a
        shared one, as needed); return that layer's K, V for all T positions, [T, Hkv, d] each."""
        self._check_live()
        cfg, B = self.config, self.pool.block_size
        if not (isinstance(layer, (int, np.integer)) and 0 <= layer < cfg.n_layers):
            raise ValueError(f"layer must be in 0..{cfg.n_layers - 1}, got {layer!r}")
        expect = (cfg.n_kv_heads, cfg.head_dim)
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if np.ndim(x) != 3 or tuple(np.shape(x)[1:]) != expect or np.shape(x)[0] != np.shape(k_new)[0]:
                raise ValueError(f"{name} must have shape [S, {expect[0]}, {expect[1]}] (S new rows, "
                                 f"Hkv, head_dim), the same S for K and V; got {np.shape(x)}")
        start = self.lengths[layer]
        end = start + k_new.shape[0]
        self._make_writable(start, end)
        pos = np.arange(start, end)
        table = np.asarray(self.block_table, np.int64)
        blocks, rows = table[pos // B], pos % B
        self.pool.k[layer][blocks, rows] = k_new
        self.pool.v[layer][blocks, rows] = v_new
        if end > start:
            np.maximum.at(self.pool.fill, blocks, rows + 1)
        self.lengths[layer] = end
        if layer == cfg.n_layers - 1:
            self._register_full_blocks()
        n_blocks = -(-end // B)
        used = table[:n_blocks]
        k_all = self.pool.k[layer][used].reshape(n_blocks * B, *expect)[:end]  # [T, Hkv, d] (a gather)
        v_all = self.pool.v[layer][used].reshape(n_blocks * B, *expect)[:end]
        return k_all, v_all

    # ------------------------------------------------------------------ blocks
    def _blocks_for(self, start: int, end: int):
        """(new blocks, shared blocks to copy) that writing positions start..end-1 needs."""
        if end <= start:
            return 0, []
        B = self.pool.block_size
        last = (end - 1) // B
        new = max(0, last + 1 - len(self.block_table))
        shared = [i for i in range(start // B, min(last + 1, len(self.block_table)))
                  if self.pool.refcount[self.block_table[i]] > 1]
        return new, shared

    def _make_writable(self, start: int, end: int) -> None:
        new, shared = self._blocks_for(start, end)
        if new or shared:
            self.pool._check_available(new + len(shared), f"sequence {self.seq_id} (positions {start}..{end - 1}: "
                                                          f"{new} new, {len(shared)} copy-on-write)")
        for i in shared:  # copy-on-write: this sequence gets its own copy; the others keep theirs
            old = self.block_table[i]
            self.block_table[i] = self.pool._copy_block(old)
            self.pool._decref(old)
        for _ in range(new):
            self.block_table.append(self.pool._allocate())

    def blocks_needed(self, n_new: int) -> int:
        """Blocks the pool must hand out to append `n_new` more positions (new + copy-on-write)."""
        n = len(self)
        new, shared = self._blocks_for(n, n + int(n_new))
        return new + len(shared)

    def reserve(self, n_new: int) -> None:
        """Take now the blocks for `n_new` more positions (raises PoolExhaustedError, changing
        nothing, if the pool has too few). Call it for every sequence of a batch before
        forward_batch so that a full pool never stops a pass half-way."""
        self._check_live()
        n = len(self)
        self._make_writable(n, n + int(n_new))

    def _register_full_blocks(self) -> None:
        """Put each full block whose tokens are known into the prefix index (once)."""
        if any(n != self.lengths[0] for n in self.lengths):
            return
        B = self.pool.block_size
        full = min(self.lengths[0], len(self.tokens)) // B
        while len(self._hashes) < full:
            i = len(self._hashes)
            h = block_hash(self._hashes[-1] if self._hashes else None, self.tokens[i * B:(i + 1) * B])
            self._hashes.append(h)
            self.pool._register(self.block_table[i], h)

    def add_tokens(self, token_ids) -> None:
        """Declare the token ids of the next positions (e.g. each decoded token you feed), so
        that blocks they fill can be reused by later prompts. Optional."""
        self._check_live()
        self.tokens.extend(_check_tokens(self.config, token_ids))
        self._register_full_blocks()

    @property
    def pending_tokens(self) -> list:
        """Declared tokens not yet in the cache: after new_sequence(prompt), what to prefill."""
        return self.tokens[len(self):]

    # ------------------------------------------------------------ life cycle
    def fork(self) -> "PagedSequence":
        """A second sequence with the same contents, sharing every block (no copy yet)."""
        n = len(self)
        self._check_live()
        child = PagedSequence(self.pool, self.pool._next_id)
        self.pool._next_id += 1
        child.block_table = list(self.block_table)
        for block in child.block_table:
            self.pool._incref(block)
        child.lengths = [n] * self.config.n_layers
        child.tokens = list(self.tokens)
        child._hashes = list(self._hashes)
        self.pool.sequences[child.seq_id] = child
        return child

    def release(self) -> int:
        """Give every block back (reference count - 1; at 0 a block is free again). Returns the
        number of blocks that became free. A released sequence cannot be used again."""
        if self.released:
            return 0
        freed = sum(self.pool._decref(block) for block in self.block_table)
        self.block_table = []
        self.lengths = [0] * self.config.n_layers
        self.released = True
        self.pool.sequences.pop(self.seq_id, None)
        return freed

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (blocks past it are released). Also repairs a
        sequence left inconsistent by an interrupted forward pass: truncate(min(seq.lengths))."""
        self._check_live()
        if not 0 <= length <= min(self.lengths):
            raise ValueError(f"cannot truncate paged sequence {self.seq_id} (lengths {self.lengths}) to {length}")
        B = self.pool.block_size
        keep = -(-length // B)
        for block in self.block_table[keep:]:
            self.pool._decref(block)
        self.block_table = self.block_table[:keep]
        if length % B and keep:  # the last block becomes partial: it no longer names a full prefix
            last = self.block_table[-1]
            if self.pool.refcount[last] == 1:
                self.pool._unregister(last)
                self.pool.fill[last] = length % B
        self.lengths = [length] * self.config.n_layers
        self._hashes = self._hashes[:length // B]
        self.tokens = self.tokens[:length]  # declared tokens past it are dropped too

    def _check_live(self) -> None:
        if self.released:
            raise ValueError(f"paged sequence {self.seq_id} was released; make a new one with pool.new_sequence()")

    # ---------------------------------------------------------------- views
    @property
    def n_blocks(self) -> int:
        return len(self.block_table)

    @property
    def waste(self) -> int:
        """Slots of its blocks holding no position of it: block_table * B - len (< block_size)."""
        return len(self.block_table) * self.pool.block_size - len(self)

    @property
    def nbytes(self) -> int:
        return len(self) * self.config.kv_bytes_per_token(self.dtype.itemsize)

    def shared_blocks(self) -> list:
        """Logical block indices whose physical block another sequence (or the index) also holds."""
        return [i for i, b in enumerate(self.block_table) if self.pool.refcount[b] > 1]

    def __repr__(self) -> str:
        state = "released" if self.released else f"len={len(self)}, blocks={self.block_table}"
        return f"PagedSequence(id={self.seq_id}, {state})"


class PagedKV:
    """`tinydecoder.scheduler` backend over a PagedKVPool: blocks on demand, prefix reuse.

    Admission is conservative so that a running request never finds the pool empty (this
    engine does not preempt): a request is admitted when the free blocks, minus the blocks
    the running requests may still take, cover its worst case ceil(positions_needed / B)
    less the prefix blocks it reuses. Blocks are still taken only as positions are written,
    and a finished request's blocks are free at once."""

    def __init__(self, model, n_blocks: int, block_size: int = 16, cache_prefixes: bool = True,
                 cache_freed_blocks: bool = True):
        self.model = model
        self.pool = PagedKVPool.for_model(model, n_blocks, block_size, cache_freed_blocks=cache_freed_blocks)
        self.block_size = self.pool.block_size
        self.total_blocks = self.pool.n_blocks
        self.cache_prefixes = bool(cache_prefixes)
        self._worst = {}  # seq_id -> blocks its request may hold at most

    @property
    def used_blocks(self) -> int:
        return self.pool.blocks_used

    @property
    def free_blocks(self) -> int:
        return self.pool.blocks_free

    def _promised(self) -> int:
        seqs = self.pool.sequences
        return sum(max(0, w - len(seqs[i].block_table)) for i, w in self._worst.items())

    def _worst_blocks(self, request) -> int:
        return -(-request.positions_needed // self.block_size)

    def fits_empty(self, request) -> bool:
        return self._worst_blocks(request) <= self.total_blocks

    def can_admit(self, request) -> bool:
        hits = self.pool.match_prefix(request.prompt) if self.cache_prefixes else []
        revived = sum(1 for b in hits if self.pool.refcount[b] == 0)  # cached free blocks it takes back
        need = self._worst_blocks(request) - len(hits)
        return need <= self.pool.blocks_free - revived - self._promised()

    def admit(self, request):
        """-> (sequence, cached_tokens)."""
        if self.cache_prefixes:
            seq = self.pool.new_sequence(request.prompt)
        else:
            seq = self.pool.new_sequence()
        self._worst[seq.seq_id] = self._worst_blocks(request)
        return seq, seq.n_cached

    def prefilled(self, cache, prompt) -> None:
        """Blocks are registered as they fill (the sequence knows its prompt); nothing to do."""

    def release(self, cache) -> None:
        self._worst.pop(cache.seq_id, None)
        cache.release()


# ----------------------------------------------------------------------------------------
# Memory on a request trace: contiguous reservation vs paging (notebook 09)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TraceRequest:
    """A request of a memory trace. It arrives at step `arrival`; that step prefills its
    prompt, each later step decodes one token; it produces `output_len` tokens (it may stop
    early, before its limit `max_new_tokens`) and finishes after step arrival + output_len - 1.
    After step arrival + k its cache holds prompt_len + k positions."""

    rid: int
    arrival: int
    prompt_len: int
    output_len: int
    max_new_tokens: int

    @property
    def last_step(self) -> int:
        return self.arrival + self.output_len - 1

    @property
    def positions_needed(self) -> int:
        """What a contiguous cache must reserve: every position it could reach (its limit)."""
        return self.prompt_len + self.max_new_tokens - 1

    def length_at(self, step: int) -> int:
        """Positions held after `step` (0 before it arrives and after it finished)."""
        if not self.arrival <= step <= self.last_step:
            return 0
        return self.prompt_len + step - self.arrival


def request_trace(n_requests: int = 16, *, seed: int = 0, prompt_range=(2, 24), max_new_tokens: int = 24,
                  mean_gap: float = 1.5) -> list:
    """A seeded trace: arrivals with exponential gaps (mean `mean_gap` steps), prompt lengths
    uniform in prompt_range, outputs uniform in 1..max_new_tokens (a stop token ends most early)."""
    n_requests = _positive_int("n_requests", n_requests)
    max_new_tokens = _positive_int("max_new_tokens", max_new_tokens)
    lo, hi = prompt_range
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
        raise ValueError(f"prompt_range must be (low, high) with 1 <= low <= high, got {prompt_range!r}")
    if not mean_gap >= 0:
        raise ValueError(f"mean_gap must be >= 0, got {mean_gap!r}")
    rng = np.random.default_rng(seed)
    arrivals = np.floor(np.cumsum(rng.exponential(mean_gap, n_requests))).astype(int)
    arrivals -= arrivals[0]
    prompts = rng.integers(lo, hi + 1, n_requests)
    outputs = rng.integers(1, max_new_tokens + 1, n_requests)
    return [TraceRequest(i, int(a), int(p), int(o), max_new_tokens)
            for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]


def _trace_config(max_context: int) -> Config:
    """The smallest model shape: a pool of it costs nothing; only the block bookkeeping matters."""
    return Config(vocab_size=2, d_model=1, n_heads=1, n_kv_heads=1, head_dim=1, n_layers=1, d_ff=1,
                  max_context=max(1, max_context), name="trace")


@dataclass
class TraceMemory:
    """Per step (after the step ran): positions held, contiguous reservation, paged slots.

    tokens[t]       positions held by the running requests
    reserved[t]     slots reserved by a contiguous cache (each running request: `reserve`)
    paged_slots[t]  slots of the blocks the paged pool handed out
    seq_waste[t]    the largest (allocated - held) of one sequence in the paged pool (< block_size)
    tables[t]       [n_requests, max logical blocks] physical block per logical block, -1: none
    pool_map[t]     [n_blocks * block_size] 0 free, 1 allocated but empty, 2 holding a position"""

    block_size: int
    n_blocks: int
    steps: np.ndarray
    tokens: np.ndarray
    reserved: np.ndarray
    paged_slots: np.ndarray
    seq_waste: np.ndarray
    tables: list
    pool_map: np.ndarray

    @property
    def contiguous_waste(self) -> np.ndarray:
        return self.reserved - self.tokens

    @property
    def paged_waste(self) -> np.ndarray:
        return self.paged_slots - self.tokens

    def summary(self) -> dict:
        """Totals over the trace (slot-steps) and peaks; waste as a share of what was allocated."""
        busy = self.tokens > 0
        return {
            "steps": int(busy.sum()),
            "peak_tokens": int(self.tokens.max()),
            "peak_reserved": int(self.reserved.max()),
            "peak_paged_slots": int(self.paged_slots.max()),
            "contiguous_waste_share": round(float(self.contiguous_waste.sum() / max(1, self.reserved.sum())), 4),
            "paged_waste_share": round(float(self.paged_waste.sum() / max(1, self.paged_slots.sum())), 4),
            "max_seq_waste": int(self.seq_waste.max()),
        }


def trace_memory(trace, block_size: int, reserve: int | None = None, n_blocks: int | None = None) -> TraceMemory:
    """Replay `trace` step by step through a real PagedKVPool (of `n_blocks`; default: enough
    for every request at once) and through contiguous reservation (`reserve` slots per
    request: default each request's own positions_needed; pass e.g. the model's max_context
    for the cruder scheme). Every request runs as it arrives (no admission control): a pool
    too small for that raises PoolExhaustedError."""
    block_size = _positive_int("block_size", block_size)
    trace = list(trace)
    if not trace:
        raise ValueError("the trace has no requests")
    last = max(r.last_step for r in trace)
    most = max(r.positions_needed for r in trace)
    if n_blocks is None:
        n_blocks = sum(-(-r.positions_needed // block_size) for r in trace)  # never exhausted
    pool = PagedKVPool(_trace_config(most), n_blocks, block_size)
    zeros = np.zeros((most, 1, 1), np.float32)
    width = -(-most // block_size)
    seqs, rows = {}, {k: [] for k in ("tokens", "reserved", "slots", "seq_waste")}
    tables, maps = [], []
    for step in range(last + 1):
        for r in trace:
            if r.arrival == step:
                seqs[r.rid] = pool.new_sequence()
                seqs[r.rid].append(0, zeros[:r.prompt_len], zeros[:r.prompt_len])
            elif r.arrival < step <= r.last_step:
                seqs[r.rid].append(0, zeros[:1], zeros[:1])
        live = [r for r in trace if r.arrival <= step <= r.last_step]
        rows["tokens"].append(sum(r.length_at(step) for r in live))
        rows["reserved"].append(sum(r.positions_needed if reserve is None else reserve for r in live))
        rows["slots"].append(pool.stats().slots)
        rows["seq_waste"].append(max([seqs[r.rid].waste for r in live], default=0))
        table = np.full((len(trace), width), -1, np.int64)
        for r in live:
            table[r.rid, :seqs[r.rid].n_blocks] = seqs[r.rid].block_table
        tables.append(table)
        used = pool.refcount > 0
        filled = np.arange(block_size)[None, :] < pool.fill[:, None]  # [n_blocks, B]
        maps.append(np.where(used[:, None], np.where(filled, 2, 1), 0).reshape(-1))
        for r in live:
            if r.last_step == step:
                seqs.pop(r.rid).release()
    return TraceMemory(block_size, n_blocks, np.arange(last + 1), np.array(rows["tokens"]),
                       np.array(rows["reserved"]), np.array(rows["slots"]), np.array(rows["seq_waste"]),
                       tables, np.array(maps))


class ContiguousArena:
    """A memory of `n_slots` positions handed out in contiguous ranges, first fit (the lowest
    hole that is large enough). Freed ranges leave holes: external fragmentation."""

    def __init__(self, n_slots: int):
        self.n_slots = _positive_int("n_slots", n_slots)
        self.ranges = {}  # start -> (size, owner)

    def holes(self) -> list:
        """Free ranges as (start, size), in address order."""
        out, pos = [], 0
        for start in sorted(self.ranges):
            if start > pos:
                out.append((pos, start - pos))
            pos = start + self.ranges[start][0]
        if pos < self.n_slots:
            out.append((pos, self.n_slots - pos))
        return out

    @property
    def free_slots(self) -> int:
        return self.n_slots - sum(size for size, _ in self.ranges.values())

    @property
    def largest_hole(self) -> int:
        return max((size for _, size in self.holes()), default=0)

    def allocate(self, size: int, owner=None):
        """Start of a range of `size` slots (first fit), or None when no hole is large enough."""
        size = _positive_int("size", size)
        for start, hole in self.holes():
            if hole >= size:
                self.ranges[start] = (size, owner)
                return start
        return None

    def free(self, start: int) -> None:
        if start not in self.ranges:
            raise ValueError(f"no range starts at slot {start}")
        del self.ranges[start]

    def owner_map(self) -> np.ndarray:
        """[n_slots] owner of each slot, -1 where free."""
        out = np.full(self.n_slots, -1, np.int64)
        for start, (size, owner) in self.ranges.items():
            out[start:start + size] = -2 if owner is None else owner
        return out


def first_fit_replay(trace, arena_slots: int, reserve: int | None = None) -> dict:
    """Replay the trace's arrivals and finishes in a contiguous arena of `arena_slots`: each
    arriving request reserves its range first fit or is rejected. Returns the rejections
    (with the free slots and the largest hole at that moment: a rejection with enough free
    slots but no hole large enough is fragmentation) and, per step, free slots, largest hole
    a slot map `maps` (request id per slot, -1 free) and `states` (0 free, 1 reserved but
    empty, 2 holding a position)."""
    arena = ContiguousArena(arena_slots)
    trace = list(trace)
    last = max(r.last_step for r in trace)
    where, rejected, free, largest, maps, states = {}, [], [], [], [], []
    for step in range(last + 1):
        for r in trace:
            if r.arrival == step:
                need = r.positions_needed if reserve is None else reserve
                start = arena.allocate(need, r.rid)
                if start is None:
                    rejected.append({"rid": r.rid, "step": step, "need": need, "free": arena.free_slots,
                                     "largest_hole": arena.largest_hole,
                                     "fragmentation": arena.free_slots >= need})
                else:
                    where[r.rid] = start
        free.append(arena.free_slots)
        largest.append(arena.largest_hole)
        maps.append(arena.owner_map())
        state = np.where(maps[-1] >= 0, 1, 0)  # 0 free, 1 reserved but empty, 2 holding a position
        for r in trace:
            if r.rid in where:
                state[where[r.rid]:where[r.rid] + r.length_at(step)] = 2
        states.append(state)
        for r in trace:
            if r.last_step == step and r.rid in where:
                arena.free(where.pop(r.rid))
    return {"admitted": len(trace) - len(rejected), "rejected": rejected, "free": np.array(free),
            "largest_hole": np.array(largest), "maps": np.array(maps), "states": np.array(states)}


def paged_replay(trace, n_blocks: int, block_size: int) -> dict:
    """The same replay through a PagedKVPool of `n_blocks`: a request is admitted when the free
    blocks cover its prompt's blocks, then takes blocks as it grows. Returns the rejected ids
    and whether any running request ever found the pool empty (`exhausted`)."""
    trace = list(trace)
    most = max(r.positions_needed for r in trace)
    pool = PagedKVPool(_trace_config(most), n_blocks, block_size)
    zeros = np.zeros((most, 1, 1), np.float32)
    seqs, rejected, exhausted, free = {}, [], [], []
    for step in range(max(r.last_step for r in trace) + 1):
        for r in trace:
            try:
                if r.arrival == step:
                    seq = pool.new_sequence()
                    try:
                        seq.append(0, zeros[:r.prompt_len], zeros[:r.prompt_len])
                        seqs[r.rid] = seq
                    except PoolExhaustedError:
                        seq.release()
                        rejected.append(r.rid)
                elif r.rid in seqs and r.arrival < step <= r.last_step:
                    seqs[r.rid].append(0, zeros[:1], zeros[:1])
            except PoolExhaustedError:
                exhausted.append((r.rid, step))
                seqs.pop(r.rid).release()
        free.append(pool.blocks_free)
        for r in trace:
            if r.last_step == step and r.rid in seqs:
                seqs.pop(r.rid).release()
    return {"admitted": len(trace) - len(rejected) - len(exhausted), "rejected": rejected,
            "exhausted": exhausted, "free_blocks": np.array(free)}


def block_size_view(trace, block_size: int, step: int, reserve: int | None = None) -> dict:
    """The block-size widget's data: the block tables at `step` and the waste numbers."""
    mem = trace_memory(trace, block_size, reserve)
    peak = int(mem.paged_slots.max()) // block_size
    mem = trace_memory(trace, block_size, reserve, n_blocks=peak)  # the smallest pool: blocks get reused
    step = int(np.clip(step, 0, len(mem.steps) - 1))
    return {"table": mem.tables[step], "step": step, "tokens": int(mem.tokens[step]),
            "paged_slots": int(mem.paged_slots[step]), "paged_waste": int(mem.paged_waste[step]),
            "reserved": int(mem.reserved[step]), "contiguous_waste": int(mem.contiguous_waste[step]),
            "max_seq_waste": int(mem.seq_waste.max()), "summary": mem.summary()}
