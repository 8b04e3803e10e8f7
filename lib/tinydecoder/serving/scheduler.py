"""Continuous batching: a small engine that serves many requests at once, one step at a time.

Requests (prompt ids, max new tokens, arrival step) arrive over time. Every engine step builds
one batch and makes ONE `forward_batch` call:

    1. every running request that is decoding feeds its last chosen token   (1 token each)
    2. requests still prefilling get their next prompt chunk, oldest first  (up to the budget)
    3. while budget, batch slots and KV memory allow, waiting requests are admitted in
       arrival order (first come, first served: a request that does not fit blocks those
       behind it) and get their first chunk
   (policy="prefill_first" swaps the order: 2 and 3 first, decodes get what budget is left)

The token budget caps the rows of one batch; a long prompt is cut into chunks so decodes of
other requests keep flowing (chunked prefill). When a request has its `max_new_tokens` (or
picks a stop token) it finishes and its KV memory goes back to the pool at once.

The engine itself (its state, plan and apply) is `engine.Engine`; `run_schedule` drives it
over a request list, and the HTTP server (`tinydecoder.server`) drives the same object.
KV memory is behind a small interface, `backends.KVBackend` (fits_empty, can_admit, admit ->
(cache, cached prompt tokens), reserve, prefilled, release, free_blocks, total_blocks, block_size):
`ContiguousKV` reserves one plain `KVCache` per request for all positions it can reach;
`backends.PagedKV(model, n_blocks, block_size)` takes blocks from a shared pool as
positions are written and reuses cached prompt prefixes (a request then prefills only the
tokens after its longest cached full-block prefix). With `PagedKV(..., admission="on_demand")`
a full pool preempts the newest running request (freed, requeued, recomputed on resume).

Each request gets exactly what `generate(model, prompt, max_new_tokens)` gives it alone
(greedy): the batch only stacks rows; attention stays per sequence.

    from tinydecoder import toy_model
    from tinydecoder.serving.scheduler import Request, run_schedule, run_one_at_a_time
    reqs = [Request([0, 1, 2, 3], 4, arrival=0), Request([5, 4, 3], 3, arrival=1)]
    sched = run_schedule(toy_model(), reqs, token_budget=4)
    sched.results[0].tokens            # [3, 2, 0, 4], as generate() gives
    [s.entries for s in sched.steps]   # who ran in each step, prefill or decode, how many rows
    sched.results[1].ttft, sched.results[1].tpot   # in engine steps
    run_one_at_a_time(toy_model(), reqs).total_steps

Times are counted in engine steps, so every number is deterministic; `record_wall=True`
also stores each step's wall seconds (for curiosity, never for comparisons).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ..core.model import Model
from ..core.validate import limit
from ..decoding.sampling import greedy
from .backends import ContiguousKV
from .engine import POLICIES, Engine
from .requests import DECODE, PREFILL, EngineStep, Request, RequestResult, Work

__all__ = ["DECODE", "PREFILL", "POLICIES", "Engine", "EngineStep", "Request", "RequestResult", "Schedule", "Work",
           "run_schedule", "run_one_at_a_time", "timeline_codes", "demo_requests", "ARRIVAL_PATTERNS"]


@dataclass
class Schedule:
    requests: list
    steps: list  # [EngineStep], one per engine step (idle steps included)
    results: list  # [RequestResult], in request order
    token_budget: int | None
    max_running: int | None

    @property
    def total_steps(self) -> int:
        return len(self.steps)

    @property
    def forward_calls(self) -> int:
        return sum(not s.idle for s in self.steps)

    @property
    def prefilled_tokens(self) -> int:
        return sum(w.n_tokens for s in self.steps for w in s.entries if w.phase == PREFILL)

    def metrics(self) -> list:
        """One dict per request: name, arrival, admitted, first token, finish, ttft, tpot."""
        rows = []
        for i, r in enumerate(self.results):
            rows.append({"request": r.request.name or f"r{i}", "arrival": r.request.arrival,
                         "prompt": len(r.request.prompt), "new": len(r.tokens),
                         "cached": r.cached_tokens, "admitted": r.admitted,
                         "first_token": r.first_token_step, "finish": r.finish_step,
                         "ttft": r.ttft, "tpot": None if r.tpot is None else round(r.tpot, 3)})
        return rows

    def summary(self) -> dict:
        ttft = [r.ttft for r in self.results]
        tpot = [r.tpot for r in self.results if r.tpot is not None]
        return {"total_steps": self.total_steps, "forward_calls": self.forward_calls,
                "mean_ttft": round(float(np.mean(ttft)), 3), "max_ttft": int(max(ttft)),
                "mean_tpot": round(float(np.mean(tpot)), 3) if tpot else None,
                "max_batch_tokens": max(s.batch_tokens for s in self.steps),
                "prefilled_tokens": self.prefilled_tokens,
                "preemptions": sum(r.preemptions for r in self.results)}


# codes of timeline_codes(): what each request does in each step
NOT_ARRIVED, WAITING, STALLED, PREFILLING, DECODING, DONE = 0, 1, 2, 3, 4, 5


def timeline_codes(schedule: Schedule) -> np.ndarray:
    """[n_requests, n_steps] int array: for each request and step one of NOT_ARRIVED, WAITING,
    STALLED, PREFILLING, DECODING, DONE — what a Gantt chart of the schedule draws."""
    codes = np.zeros((len(schedule.results), schedule.total_steps), dtype=np.int64)
    for i, r in enumerate(schedule.results):
        a, adm, fin = r.request.arrival, r.admitted, r.finish_step
        codes[i, a:adm] = WAITING
        codes[i, adm:fin + 1] = STALLED
        codes[i, fin + 1:] = DONE
    for s in schedule.steps:
        for w in s.entries:
            codes[w.request, s.index] = PREFILLING if w.phase == PREFILL else DECODING
    return codes


# ------------------------------------------------------------------------------ the driver
def _check_requests(model, requests, backend) -> list:
    requests = [r if isinstance(r, Request) else Request(*r) for r in requests]
    if not requests:
        raise ValueError("no requests to serve")
    engine = Engine(model, backend=backend, token_budget=None)
    return [engine.check(r, f"request {i}") for i, r in enumerate(requests)]


def run_schedule(model: Model, requests, *, token_budget: int | None = 8, max_running: int | None = None,
                 chunk_size: int | None = None, policy: str = "decode_first", backend=None,
                 sampler=greedy, stop_tokens=(), record_wall: bool = False,
                 max_steps: int = 100_000, trace=None) -> Schedule:
    """Serve `requests` with continuous batching; return the per-step log and per-request results.

    token_budget: most rows (tokens) in one step's batch (None: no limit)
    max_running:  most requests admitted at once (default: token_budget, so every running
                  request can always decode in the same step)
    chunk_size:   most prompt tokens one request prefills in one step (None: up to the budget)
    policy:       "decode_first" (running decodes, then prefill chunks: a decode never waits)
                  or "prefill_first" (prompts first, decodes get what is left: they can stall)
    backend:      KV memory, a backends.KVBackend (default ContiguousKV(model), unlimited);
                  PagedKV(..., admission="on_demand") lets the engine preempt (see engine.py)
    trace:        a trace_events.TraceRecorder that records every request and step (None: off)
    """
    for name, value in (("token_budget", token_budget), ("max_running", max_running), ("chunk_size", chunk_size)):
        limit(name, value)
    backend = ContiguousKV(model) if backend is None else backend
    engine = Engine(model, backend=backend, token_budget=token_budget, max_running=max_running,
                    chunk_size=chunk_size, policy=policy, sampler=sampler, stop_tokens=stop_tokens, trace=trace)
    requests = _check_requests(model, requests, backend)
    for r in requests:
        engine.register(r)
    arrivals = deque(sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i)))
    steps = []
    while arrivals or engine.busy:
        if engine.steps_run >= max_steps:
            raise RuntimeError(f"the schedule did not finish within max_steps={max_steps}")
        while arrivals and requests[arrivals[0]].arrival <= engine.steps_run:
            engine.enqueue(arrivals.popleft())
        steps.append(engine.step(record_wall))
    return Schedule(requests, steps, engine.results, engine.token_budget, engine.max_running)


def run_one_at_a_time(model: Model, requests, *, backend=None, sampler=greedy, stop_tokens=(),
                      record_wall: bool = False) -> Schedule:
    """The baseline without batching: one request at a time, its whole prompt in one step,
    then one decode step per token; the next request waits until it finishes."""
    return run_schedule(model, requests, token_budget=None, max_running=1, backend=backend,
                        sampler=sampler, stop_tokens=stop_tokens, record_wall=record_wall)


# ------------------------------------------------------------------------------ demo workloads
DEMO_SHAPES = (("A", 10, 6), ("B", 4, 8), ("C", 24, 4), ("D", 6, 6), ("E", 14, 5))  # name, prompt, new
ARRIVAL_PATTERNS = {"staggered": (0, 1, 2, 4, 5), "all at once": (0, 0, 0, 0, 0),
                    "late burst": (0, 6, 6, 6, 6)}


def demo_requests(pattern: str = "staggered", vocab_size: int = 6, seed: int = 0) -> list:
    """Five requests A..E of mixed prompt lengths (10, 4, 24, 6, 14) and lengths to generate
    (6, 8, 4, 6, 5), arriving by one of ARRIVAL_PATTERNS; prompt ids drawn from
    np.random.default_rng(seed) below vocab_size. Fits the toy model (64 positions)."""
    if pattern not in ARRIVAL_PATTERNS:
        raise ValueError(f"pattern must be one of {list(ARRIVAL_PATTERNS)}, got {pattern!r}")
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab_size, size=n) for _, n, _ in DEMO_SHAPES]
    return [Request(p, new, arrival, name) for (name, _, new), p, arrival
            in zip(DEMO_SHAPES, prompts, ARRIVAL_PATTERNS[pattern])]
