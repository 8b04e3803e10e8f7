"""A radix tree over token ids: the prefix cache of SGLang's RadixAttention.

The block-hash chain (`blocks.block_hashes`, vLLM's scheme) names each *full* block of B
tokens by a hash over its parent's hash and its own tokens; a prefix is reused in whole blocks.
A radix tree keeps the cached sequences themselves: every edge holds a run of token ids, the
children of a node start with different tokens, and the path from the root to a node spells a
prefix that some cached sequence had. A lookup walks down as far as the tokens agree, so it
finds the longest cached prefix *to the token*: no rounding down to a block, and a match that
ends inside an edge (a branch point) counts every token before the branch.

    tree = RadixCache(capacity_tokens=4096)
    m = tree.match_prefix(prompt)          # PrefixMatch(length, node, values, ends)
    tree.lock(m.node)                      # a running request holds its prefix: not evictable
    tree.make_room(len(prompt) - m.length) # evict least recently used unlocked leaves if needed
    ...                                    # prefill prompt[m.length:], decode
    tree.insert(prompt + output, slots)    # the finished sequence becomes shareable
    tree.unlock(m.node)

Each node may carry `values`, one per token of its edge (in SGLang: the slots of the KV pool
holding that token's K/V); `match_prefix` returns them concatenated along the path and
`evict` returns those it frees. Splitting a node splits its values with it.

Eviction, as SGLang does it: only a *leaf* whose lock count is 0 may go, the least recently
used first (a logical clock that every match and insert advances, so runs are reproducible);
when a leaf goes and its parent is left childless and unlocked, the parent becomes a
candidate too. A locked node's ancestors are locked with it (`lock` walks up to the root), so
a prefix in use is never evicted from under a request.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..core.validate import is_int


class CacheFullError(RuntimeError):
    """The tree cannot free enough tokens: the rest is locked by running requests."""


def check_token_list(tokens, what: str = "tokens") -> tuple:
    """A tuple of non-negative ints, or a clear TypeError / ValueError."""
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__"):
        raise TypeError(f"{what} must be a sequence of token ids (list, tuple or 1-D array), "
                        f"got {type(tokens).__name__}")
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integer token ids, got dtype {arr.dtype}")
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"{what} must be token ids >= 0, got {int(arr.min())}")
    return tuple(int(t) for t in arr)


class RadixNode:
    """One node: the edge from its parent (`key`, a tuple of token ids), its values, children
    keyed by their first token, a lock count and the clock tick of its last use."""

    __slots__ = ("key", "values", "children", "parent", "lock_ref", "last_access", "node_id")

    def __init__(self, key: tuple, values, parent, node_id: int, tick: int):
        self.key = key
        self.values = values
        self.children = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = tick
        self.node_id = node_id

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def depth_tokens(self) -> int:
        """Tokens on the path from the root to the end of this node's edge."""
        n, node = 0, self
        while node is not None:
            n += len(node.key)
            node = node.parent
        return n

    def __repr__(self) -> str:
        return (f"RadixNode(id={self.node_id}, key={list(self.key)}, lock_ref={self.lock_ref}, "
                f"children={len(self.children)})")


@dataclass(frozen=True)
class PrefixMatch:
    length: int  # tokens of the longest cached prefix
    node: RadixNode  # the node whose edge ends exactly there (the root when length == 0)
    values: np.ndarray | None  # the values along the path, one per matched token (None if not stored)
    ends: str  # why the match stopped: "empty", "end of a cached sequence", "branch point", "end of the query"


@dataclass(frozen=True)
class EvictResult:
    tokens: int  # tokens evicted
    values: np.ndarray | None  # their values, concatenated (None when the tree stores none)
    nodes: int  # leaves removed


class RadixCache:
    """A radix tree of cached token sequences with lock counts and LRU eviction of leaves.

    capacity_tokens: the budget (tokens the tree plus the running requests' own tokens may
    hold; `make_room` enforces it); None means unlimited."""

    def __init__(self, capacity_tokens: int | None = None):
        if capacity_tokens is not None and (isinstance(capacity_tokens, bool)
                                            or not isinstance(capacity_tokens, (int, np.integer))
                                            or capacity_tokens < 1):
            raise ValueError(f"capacity_tokens must be an integer >= 1 or None, got {capacity_tokens!r}")
        self.capacity_tokens = None if capacity_tokens is None else int(capacity_tokens)
        self._clock = 0
        self._next_id = 1
        self.root = RadixNode((), None, None, 0, 0)
        self.root.lock_ref = 1  # the root is never evicted
        self.total_tokens = 0  # tokens held by the tree
        self.locked_tokens = 0  # of which on a path some running request holds
        self.reserved_tokens = 0  # running requests' own tokens, not yet in the tree (make_room)
        self.stores_values = None  # decided by the first insert

    # ------------------------------------------------------------------ lookup
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def match_prefix(self, tokens, split: bool = True) -> PrefixMatch:
        """The longest cached prefix of `tokens`. Marks the nodes on the path as just used.

        When the match ends inside an edge, that node is split there (as SGLang does), so that
        `match.node` ends exactly at the match and can be locked; split=False leaves the tree
        as it is and returns the node above the cut."""
        key = check_token_list(tokens)
        tick = self._tick()
        node, pos, values = self.root, 0, []
        node.last_access = tick
        ends = "empty" if not key else "end of the query"
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                if pos:
                    ends = "end of a cached sequence" if node.is_leaf else "branch point"
                break
            n = _common_length(child.key, key[pos:])
            child.last_access = tick
            if n < len(child.key):  # the match ends inside this edge
                ends = "branch point" if pos + n < len(key) else "end of the query"
                if split:
                    child = self._split(child, n)
                    values.append(child.values)
                    node, pos = child, pos + n
                else:
                    if child.values is not None:
                        values.append(child.values[:n])
                    pos += n
                break
            values.append(child.values)
            node, pos = child, pos + n
        if self.stores_values and values:
            vals = np.concatenate([v for v in values if v is not None])
        else:
            vals = np.zeros(0, np.int64) if self.stores_values else None
        return PrefixMatch(pos, node, vals, ends if pos else "empty")

    def _split(self, child: RadixNode, n: int) -> RadixNode:
        """Cut child's edge after n tokens: a new node takes the first n (and their values) and
        becomes child's parent. Returns the new node. Locks and clock carry over."""
        parent = child.parent
        top = RadixNode(child.key[:n], None if child.values is None else child.values[:n],
                        parent, self._next_id, child.last_access)
        self._next_id += 1
        top.lock_ref = child.lock_ref
        child.key = child.key[n:]
        child.values = None if child.values is None else child.values[n:]
        child.parent = top
        top.children[child.key[0]] = child
        parent.children[top.key[0]] = top
        return top

    # ------------------------------------------------------------------ insert
    def insert(self, tokens, values=None) -> int:
        """Add a sequence (e.g. a finished request's prompt + output). Returns how many of its
        leading tokens were in the tree already: their values stay those of the tree (a caller
        that computed them again frees its own copies, as SGLang does)."""
        key = check_token_list(tokens)
        if values is not None:
            values = np.asarray(values)
            if values.shape != (len(key),):
                raise ValueError(f"values must hold one entry per token ({len(key)}), got shape {values.shape}")
        if key:
            store = values is not None
            if self.stores_values is None:
                self.stores_values = store
            elif self.stores_values != store:
                raise ValueError("insert values with every sequence or with none: this tree "
                                 + ("stores values" if self.stores_values else "stores no values"))
        tick = self._tick()
        node, pos = self.root, 0
        node.last_access = tick
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                leaf = RadixNode(key[pos:], None if values is None else values[pos:].copy(),
                                 node, self._next_id, tick)
                self._next_id += 1
                node.children[key[pos]] = leaf
                self.total_tokens += len(leaf.key)
                return pos
            n = _common_length(child.key, key[pos:])
            child.last_access = tick
            if n < len(child.key):
                child = self._split(child, n)
            node, pos = child, pos + n
        return pos

    # ------------------------------------------------------------------- locks
    def lock(self, node: RadixNode) -> None:
        """A running request uses the prefix ending at `node`: it and its ancestors may not
        be evicted until `unlock(node)`."""
        self._check_node(node)
        while node is not self.root:
            if node.lock_ref == 0:
                self.locked_tokens += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        self._check_node(node)
        if node is not self.root and node.lock_ref < 1:
            raise ValueError(f"unlock of {node!r}, which is not locked (one unlock per lock)")
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.locked_tokens -= len(node.key)
            node = node.parent

    def _check_node(self, node) -> None:
        if not isinstance(node, RadixNode):
            raise TypeError(f"node must be a RadixNode (PrefixMatch.node), got {type(node).__name__}")
        top = node
        while top.parent is not None:
            top = top.parent
        if top is not self.root:
            raise ValueError(f"{node!r} is not (or no longer) in this tree")

    # ---------------------------------------------------------------- eviction
    @property
    def evictable_tokens(self) -> int:
        return self.total_tokens - self.locked_tokens

    def evict(self, n_tokens: int) -> EvictResult:
        """Remove least recently used unlocked leaves until at least n_tokens are freed (or
        nothing unlocked is left). A whole leaf goes, so it may free more than asked."""
        if not is_int(n_tokens) or n_tokens < 0:
            raise ValueError(f"n_tokens must be an integer >= 0, got {n_tokens!r}")
        heap = [(n.last_access, n.node_id, n) for n in self.nodes() if n.is_leaf and n.lock_ref == 0]
        heapq.heapify(heap)
        freed, values, count = 0, [], 0
        while freed < n_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            leaf.parent = None
            freed += len(leaf.key)
            count += 1
            if leaf.values is not None:
                values.append(leaf.values)
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        self.total_tokens -= freed
        vals = (np.concatenate(values) if values else np.zeros(0, np.int64)) if self.stores_values else None
        return EvictResult(freed, vals, count)

    def make_room(self, n_tokens: int) -> EvictResult:
        """Reserve n_tokens for a running request's own (not yet cached) tokens, evicting as
        little as needed to stay within capacity_tokens. Give them back with `release_room`
        (before inserting the finished sequence). Raises CacheFullError, evicting nothing,
        when even evicting every unlocked token would not do."""
        if not is_int(n_tokens) or n_tokens < 0:
            raise ValueError(f"n_tokens must be an integer >= 0, got {n_tokens!r}")
        result = EvictResult(0, np.zeros(0, np.int64) if self.stores_values else None, 0)
        if self.capacity_tokens is not None:
            over = self.total_tokens + self.reserved_tokens + n_tokens - self.capacity_tokens
            if over > self.evictable_tokens:
                raise CacheFullError(
                    f"need room for {n_tokens} tokens but only {self.capacity_tokens - self.total_tokens - self.reserved_tokens}"
                    f" are free and {self.evictable_tokens} evictable (capacity {self.capacity_tokens}, "
                    f"{self.locked_tokens} locked, {self.reserved_tokens} reserved)")
            if over > 0:
                result = self.evict(over)
        self.reserved_tokens += int(n_tokens)
        return result

    def release_room(self, n_tokens: int) -> None:
        if not 0 <= n_tokens <= self.reserved_tokens:
            raise ValueError(f"release_room({n_tokens!r}): only {self.reserved_tokens} tokens are reserved")
        self.reserved_tokens -= int(n_tokens)

    # ------------------------------------------------------------------- views
    def nodes(self) -> list:
        """Every node but the root, parents before children (children in token order)."""
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node is not self.root:
                out.append(node)
            stack.extend(node.children[t] for t in sorted(node.children, reverse=True))
        return out

    def sequences(self) -> list:
        """The token sequence spelt by every leaf's path (what the tree holds, as lists)."""
        out = []
        for node in self.nodes():
            if node.is_leaf:
                path, n = [], node
                while n is not self.root:
                    path[:0] = n.key
                    n = n.parent
                out.append(path)
        return out

    def __len__(self) -> int:
        return self.total_tokens

    def __repr__(self) -> str:
        cap = "unlimited" if self.capacity_tokens is None else self.capacity_tokens
        return (f"RadixCache(tokens={self.total_tokens}, nodes={len(self.nodes())}, "
                f"locked={self.locked_tokens}, capacity={cap})")


def _common_length(a: tuple, b: tuple) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
