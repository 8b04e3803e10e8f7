"""Static batching: the baseline that continuous batching replaces.

Requests are grouped in arrival order into batches of `batch_size`. A batch starts when all
its members have arrived and the previous batch has finished. Its first step prefills every
member's whole prompt together (one forward_batch call, which also picks each first token);
then every step decodes all members that are not finished yet, until the member with the
most tokens to generate has them all. A member that finishes early keeps its slot idle until
the batch ends, and a request that arrives meanwhile waits for the next batch.

    from tinydecoder.serving.static_batching import run_static_batches
    sched = run_static_batches(model, requests, batch_size=2)   # a scheduler.Schedule
    sched.results[0].tokens, sched.results[0].ttft               # as generate() gives; in steps

The result is the same `Schedule` record as `scheduler.run_schedule` returns (steps, results,
TTFT/TPOT in engine steps), so the same tables and timelines draw it.
"""
from __future__ import annotations

import time

from ..core.model import Model
from ..core.validate import int_at_least
from ..decoding.sampling import greedy
from ..fast import forward_batch
from .backends import ContiguousKV
from .scheduler import DECODE, PREFILL, EngineStep, RequestResult, Schedule, Work, _check_requests


def static_batches(requests, batch_size: int) -> list:
    """Request indices grouped in arrival order (ties: list order), `batch_size` per batch."""
    batch_size = int_at_least("batch_size", batch_size, 1)
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i))
    return [order[k:k + batch_size] for k in range(0, len(order), batch_size)]


def run_static_batches(model: Model, requests, batch_size: int, *, sampler=greedy, stop_tokens=(),
                       record_wall: bool = False) -> Schedule:
    """Serve `requests` in static batches of `batch_size` (see the module docstring)."""
    backend = ContiguousKV(model)
    requests = _check_requests(model, requests, backend)
    batches = static_batches(requests, batch_size)
    results = [RequestResult(r) for r in requests]
    steps, step = [], 0

    def record(entries, running, t0):
        started = {i for b in batches for i in b if results[i].admitted is not None}
        waiting = sum(1 for i, r in enumerate(requests) if r.arrival <= len(steps) and i not in started)
        wall = (time.perf_counter() - t0) if record_wall else None
        steps.append(EngineStep(len(steps), entries, waiting, running, None, wall, None))

    for batch in batches:
        start = max(step, max(requests[i].arrival for i in batch))
        while step < start:  # idle: the batch waits for its last member (or nothing is left to run)
            record([], 0, time.perf_counter() if record_wall else None)
            step += 1
        caches = {i: model.new_cache(capacity=requests[i].positions_needed) for i in batch}
        for i in batch:
            results[i].admitted = step
        live = list(batch)
        first = True
        while live:
            t0 = time.perf_counter() if record_wall else None
            if first:
                ids = [list(requests[i].prompt) for i in live]
                entries = [Work(i, PREFILL, len(requests[i].prompt), 0) for i in live]
            else:
                ids = [[results[i].tokens[-1]] for i in live]
                entries = [Work(i, DECODE, 1, len(caches[i])) for i in live]
            logits = forward_batch(model, ids, [caches[i] for i in live], last_only=True)  # one pass
            for i, out in zip(live, logits):
                r = results[i]
                if first:
                    r.first_token_step = step
                    r.prefill_chunks.append((step, len(requests[i].prompt)))
                token = int(sampler(out[-1]))
                r.tokens.append(token)
                r.logits.append(out[-1])
                if len(r.tokens) == requests[i].max_new_tokens or token in stop_tokens:
                    r.finish_step = step
            record(entries, len(batch), t0)  # finished members still hold their slot
            live = [i for i in live if results[i].finish_step is None]
            first = False
            step += 1
    return Schedule(requests, steps, results, None, int(batch_size))
