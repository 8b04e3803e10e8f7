"""One sequence of a paged KV cache, as passive data: its block table, per-layer lengths, the
token ids it declared and the hashes of its full blocks.

Every change to a sequence is made by its pool (`PagedKVPool`): allocation, reference counts,
copy-on-write, prefix registration, fork, release. The sequence's methods are the `cache`
interface of forward / forward_batch (check, __len__, append) and short names for the pool's
public calls (`seq.release()` is `seq.pool.release(seq)`), so it never touches the pool's
internals and this module imports nothing from the pool's."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..core.cache import check_made_for, common_length


@dataclass(eq=False)
class PagedSequence:
    """A block table and per-layer lengths in a pool. Use it as the `cache` argument of
    forward / forward_batch; make one with `pool.new_sequence()`."""

    pool: object  # the PagedKVPool that owns its blocks and makes every change to it
    seq_id: int
    block_table: list = field(default_factory=list)  # logical block i -> physical block
    lengths: list = field(default_factory=list)  # positions written, per layer
    tokens: list = field(default_factory=list)  # token ids declared for positions 0.. (prefix hashing)
    n_cached: int = 0  # positions taken from the prefix index at creation
    hashes: list = field(default_factory=list)  # chained hashes of full blocks already registered (or tried)
    released: bool = False

    def __post_init__(self):
        self.config, self.dtype = self.pool.config, self.pool.dtype
        if not self.lengths:
            self.lengths = [0] * self.config.n_layers

    # ----------------------------------------------------------- cache interface
    def __len__(self) -> int:
        return common_length(self.lengths, f"paged sequence {self.seq_id}",
                             "truncate(min(lengths)) or release it and prefill again")

    def check(self, config, dtype=None) -> None:
        """Raise unless this sequence is live and its pool was made for `config` (and `dtype`)."""
        if self.released:
            raise ValueError(f"paged sequence {self.seq_id} was released; make a new one with pool.new_sequence()")
        check_made_for("paged KV pool", self.config, self.dtype, config, dtype,
                       "make a pool for this model with PagedKVPool.for_model(model, n_blocks, block_size)")

    @property
    def block_size(self) -> int:
        """Positions per block of its pool."""
        return self.pool.block_size

    def layer_rows(self, layer, n_new: int):
        """`layer`'s next n_new positions handed to a pass that writes them in place (the pool's
        `layer_rows`): -> (k rows, v rows, block table, block size, first new position); for a
        range of layers, k and v are lists of each one's rows."""
        return self.pool.layer_rows(self, layer, n_new)

    def append(self, layer: int, k_new, v_new):
        """Write S new rows of `layer` (the pool takes or copies blocks as needed); returns that
        layer's K, V for all T positions, [T, Hkv, d] each."""
        return self.pool.append(self, layer, k_new, v_new)

    # ------------------------------------------------- short names for pool calls
    def blocks_needed(self, n_new: int) -> int:
        """Blocks the pool must hand out to append `n_new` more positions (new + copy-on-write)."""
        return self.pool.blocks_needed(self, n_new)

    def reserve(self, n_new: int) -> None:
        """Take now the blocks for `n_new` more positions (PoolExhaustedError, changing nothing)."""
        self.pool.reserve(self, n_new)

    def add_tokens(self, token_ids) -> None:
        """Declare the ids of the next positions, so that blocks they fill can be reused later."""
        self.pool.add_tokens(self, token_ids)

    def fork(self) -> PagedSequence:
        """A second sequence with the same contents, sharing every block (no copy yet)."""
        return self.pool.fork(self)

    def release(self) -> int:
        """Give every block back; returns how many became free (release twice is a no-op)."""
        return self.pool.release(self)

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (repairs an interrupted pass: truncate(min(lengths)))."""
        self.pool.truncate(self, length)

    # ---------------------------------------------------------------- views
    @property
    def pending_tokens(self) -> list:
        """Declared tokens not yet in the cache: after new_sequence(prompt), what to prefill."""
        return self.tokens[len(self):]

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
