"""KV memory for the scheduler, behind one interface (`KVBackend`): how a request is admitted,
where its cache lives, and when its memory comes back.

- `ContiguousKV`: one plain KVCache per request, reserved whole at admission for every
  position the request can reach (what a server without paging must do);
- `PagedKV`: blocks from a shared PagedKVPool, taken as positions are written, with prefix reuse.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..core.model import Model
from ..core.validate import positive_int
from .paged import PagedKVPool


@runtime_checkable
class KVBackend(Protocol):
    """What `run_schedule` asks of KV memory. Sizes are in blocks of `block_size` positions
    (ContiguousKV: a block is one position); `total_blocks`/`free_blocks` are None when unlimited."""

    block_size: int
    total_blocks: int | None

    @property
    def used_blocks(self) -> int: ...

    @property
    def free_blocks(self) -> int | None: ...

    def fits_empty(self, request) -> bool:
        """Could the request run at all, in an otherwise empty pool?"""

    def can_admit(self, request, tokens=None) -> bool:
        """Can it be admitted now? `tokens`: what it will prefill (default its prompt; after a
        preemption, the prompt plus the tokens it had generated)."""

    def admit(self, request, tokens=None):
        """-> (cache, cached_tokens): a cache for `forward_batch`, holding `cached_tokens`
        positions of `tokens` already (reused prefix blocks), 0 <= cached < len(tokens)."""

    def reserve(self, cache, n_new: int) -> bool:
        """Take the memory for n_new more rows of `cache` now; False (changing nothing) if short."""

    def prefilled(self, cache, prompt) -> None:
        """Called once the whole prompt is in `cache`."""

    def release(self, cache) -> None:
        """The request finished: its memory goes back to the pool."""


class ContiguousKV:
    """KV memory as one plain `KVCache` per request, reserved whole at admission for
    `prompt + max_new_tokens - 1` positions (the way a server without paging must reserve).

    capacity_tokens: KV rows the pool holds (None: unlimited). A "block" here is one row."""

    block_size = 1

    def __init__(self, model: Model, capacity_tokens: int | None = None):
        if capacity_tokens is not None:
            capacity_tokens = positive_int("capacity_tokens", capacity_tokens)
        self.model = model
        self.total_blocks = capacity_tokens
        self.reserved = {}  # id(cache) -> rows reserved

    @property
    def used_blocks(self) -> int:
        return sum(self.reserved.values())

    @property
    def free_blocks(self):
        return None if self.total_blocks is None else self.total_blocks - self.used_blocks

    @property
    def available_blocks(self):
        """What admission can hand out: the free rows (a reservation is taken whole, nothing is promised)."""
        return self.free_blocks

    def fits_empty(self, request) -> bool:
        return self.total_blocks is None or request.positions_needed <= self.total_blocks

    def can_admit(self, request, tokens=None) -> bool:
        return self.total_blocks is None or request.positions_needed <= self.free_blocks

    def admit(self, request, tokens=None):
        """-> (cache, cached_tokens): an empty cache reserved for the whole request."""
        cache = self.model.new_cache(capacity=request.positions_needed)
        self.reserved[id(cache)] = request.positions_needed
        return cache, 0

    def reserve(self, cache, n_new: int) -> bool:
        """Always True: the whole request was reserved at admission."""
        return True

    def prefilled(self, cache, prompt) -> None:
        """Called once the whole prompt is in `cache` (a paged backend registers its blocks)."""

    def release(self, cache) -> None:
        self.reserved.pop(id(cache))


class PagedKV:
    """`tinydecoder.serving.scheduler` backend over a PagedKVPool: blocks on demand, prefix reuse.

    admission="reserve" (default) is conservative, so that a running request never finds the
    pool empty: a request is admitted when the free blocks, minus the blocks the running
    requests may still take, cover its worst case ceil(positions_needed / B) less the prefix
    blocks it reuses. admission="on_demand" (as vLLM does) admits a request when the blocks
    for what it must prefill are free; a running request that later finds the pool empty
    makes the engine preempt the newest running one. Either way blocks are taken only as
    rows are planned, and a finished request's blocks are free at once."""

    ADMISSIONS = ("reserve", "on_demand")

    def __init__(self, model, n_blocks: int, block_size: int = 16, cache_prefixes: bool = True,
                 cache_freed_blocks: bool = True, admission: str = "reserve"):
        if admission not in self.ADMISSIONS:
            raise ValueError(f"admission must be one of {self.ADMISSIONS}, got {admission!r}")
        self.admission = admission
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

    @property
    def promised_blocks(self) -> int:
        """Blocks the running requests may still take (worst case less what they hold)."""
        seqs = self.pool.sequences
        return sum(max(0, w - len(seqs[i].block_table)) for i, w in self._worst.items())

    @property
    def available_blocks(self) -> int:
        """What admission can hand out: free blocks minus those promised to running requests."""
        return self.pool.blocks_free - self.promised_blocks

    def _worst_blocks(self, request) -> int:
        return -(-request.positions_needed // self.block_size)

    def fits_empty(self, request) -> bool:
        return self._worst_blocks(request) <= self.total_blocks

    def can_admit(self, request, tokens=None) -> bool:
        tokens = request.prompt if tokens is None else tokens
        hits = self.pool.match_prefix(tokens) if self.cache_prefixes else []
        revived = sum(1 for b in hits if self.pool.refcount[b] == 0)  # cached free blocks it takes back
        if self.admission == "on_demand":  # the blocks of what it prefills, no promise beyond
            return -(-len(tokens) // self.block_size) - len(hits) <= self.pool.blocks_free - revived
        need = self._worst_blocks(request) - len(hits)
        return need <= self.available_blocks - revived

    def admit(self, request, tokens=None):
        """-> (sequence, cached_tokens)."""
        tokens = request.prompt if tokens is None else tokens
        seq = self.pool.new_sequence(tokens) if self.cache_prefixes else self.pool.new_sequence()
        if self.admission == "reserve":
            self._worst[seq.seq_id] = self._worst_blocks(request)
        return seq, seq.n_cached

    def reserve(self, cache, n_new: int) -> bool:
        if self.pool.blocks_needed(cache, n_new) > self.pool.blocks_free:
            return False
        self.pool.reserve(cache, n_new)
        return True

    def prefilled(self, cache, prompt) -> None:
        """Blocks are registered as they fill (the sequence knows its prompt); nothing to do."""

    def release(self, cache) -> None:
        self._worst.pop(cache.seq_id, None)
        cache.release()
