"""Replay a request workload on a prefix cache, with no model: how many prompt tokens each
structure finds cached, under a memory budget and a scheduling order.

Two caches behind one small interface (`admit`, `finish`):
- `BlockHashCache(block_size, capacity_blocks)`: vLLM's scheme, the chained hash of every
  full block (`blocks.block_hashes`). Finished sequences leave their full blocks cached; free
  cached blocks are evicted least recently freed first, and a finished sequence frees its
  blocks tail first (as vLLM does), so the end of a chain goes before its beginning.
- `RadixReplay(capacity_tokens)`: SGLang's radix tree (`radix.RadixCache`), LRU leaves.

Both keep at least one prompt token to prefill (its logits pick the first output token), both
cache the finished sequence (prompt + output), and both count memory the same way: cached
tokens plus the running request's own. Requests run one at a time; `replay` picks the next
one first-come-first-served ("fcfs") or longest cached prefix first ("lpm", SGLang's policy).
Looking up a waiting request's prefix marks the tree's nodes as used (as SGLang's own prefix
matching does when its scheduler sorts the queue); the hash chain's lookup changes nothing.

    report = replay(requests, RadixReplay(capacity_tokens=512), policy="lpm")
    report.hit_rate, report.rows      # cached prompt tokens / prompt tokens, one row per request
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..core.validate import is_int, positive_int
from .blocks import block_hashes
from .radix import CacheFullError, RadixCache, check_token_list

POLICIES = ("fcfs", "lpm")


@dataclass(frozen=True)
class ReplayRequest:
    name: str
    prompt: tuple  # token ids
    output: tuple = ()  # the tokens the request generates (cached with the prompt when it finishes)

    def __post_init__(self):
        object.__setattr__(self, "prompt", check_token_list(self.prompt, "prompt"))
        object.__setattr__(self, "output", check_token_list(self.output, "output"))
        if not self.prompt:
            raise ValueError(f"request {self.name!r} has an empty prompt: a prompt needs at least one token")

    @property
    def sequence(self) -> tuple:
        return self.prompt + self.output


class BlockHashCache:
    """vLLM-style prefix caching by chained block hashes, simulated on token ids.

    capacity_blocks: blocks of block_size tokens in the pool (None: unlimited)."""

    def __init__(self, block_size: int, capacity_blocks: int | None = None):
        self.block_size = positive_int("block_size", block_size)
        self.capacity_blocks = None if capacity_blocks is None else positive_int("capacity_blocks", capacity_blocks)
        self.in_use = Counter()  # hash -> references held by running requests
        self.free_cached = OrderedDict()  # hash -> None, free but cached: least recently freed first
        self.running_blocks = 0  # blocks of the running requests that have no hash yet
        self.evicted = 0

    @property
    def name(self) -> str:
        return f"hash chain (B={self.block_size})"

    @property
    def cached_blocks(self) -> int:
        return len(self.in_use) + len(self.free_cached)

    def lookup(self, prompt) -> int:
        """Prompt tokens found cached (whole blocks, leaving one token), without changing anything."""
        return len(self._hits(prompt)) * self.block_size

    def _hits(self, prompt) -> list:
        usable = (len(prompt) - 1) // self.block_size
        hits = []
        for h in block_hashes(prompt[:usable * self.block_size], self.block_size):
            if h not in self.in_use and h not in self.free_cached:
                break
            hits.append(h)
        return hits

    def admit(self, request: ReplayRequest) -> int:
        hits = self._hits(request.prompt)
        for h in hits:
            self.free_cached.pop(h, None)
            self.in_use[h] += 1
        new = -(-len(request.sequence) // self.block_size) - len(hits)
        if self.capacity_blocks is not None:
            over = self.cached_blocks + self.running_blocks + new - self.capacity_blocks
            if over > len(self.free_cached):
                raise CacheFullError(f"request {request.name!r} needs {new} new blocks; the pool of "
                                     f"{self.capacity_blocks} blocks cannot free enough")
            for _ in range(max(0, over)):
                self.free_cached.popitem(last=False)
                self.evicted += 1
        self.running_blocks += new
        return len(hits) * self.block_size

    def finish(self, request: ReplayRequest, cached: int) -> None:
        seq = request.sequence
        hashes = block_hashes(seq, self.block_size)
        n_hit = cached // self.block_size
        n_blocks = -(-len(seq) // self.block_size)
        self.running_blocks -= n_blocks - n_hit
        owned = []  # the blocks this request holds, in order; None: a block without a hash
        for i in range(n_blocks):
            h = hashes[i] if i < len(hashes) else None
            if i >= n_hit and h is not None:
                if h in self.in_use or h in self.free_cached:
                    h = None  # computed again: the copy is freed, the cached one stays
                else:
                    self.in_use[h] += 1  # registered: a new cached block
            owned.append(h)
        for h in reversed(owned):  # free tail first: the end of a chain is evicted first
            if h is None:
                continue
            self.in_use[h] -= 1
            if self.in_use[h] == 0:
                del self.in_use[h]
                self.free_cached[h] = None


class RadixReplay:
    """SGLang-style prefix caching in a radix tree of token ids (`radix.RadixCache`)."""

    def __init__(self, capacity_tokens: int | None = None):
        self.tree = RadixCache(capacity_tokens)
        self._held = {}  # request name -> (locked node, reserved tokens)
        self.ends = Counter()  # why each match stopped (PrefixMatch.ends)

    @property
    def name(self) -> str:
        return "radix tree"

    def lookup(self, prompt) -> int:
        return self.tree.match_prefix(prompt[:-1], split=False).length

    def admit(self, request: ReplayRequest) -> int:
        match = self.tree.match_prefix(request.prompt[:-1])
        self.ends[match.ends] += 1
        self.tree.lock(match.node)
        own = len(request.sequence) - match.length
        try:
            self.tree.make_room(own)
        except CacheFullError:
            self.tree.unlock(match.node)
            raise
        self._held[request.name] = (match.node, own)
        return match.length

    def finish(self, request: ReplayRequest, cached: int) -> None:
        node, own = self._held.pop(request.name)
        self.tree.release_room(own)
        self.tree.insert(request.sequence)
        self.tree.unlock(node)


@dataclass
class ReplayReport:
    cache: str
    policy: str
    rows: list = field(default_factory=list)  # [name, prompt tokens, cached tokens], in run order

    @property
    def prompt_tokens(self) -> int:
        return sum(r[1] for r in self.rows)

    @property
    def cached_tokens(self) -> int:
        return sum(r[2] for r in self.rows)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.rows else 0.0

    @property
    def order(self) -> list:
        return [r[0] for r in self.rows]


def replay(requests, cache, policy: str = "fcfs") -> ReplayReport:
    """Run `requests` (all waiting at the start) one at a time on `cache` (BlockHashCache or
    RadixReplay). policy "fcfs": in the given order; "lpm": each time, the waiting request
    with the longest cached prefix (ties: the earlier one), as SGLang's scheduler sorts."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    requests = list(requests)
    if not all(isinstance(r, ReplayRequest) for r in requests):
        raise TypeError("requests must be ReplayRequest objects")
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise ValueError("request names must be unique")
    report = ReplayReport(cache.name, policy)
    waiting = list(requests)
    while waiting:
        if policy == "lpm":
            best = max(range(len(waiting)), key=lambda i: (cache.lookup(waiting[i].prompt), -i))
        else:
            best = 0
        request = waiting.pop(best)
        cached = cache.admit(request)
        cache.finish(request, cached)
        report.rows.append([request.name, len(request.prompt), cached])
    return report


# ----------------------------------------------------------------------------- what whole blocks reuse

def shared_prefix(a, b) -> int:
    """Tokens at the start of `a` and `b` that are equal."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n


def prefix_reuse(prompts, block_size: int) -> dict:
    """For each prompt after the first, arriving in order into a pool that caches every full block:
    the tokens it shares with an earlier prompt ("shared"), and the tokens a block-hash cache of
    `block_size` hands back ("reused": whole blocks of the shared prefix, leaving at least one token
    to prefill, as `PagedKVPool.match_prefix` does)."""
    if not is_int(block_size) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
    if len(prompts) < 2:
        raise ValueError(f"prefix reuse needs at least two prompts, got {len(prompts)}")
    shared = [max(shared_prefix(p, q) for q in prompts[:i]) for i, p in enumerate(prompts) if i]
    usable = [(len(p) - 1) // block_size for p in prompts[1:]]
    reused = [min(s // block_size, u) * block_size for s, u in zip(shared, usable)]
    return {"block_size": int(block_size), "shared": shared, "reused": reused,
            "prompt_tokens": [len(p) for p in prompts[1:]]}
