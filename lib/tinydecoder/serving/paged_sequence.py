"""One sequence of a paged KV cache: its block table, copy-on-write, prefix registration.
It is the `cache` argument of forward / forward_batch (check, __len__, append)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.cache import check_made_for, common_length
from ..core.config import Config
from .blocks import block_hash, check_tokens

if TYPE_CHECKING:  # annotations only: paged.py imports this module
    from .paged import PagedKVPool


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
        self.tokens.extend(check_tokens(self.config, token_ids))
        self._register_full_blocks()

    @property
    def pending_tokens(self) -> list:
        """Declared tokens not yet in the cache: after new_sequence(prompt), what to prefill."""
        return self.tokens[len(self):]

    # ------------------------------------------------------------ life cycle
    def fork(self) -> PagedSequence:
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
