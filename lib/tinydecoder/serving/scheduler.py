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

KV memory is behind a small interface, `backends.KVBackend` (fits_empty, can_admit, admit ->
(cache, cached prompt tokens), prefilled, release, free_blocks, total_blocks, block_size):
`ContiguousKV` reserves one plain `KVCache` per request for all positions it can reach;
`backends.PagedKV(model, n_blocks, block_size)` takes blocks from a shared pool as
positions are written and reuses cached prompt prefixes (a request then prefills only the
tokens after its longest cached full-block prefix).

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

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..core.fast import forward_batch
from ..core.model import Model
from ..core.validate import check_token_ids, int_at_least, is_int
from ..decoding.sampling import greedy
from .backends import ContiguousKV

PREFILL, DECODE = "prefill", "decode"
POLICIES = ("decode_first", "prefill_first")


# ------------------------------------------------------------------------------ requests
@dataclass(frozen=True)
class Request:
    """One generation request: greedy continuation of `prompt` by up to `max_new_tokens`
    tokens; it becomes visible to the engine at step `arrival`."""

    prompt: tuple
    max_new_tokens: int
    arrival: int = 0
    name: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "prompt", tuple(int(t) for t in check_token_ids(None, self.prompt)))
        for f, low in (("max_new_tokens", 1), ("arrival", 0)):
            v = getattr(self, f)
            object.__setattr__(self, f, int_at_least(f"Request.{f}", v, low))

    @property
    def positions_needed(self) -> int:
        """KV rows it can reach: the prompt plus every chosen token but the last (never fed)."""
        return len(self.prompt) + self.max_new_tokens - 1


# ------------------------------------------------------------------------------ records
@dataclass(frozen=True)
class Work:
    """One request's share of one step: `n_tokens` rows starting at position `start`."""

    request: int  # index into the request list
    phase: str  # "prefill" or "decode"
    n_tokens: int
    start: int  # position of its first row (= cache length before the step)


@dataclass
class Step:
    index: int  # engine step, 0-based
    entries: list  # [Work], in batch order: decodes first, then prefill chunks
    waiting: int  # requests arrived but not admitted, after this step's admissions
    running: int  # requests admitted and not finished, during this step
    free_blocks: int | None  # KV blocks free after the step (None: unlimited pool)
    wall_s: float | None = None  # only with record_wall=True; never compare it
    available_blocks: int | None = None  # free blocks not promised to running requests: what admission sees

    @property
    def batch_tokens(self) -> int:
        return sum(w.n_tokens for w in self.entries)

    @property
    def idle(self) -> bool:
        return not self.entries


@dataclass
class RequestResult:
    request: Request
    tokens: list = field(default_factory=list)  # generated ids
    logits: list = field(default_factory=list)  # [V] per generated token
    admitted: int | None = None  # step of admission (its first chunk ran in this step)
    first_token_step: int | None = None
    finish_step: int | None = None
    cached_tokens: int = 0  # prompt tokens found in the prefix cache (not prefilled)
    prefill_chunks: list = field(default_factory=list)  # [(step, n_tokens)]

    @property
    def ttft(self) -> int:
        """Time to first token, in steps: from its arrival step through the step that chose it
        (a request admitted on arrival whose prompt fits in one step has ttft 1)."""
        return self.first_token_step - self.request.arrival + 1

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, in steps (1.0 when it decodes every step)."""
        n = len(self.tokens)
        return None if n < 2 else (self.finish_step - self.first_token_step) / (n - 1)

    @property
    def latency(self) -> int:
        """Steps from arrival through the step that chose its last token."""
        return self.finish_step - self.request.arrival + 1


@dataclass
class Schedule:
    requests: list
    steps: list  # [Step], one per engine step (idle steps included)
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
                "prefilled_tokens": self.prefilled_tokens}


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


# ------------------------------------------------------------------------------ the engine
@dataclass
class _Running:
    index: int
    request: Request
    cache: object
    fed: int  # prompt tokens already in the cache
    result: RequestResult

    @property
    def decoding(self) -> bool:
        return self.fed == len(self.request.prompt)


@dataclass
class _Engine:
    """The engine's state between steps, and its two halves: plan (who runs, how many rows)
    and apply (one forward_batch call, then tokens, finishes and released memory)."""

    requests: list
    backend: object
    token_budget: int | None
    max_running: int | None
    chunk_size: int | None
    policy: str
    arrivals: deque = field(default_factory=deque)
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    results: list = field(default_factory=list)

    def plan(self, step: int) -> list:
        """This step's batch: [(_Running, phase, n_tokens)]; admits waiting requests (FCFS)."""
        while self.arrivals and self.requests[self.arrivals[0]].arrival <= step:
            self.waiting.append(self.arrivals.popleft())
        self._budget = float("inf") if self.token_budget is None else self.token_budget
        plan = []
        if self.policy == "decode_first":
            self._plan_decodes(plan)
        for run in self.running:  # prefill chunks of admitted requests, oldest first
            if not run.decoding and self._budget > 0:
                self._plan_chunk(plan, run)
        while self.waiting and self._budget > 0 and len(self.running) < (self.max_running or float("inf")):
            if not self.backend.can_admit(self.requests[self.waiting[0]]):
                break  # first come, first served: it blocks those behind it
            self._plan_chunk(plan, self._admit(self.waiting.popleft(), step))
        if self.policy == "prefill_first":
            self._plan_decodes(plan)  # what is left of the budget; the rest wait (their TPOT grows)
        return plan

    def _plan_decodes(self, plan):  # every decoding request: one token each, while the budget lasts
        for run in self.running:
            if run.decoding and self._budget > 0:
                plan.append((run, DECODE, 1))
                self._budget -= 1

    def _plan_chunk(self, plan, run):
        left = len(run.request.prompt) - run.fed
        n = int(min(left, self._budget, self.chunk_size or left))
        plan.append((run, PREFILL, n))
        self._budget -= n

    def _admit(self, i: int, step: int) -> _Running:
        request, backend = self.requests[i], self.backend
        cache, cached = backend.admit(request)
        if not 0 <= cached < len(request.prompt) or len(cache) != cached:
            raise RuntimeError(f"backend {type(backend).__name__} admitted request {i} with {cached} cached "
                               f"tokens and a cache of {len(cache)} positions; it must hold 0 <= cached < "
                               f"{len(request.prompt)} (the prompt) positions, the same in both")
        self.results[i].admitted, self.results[i].cached_tokens = step, cached
        run = _Running(i, request, cache, cached, self.results[i])
        self.running.append(run)
        return run

    def apply(self, model, plan, step, sampler, stop_tokens) -> list:
        """Run the planned batch in ONE forward_batch call; returns the step's Work entries."""
        ids, caches, entries = [], [], []
        for run, phase, n in plan:
            if phase == DECODE:
                ids.append([run.result.tokens[-1]])
            else:
                ids.append(list(run.request.prompt[run.fed:run.fed + n]))
                run.result.prefill_chunks.append((step, n))
            caches.append(run.cache)
            entries.append(Work(run.index, phase, n, len(run.cache)))
        logits = forward_batch(model, ids, caches, last_only=True)  # one pass for the batch
        for (run, phase, n), out in zip(plan, logits):
            if phase == PREFILL:
                run.fed += n
                if not run.decoding:
                    continue  # a middle chunk: its logits pick nothing
                self.backend.prefilled(run.cache, run.request.prompt)
                run.result.first_token_step = step
            token = int(sampler(out[-1]))
            run.result.tokens.append(token)
            run.result.logits.append(out[-1])
            if len(run.result.tokens) == run.request.max_new_tokens or token in stop_tokens:
                run.result.finish_step = step
                self.backend.release(run.cache)
                run.cache = None
        self.running = [run for run in self.running if run.cache is not None]
        return entries


def _check_limit(name, value):
    if value is not None and not (is_int(value) and value >= 1):
        raise ValueError(f"{name} must be an integer >= 1 or None (no limit), got {value!r}")
    return None if value is None else int(value)


def _check_requests(model, requests, backend) -> list:
    requests = [r if isinstance(r, Request) else Request(*r) for r in requests]
    if not requests:
        raise ValueError("no requests to serve")
    cfg = model.config
    for i, r in enumerate(requests):
        check_token_ids(cfg, r.prompt)
        if r.positions_needed > cfg.max_context:
            raise ValueError(f"request {i}: a {len(r.prompt)}-token prompt plus {r.max_new_tokens} new tokens "
                             f"needs {r.positions_needed} positions, but the context limit is {cfg.max_context}")
        if not backend.fits_empty(r):
            raise ValueError(f"request {i} needs {r.positions_needed} KV positions, more than the whole pool "
                             f"holds ({backend.total_blocks} blocks of {backend.block_size}); it could never run")
    return requests


def run_schedule(model: Model, requests, *, token_budget: int | None = 8, max_running: int | None = None,
                 chunk_size: int | None = None, policy: str = "decode_first", backend=None,
                 sampler=greedy, stop_tokens=(), record_wall: bool = False,
                 max_steps: int = 100_000) -> Schedule:
    """Serve `requests` with continuous batching; return the per-step log and per-request results.

    token_budget: most rows (tokens) in one step's batch (None: no limit)
    max_running:  most requests admitted at once (default: token_budget, so every running
                  request can always decode in the same step)
    chunk_size:   most prompt tokens one request prefills in one step (None: up to the budget)
    policy:       "decode_first" (running decodes, then prefill chunks: a decode never waits)
                  or "prefill_first" (prompts first, decodes get what is left: they can stall)
    backend:      KV memory, a backends.KVBackend (default ContiguousKV(model), unlimited)
    """
    token_budget = _check_limit("token_budget", token_budget)
    max_running = _check_limit("max_running", max_running)
    chunk_size = _check_limit("chunk_size", chunk_size)
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if max_running is None:
        max_running = token_budget
    if token_budget is not None and max_running > token_budget:
        raise ValueError(f"max_running ({max_running}) must be <= token_budget ({token_budget}): every "
                         f"running request decodes one token per step, and they must fit in the batch")
    backend = ContiguousKV(model) if backend is None else backend
    requests = _check_requests(model, requests, backend)
    engine = _Engine(requests, backend, token_budget, max_running, chunk_size, policy,
                     arrivals=deque(sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i))),
                     results=[RequestResult(r) for r in requests])
    steps, step = [], 0
    while engine.arrivals or engine.waiting or engine.running:
        if step >= max_steps:
            raise RuntimeError(f"the schedule did not finish within max_steps={max_steps}")
        t0 = time.perf_counter() if record_wall else None
        plan = engine.plan(step)
        n_running = len(engine.running) if plan else 0
        if not plan and engine.waiting:  # nothing runs, so nothing will ever free the memory it waits for
            raise RuntimeError("the engine is stuck: waiting requests cannot be admitted into an empty pool")
        entries = engine.apply(model, plan, step, sampler, stop_tokens) if plan else []
        wall = (time.perf_counter() - t0) if record_wall else None
        steps.append(Step(step, entries, len(engine.waiting), n_running, backend.free_blocks, wall,
                          getattr(backend, "available_blocks", backend.free_blocks)))
        step += 1
    return Schedule(requests, steps, engine.results, token_budget, max_running)


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
