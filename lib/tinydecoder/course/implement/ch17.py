"""Chapter 17's exercise: the bookkeeping of a paged KV cache, a free list with reference counts.

    class BlockAllocator:
        def __init__(self, n_blocks, block_size)   # free_list = [0, 1, ..., n_blocks - 1],
                                                   # refcount = [0] * n_blocks, tables = {}
        def grow(self, name, n_positions)          # make sequence `name` cover n_positions
        def fork(self, parent, child)              # child shares parent's blocks
        def free(self, name) -> int                # blocks that became free

The rules, and the library's answer: `serving.block_allocator.BlockAllocator` (the same books
as `serving.paged.PagedKVPool`). A full pool raises (any exception) and changes nothing.
"""
from __future__ import annotations

from ...serving.block_allocator import BlockAllocator as LibraryAllocator
from ...serving.block_allocator import blocks_for
from .case import Case


def _state(alloc) -> tuple:
    for attr in ("free_list", "refcount", "tables", "block_size"):
        if not hasattr(alloc, attr):
            raise AttributeError(f"the allocator has no attribute {attr!r} (see the docstring)")
    return (list(alloc.free_list), [int(c) for c in alloc.refcount],
            {k: [int(b) for b in v] for k, v in alloc.tables.items()})


def _same(mine, ref) -> bool:
    return _state(mine) == _state(ref)


def _both(cls, n_blocks, block_size):
    return cls(n_blocks, block_size), LibraryAllocator(n_blocks, block_size)


def _start(cls):
    mine, ref = _both(cls, 6, 4)
    return _same(mine, ref)


def _partial_block(cls):  # 5 positions in blocks of 4: 2 blocks
    mine, ref = _both(cls, 8, 4)
    mine.grow("a", 5), ref.grow("a", 5)
    return _same(mine, ref)


def _exact_blocks(cls):  # 8 positions in blocks of 4: exactly 2 blocks, not 3
    mine, ref = _both(cls, 8, 4)
    mine.grow("a", 8), ref.grow("a", 8)
    return _same(mine, ref)


def _grow_step_by_step(cls):  # a decode adds one position at a time: a new block only every 4th
    mine, ref = _both(cls, 8, 4)
    for n in (3, 4, 5, 5, 6, 7, 8, 9):
        mine.grow("a", n), ref.grow("a", n)
        if not _same(mine, ref):
            return False
    return True


def _two_sequences(cls):  # blocks come from the front of the free list, in order
    mine, ref = _both(cls, 8, 4)
    for name, n in (("a", 6), ("b", 3), ("a", 9), ("b", 4), ("b", 5)):
        mine.grow(name, n), ref.grow(name, n)
    return _same(mine, ref)


def _reuse_freed(cls):  # a freed block goes to the back of the free list and is handed out again
    mine, ref = _both(cls, 4, 2)
    for alloc in (mine, ref):
        alloc.grow("a", 3), alloc.grow("b", 4)
    freed = mine.free("a"), ref.free("a")
    if freed[0] != freed[1] or not _same(mine, ref):
        return False
    mine.grow("c", 4), ref.grow("c", 4)
    return _same(mine, ref)


def _full_pool(cls):  # too few free blocks: raise, and change nothing
    mine, _ = _both(cls, 3, 4)
    mine.grow("a", 8)
    before = _state(mine)
    try:
        mine.grow("b", 8)  # needs 2, one is free
    except NotImplementedError:
        raise
    except Exception:
        return _state(mine) == before
    return False


def _fork_shares(cls):  # a fork copies the table, not the blocks: count + 1, free list unchanged
    mine, ref = _both(cls, 8, 4)
    for alloc in (mine, ref):
        alloc.grow("a", 6)
        alloc.fork("a", "b")
    if not _same(mine, ref):
        return False
    mine.grow("b", 9), ref.grow("b", 9)  # the child grows alone: the parent's table must not change
    return _same(mine, ref)


def _free_shared(cls):  # a block still held by another sequence is not free
    mine, ref = _both(cls, 8, 4)
    for alloc in (mine, ref):
        alloc.grow("a", 6)
        alloc.fork("a", "b")
        alloc.grow("b", 10)
    for name in ("a", "b"):
        if mine.free(name) != ref.free(name) or not _same(mine, ref):
            return False
    return True


def _free_twice(cls):  # freeing a sequence again frees nothing
    mine, ref = _both(cls, 8, 4)
    for alloc in (mine, ref):
        alloc.grow("a", 6)
        alloc.fork("a", "b")
        alloc.free("a")
    again = mine.free("a"), ref.free("a")
    return again[0] == again[1] and _same(mine, ref)


def _random(cls):
    import numpy as np

    rng = np.random.default_rng(17)
    for _ in range(20):
        n_blocks, block_size = int(rng.integers(4, 16)), int(rng.integers(1, 6))
        mine, ref = _both(cls, n_blocks, block_size)
        lengths, next_name = {}, 0
        for _ in range(40):
            op = rng.integers(0, 4)
            if op <= 1 or not lengths:  # grow a new or a known sequence
                name = next_name if (op == 0 or not lengths) else list(lengths)[int(rng.integers(0, len(lengths)))]
                n = lengths.get(name, 0) + int(rng.integers(1, 2 * block_size + 1))
                need = max(0, blocks_for(n, block_size) - len(ref.tables.get(name, [])))
                if need > len(ref.free_list):
                    continue
                next_name += name == next_name
                lengths[name] = n
                mine.grow(name, n), ref.grow(name, n)
            elif op == 2:
                parent = list(lengths)[int(rng.integers(0, len(lengths)))]
                mine.fork(parent, next_name), ref.fork(parent, next_name)
                lengths[next_name] = lengths[parent]
                next_name += 1
            else:
                name = list(lengths)[int(rng.integers(0, len(lengths)))]
                lengths.pop(name)
                if mine.free(name) != ref.free(name):
                    return False
            if not _same(mine, ref):
                return False
    return True


BLOCK_ALLOCATOR = [
    Case("a new allocator", "free_list holds every block id in order, refcount is all zeros, tables is {}", _start),
    Case("partly filled last block", "a block that is only partly used is still a block: ceil(n / block_size)",
         _partial_block),
    Case("whole number of blocks", "n positions that fill their blocks exactly need no extra block", _exact_blocks),
    Case("growing one position at a time", "grow takes only the blocks the table does not have yet",
         _grow_step_by_step),
    Case("two sequences", "take blocks from the front of the free list, in order, and set their count to 1",
         _two_sequences),
    Case("freed blocks are reused", "a block whose count reaches 0 goes to the back of the free list",
         _reuse_freed),
    Case("a full pool", "when the free list is too short, raise before taking any block", _full_pool),
    Case("fork shares", "a fork gets its own list of the parent's blocks and adds 1 to each count; nothing is "
         "taken from the free list", _fork_shares),
    Case("free a shared block", "free lowers each count by 1; only a block at 0 goes back to the free list",
         _free_shared),
    Case("free twice", "free forgets the sequence: freeing it again changes nothing and returns 0", _free_twice),
    Case("random operations vs the library", "compare with serving.block_allocator.BlockAllocator", _random),
]

EXERCISES = {"BlockAllocator": BLOCK_ALLOCATOR}
REFERENCES = {"BlockAllocator": LibraryAllocator}
