"""The bookkeeping of a paged KV cache without the K/V arrays: a free list, reference counts
and one block table per sequence. `paged.PagedKVPool` keeps its blocks in one of these (beside
the K/V arrays and the prefix index); this is the part notebook 17 asks the learner to write, and
the answer its checker compares with.

    alloc = BlockAllocator(n_blocks=8, block_size=4)
    alloc.grow("a", 6)            # "a" now covers 6 positions: ceil(6 / 4) = 2 blocks, [0, 1]
    alloc.fork("a", "b")          # "b" shares a's blocks: reference counts 2, nothing copied
    alloc.free("a")               # 0: every block is still held by "b"
    alloc.free("b")               # 2: both blocks go back to the free list

Rules (the same as PagedKVPool with cache_freed_blocks=False):
- a sequence holding n positions owns ceil(n / block_size) blocks;
- `grow` takes new blocks from the FRONT of the free list, in order, and sets their count to 1;
  if the free list has too few it raises PoolExhaustedError and changes nothing;
- `fork` gives the child the parent's blocks (count + 1 each), never a copy;
- `free` drops one reference per block; a block whose count reaches 0 goes to the BACK of the
  free list; the sequence is forgotten (freeing it again frees nothing).
Copy-on-write (a write into a shared partial block) is PagedKVPool's business: it moves data.
"""
from __future__ import annotations

import numpy as np

from ..core.validate import is_int, positive_int
from .blocks import PoolExhaustedError


def blocks_for(n_positions: int, block_size: int) -> int:
    """Blocks that hold n_positions: ceil(n_positions / block_size), in integers."""
    return -(-int(n_positions) // int(block_size))


class BlockAllocator:
    """A free list and reference counts over `n_blocks` blocks of `block_size` positions, and
    a block table per sequence name (`tables[name]`: physical block of each logical block)."""

    def __init__(self, n_blocks: int, block_size: int):
        self.n_blocks = positive_int("n_blocks", n_blocks)
        self.block_size = positive_int("block_size", block_size)
        self.free_list = list(range(self.n_blocks))
        self.refcount = np.zeros(self.n_blocks, np.int64)  # holders of each block
        self.tables = {}

    # One block at a time: the moves grow, fork and free are made of, and PagedKVPool's too.
    def take(self) -> int:
        """The block at the front of the free list, now held once (count 1)."""
        if not self.free_list:
            raise PoolExhaustedError(f"no free block: all {self.n_blocks} are held")
        block = self.free_list.pop(0)
        self.refcount[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more holder of a held block (count + 1)."""
        if self.refcount[block] < 1:
            raise ValueError(f"block {block} is not held; take it or revive it first")
        self.refcount[block] += 1

    def drop(self, block: int, park: bool = False) -> bool:
        """One holder fewer; True when the count reaches 0. Then the block goes to the BACK of the
        free list, or, with park=True, to no list: its caller keeps it aside (PagedKVPool keeps a
        freed block that holds a cached prompt prefix) until it `revive`s it."""
        if self.refcount[block] < 1:
            raise ValueError(f"block {block} is not held")
        self.refcount[block] -= 1
        if self.refcount[block]:
            return False
        if not park:
            self.free_list.append(block)
        return True

    def revive(self, block: int) -> None:
        """A parked block (count 0, on no list) held once again."""
        if self.refcount[block] or block in self.free_list:
            raise ValueError(f"block {block} is not parked")
        self.refcount[block] = 1

    def grow(self, name, n_positions: int) -> list:
        """Make sequence `name` (new or known) cover n_positions positions; returns the blocks
        taken (possibly none)."""
        if not is_int(n_positions) or n_positions < 0:
            raise ValueError(f"n_positions must be an integer >= 0, got {n_positions!r}")
        table = self.tables.get(name, [])
        need = max(0, blocks_for(n_positions, self.block_size) - len(table))
        if need > len(self.free_list):
            raise PoolExhaustedError(f"sequence {name!r} needs {need} more block(s) for {n_positions} positions, "
                                     f"but only {len(self.free_list)} of {self.n_blocks} are free")
        taken = [self.take() for _ in range(need)]
        self.tables[name] = table + taken
        return taken

    def fork(self, parent, child) -> None:
        """`child` starts with the same blocks as `parent` (shared: count + 1 each)."""
        if parent not in self.tables:
            raise KeyError(f"no sequence {parent!r} to fork")
        if child in self.tables:
            raise ValueError(f"sequence {child!r} exists already")
        self.tables[child] = list(self.tables[parent])
        for block in self.tables[child]:
            self.share(block)

    def free(self, name) -> int:
        """Drop `name`'s references; returns how many blocks became free (0 for an unknown or
        already freed name)."""
        return sum(self.drop(block) for block in self.tables.pop(name, []))
