"""KV memory on a request workload, with no model (notebook 17): contiguous reservation vs a
paged pool, replayed step by step.

`request_workload(n, seed=...)` makes seeded requests (arrival, prompt length, output length,
limit); `workload_memory(workload, B)` replays them through a real pool and through contiguous
reservation (positions held, reserved, slots in blocks, block tables and a slot map per step);
`first_fit_replay(workload, slots)` and `paged_replay(workload, n_blocks, B)` replay them in a
fixed memory (rejections, fragmentation).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.config import Config
from ..core.validate import positive_int
from ..serving.blocks import PoolExhaustedError
from ..serving.paged import PagedKVPool


@dataclass(frozen=True)
class WorkloadRequest:
    """A request of a memory workload. It arrives at step `arrival`; that step prefills its
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


def request_workload(n_requests: int = 16, *, seed: int = 0, prompt_range=(2, 24), max_new_tokens: int = 24,
                  mean_gap: float = 1.5) -> list:
    """A seeded workload: arrivals with exponential gaps (mean `mean_gap` steps), prompt lengths
    uniform in prompt_range, outputs uniform in 1..max_new_tokens (a stop token ends most early)."""
    n_requests = positive_int("n_requests", n_requests)
    max_new_tokens = positive_int("max_new_tokens", max_new_tokens)
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
    return [WorkloadRequest(i, int(a), int(p), int(o), max_new_tokens)
            for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]


def _workload_config(max_context: int) -> Config:
    """The smallest model shape: a pool of it costs nothing; only the block bookkeeping matters."""
    return Config(vocab_size=2, d_model=1, n_heads=1, n_kv_heads=1, head_dim=1, n_layers=1, d_ff=1,
                  max_context=max(1, max_context), name="workload")


@dataclass
class WorkloadMemory:
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
        """Totals over the workload (slot-steps) and peaks; waste as a share of what was allocated."""
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


def workload_memory(workload, block_size: int, reserve: int | None = None, n_blocks: int | None = None) -> WorkloadMemory:
    """Replay `workload` step by step through a real PagedKVPool (of `n_blocks`; default: enough
    for every request at once) and through contiguous reservation (`reserve` slots per
    request: default each request's own positions_needed; pass e.g. the model's max_context
    for the cruder scheme). Every request runs as it arrives (no admission control): a pool
    too small for that raises PoolExhaustedError."""
    block_size = positive_int("block_size", block_size)
    workload = list(workload)
    if not workload:
        raise ValueError("the workload has no requests")
    last = max(r.last_step for r in workload)
    most = max(r.positions_needed for r in workload)
    if n_blocks is None:
        n_blocks = sum(-(-r.positions_needed // block_size) for r in workload)  # never exhausted
    pool = PagedKVPool(_workload_config(most), n_blocks, block_size)
    zeros = np.zeros((most, 1, 1), np.float32)
    width = -(-most // block_size)
    seqs, rows = {}, {k: [] for k in ("tokens", "reserved", "slots", "seq_waste")}
    tables, maps = [], []
    for step in range(last + 1):
        for r in workload:
            if r.arrival == step:
                seqs[r.rid] = pool.new_sequence()
                seqs[r.rid].append(0, zeros[:r.prompt_len], zeros[:r.prompt_len])
            elif r.arrival < step <= r.last_step:
                seqs[r.rid].append(0, zeros[:1], zeros[:1])
        live = [r for r in workload if r.arrival <= step <= r.last_step]
        rows["tokens"].append(sum(r.length_at(step) for r in live))
        rows["reserved"].append(sum(r.positions_needed if reserve is None else reserve for r in live))
        rows["slots"].append(pool.stats().slots)
        rows["seq_waste"].append(max([seqs[r.rid].waste for r in live], default=0))
        table = np.full((len(workload), width), -1, np.int64)
        for r in live:
            table[r.rid, :seqs[r.rid].n_blocks] = seqs[r.rid].block_table
        tables.append(table)
        used = pool.refcount > 0
        filled = np.arange(block_size)[None, :] < pool.fill[:, None]  # [n_blocks, B]
        maps.append(np.where(used[:, None], np.where(filled, 2, 1), 0).reshape(-1))
        for r in live:
            if r.last_step == step:
                seqs.pop(r.rid).release()
    return WorkloadMemory(block_size, n_blocks, np.arange(last + 1), np.array(rows["tokens"]),
                       np.array(rows["reserved"]), np.array(rows["slots"]), np.array(rows["seq_waste"]),
                       tables, np.array(maps))


class ContiguousArena:
    """A memory of `n_slots` positions handed out in contiguous ranges, first fit (the lowest
    hole that is large enough). Freed ranges leave holes: external fragmentation."""

    def __init__(self, n_slots: int):
        self.n_slots = positive_int("n_slots", n_slots)
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
        size = positive_int("size", size)
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


def first_fit_replay(workload, arena_slots: int, reserve: int | None = None) -> dict:
    """Replay the workload's arrivals and finishes in a contiguous arena of `arena_slots`: each
    arriving request reserves its range first fit or is rejected. Returns the rejections
    (with the free slots and the largest hole at that moment: a rejection with enough free
    slots but no hole large enough is fragmentation) and, per step, free slots, largest hole
    a slot map `maps` (request id per slot, -1 free) and `states` (0 free, 1 reserved but
    empty, 2 holding a position)."""
    arena = ContiguousArena(arena_slots)
    workload = list(workload)
    last = max(r.last_step for r in workload)
    where, rejected, free, largest, maps, states = {}, [], [], [], [], []
    for step in range(last + 1):
        for r in workload:
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
        for r in workload:
            if r.rid in where:
                state[where[r.rid]:where[r.rid] + r.length_at(step)] = 2
        states.append(state)
        for r in workload:
            if r.last_step == step and r.rid in where:
                arena.free(where.pop(r.rid))
    return {"admitted": len(workload) - len(rejected), "rejected": rejected, "free": np.array(free),
            "largest_hole": np.array(largest), "maps": np.array(maps), "states": np.array(states)}


def paged_replay(workload, n_blocks: int, block_size: int) -> dict:
    """The same replay through a PagedKVPool of `n_blocks`: a request is admitted when the free
    blocks cover its prompt's blocks, then takes blocks as it grows. Returns the rejected ids
    and whether any running request ever found the pool empty (`exhausted`)."""
    workload = list(workload)
    most = max(r.positions_needed for r in workload)
    pool = PagedKVPool(_workload_config(most), n_blocks, block_size)
    zeros = np.zeros((most, 1, 1), np.float32)
    seqs, rejected, exhausted, free = {}, [], [], []
    for step in range(max(r.last_step for r in workload) + 1):
        for r in workload:
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
        for r in workload:
            if r.last_step == step and r.rid in seqs:
                seqs.pop(r.rid).release()
    return {"admitted": len(workload) - len(rejected) - len(exhausted), "rejected": rejected,
            "exhausted": exhausted, "free_blocks": np.array(free)}


def block_size_view(workload, block_size: int, step: int, reserve: int | None = None) -> dict:
    """The block-size widget's data: the block tables at `step` and the waste numbers."""
    mem = workload_memory(workload, block_size, reserve)
    peak = int(mem.paged_slots.max()) // block_size
    mem = workload_memory(workload, block_size, reserve, n_blocks=peak)  # the smallest pool: blocks get reused
    step = int(np.clip(step, 0, len(mem.steps) - 1))
    return {"table": mem.tables[step], "step": step, "tokens": int(mem.tokens[step]),
            "paged_slots": int(mem.paged_slots[step]), "paged_waste": int(mem.paged_waste[step]),
            "reserved": int(mem.reserved[step]), "contiguous_waste": int(mem.contiguous_waste[step]),
            "max_seq_waste": int(mem.seq_waste.max()), "summary": mem.summary()}


def allocator_tables(allocator, workload, width: int | None = None) -> list:
    """Replay `workload` through a block allocator with notebook 17's exercise interface
    (`grow(name, n_positions)`, `free(name)`, `tables`): each step, every running request
    grows to the positions it holds after the step, then finished requests are freed. Returns
    the block tables after each step in `WorkloadMemory.tables`' form ([n_requests, width],
    -1 where a request has no block), so the two can be compared step by step."""
    workload = list(workload)
    if width is None:
        width = -(-max(r.positions_needed for r in workload) // allocator.block_size)
    tables = []
    for step in range(max(r.last_step for r in workload) + 1):
        live = [r for r in workload if r.arrival <= step <= r.last_step]
        for r in live:
            allocator.grow(r.rid, r.length_at(step))
        table = np.full((len(workload), width), -1, np.int64)
        for r in live:
            held = list(allocator.tables[r.rid])
            table[r.rid, :len(held)] = held
        tables.append(table)
        for r in live:
            if r.last_step == step:
                allocator.free(r.rid)
    return tables
