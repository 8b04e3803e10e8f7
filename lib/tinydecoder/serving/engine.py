"""The continuous-batching engine: its state between steps, and one step = plan + one
`forward_batch` call + apply. `scheduler.run_schedule` drives it over a request list; a server
(`tinydecoder.server`) drives the same object from its engine thread, adding and cancelling
requests between steps.

    engine = Engine(model, backend=PagedKV(model, 64, 16, admission="on_demand"))
    i = engine.add(Request(prompt, 8))       # joins the waiting queue
    while engine.busy:
        log = engine.step()                  # EngineStep: who ran, preempted, free blocks
    engine.results[i].tokens

Preemption (backend admission "on_demand"): blocks are taken as rows are planned. When the
pool has too few for a running request's next rows, the NEWEST running request is preempted:
its blocks go back to the pool, it returns to the FRONT of the waiting queue, and on
readmission it prefills its prompt plus the tokens it had generated (recompute; prefix reuse
often finds the prompt's blocks still cached), whose last logits pick its next token. A
greedy request therefore returns the same tokens as when it runs alone.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from ..core.model import Model
from ..core.validate import check_token_ids, limit
from ..decoding.processors import apply_processors
from ..decoding.sampling import greedy
from ..fast import forward_batch
from .backends import ContiguousKV
from .requests import DECODE, PREFILL, EngineStep, Request, RequestResult, Work

POLICIES = ("decode_first", "prefill_first")


@dataclass
class _Running:
    index: int
    request: Request
    cache: object
    target: list  # tokens to prefill: the prompt, plus the tokens generated before a preemption
    fed: int  # of `target`, already in the cache
    result: RequestResult

    @property
    def decoding(self) -> bool:
        return self.fed == len(self.target)


class Engine:
    """Requests waiting and running, a KV backend, and `step()`: plan who runs (decodes first,
    then prefill chunks, then admissions in arrival order, under the token budget), run the
    batch in ONE forward_batch call, then record tokens, finishes and freed memory."""

    def __init__(self, model: Model, *, backend=None, token_budget: int | None = 8, max_running: int | None = None,
                 chunk_size: int | None = None, policy: str = "decode_first", sampler=greedy, stop_tokens=(),
                 keep_logits: bool = True, trace=None):
        self.token_budget = limit("token_budget", token_budget)
        max_running = limit("max_running", max_running)
        self.chunk_size = limit("chunk_size", chunk_size)
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.max_running = self.token_budget if max_running is None else max_running
        if self.token_budget is not None and self.max_running > self.token_budget:
            raise ValueError(f"max_running ({self.max_running}) must be <= token_budget ({self.token_budget}): every "
                             f"running request decodes one token per step, and they must fit in the batch")
        self.model, self.policy, self.sampler = model, policy, sampler
        self.backend = ContiguousKV(model) if backend is None else backend
        self.stop_tokens, self.keep_logits = frozenset(int(t) for t in stop_tokens), bool(keep_logits)
        self.requests, self.results = [], []
        self.waiting, self.running = deque(), []
        self.steps_run = 0
        self.preemptions = 0
        self.trace = trace  # a trace_events.TraceRecorder, or None: no call, no cost

    # ------------------------------------------------------------------ requests
    def check(self, request: Request, label: str = "the request") -> Request:
        """Raise ValueError unless `request` can ever run on this model and pool."""
        if not isinstance(request, Request):
            raise TypeError(f"{label} must be a scheduler Request, got {type(request).__name__}")
        cfg, backend = self.model.config, self.backend
        check_token_ids(cfg, request.prompt)
        if request.positions_needed > cfg.max_context:
            raise ValueError(f"{label}: a {len(request.prompt)}-token prompt plus {request.max_new_tokens} new tokens "
                             f"needs {request.positions_needed} positions, but the context limit is {cfg.max_context}")
        if not backend.fits_empty(request):
            raise ValueError(f"{label} needs {request.positions_needed} KV positions, more than the whole pool "
                             f"holds ({backend.total_blocks} blocks of {backend.block_size}); it could never run")
        return request

    def register(self, request: Request) -> int:
        """Record a request (checked) without queueing it; returns its index."""
        self.check(request, f"request {len(self.requests)}")
        self.requests.append(request)
        self.results.append(RequestResult(request))
        return len(self.requests) - 1

    def enqueue(self, i: int, at: float | None = None) -> None:
        self.waiting.append(i)
        if self.trace is not None:  # at: its arrival on the recorder's clock (default: now)
            self.trace.arrive(i, self.requests[i].name, at)

    def add(self, request: Request, at: float | None = None) -> int:
        """Register and queue a request (it may be admitted from the next step on); its index."""
        i = self.register(request)
        self.enqueue(i, at)
        return i

    def cancel(self, i: int, reason: str = "cancelled") -> bool:
        """End request i now (between steps): its blocks go back to the pool. False if it had finished.
        `reason` is the finish reason a trace records."""
        result = self.results[i]
        if result.finished:
            return False
        if i in self.waiting:
            self.waiting.remove(i)
        for run in self.running:
            if run.index == i:
                self.backend.release(run.cache)
                self.running.remove(run)
                break
        result.cancelled, result.finish_step = True, self.steps_run
        if self.trace is not None:
            self.trace.finish(i, reason, result)
        return True

    def forget(self, i: int) -> None:
        """Drop a finished request's record (a long-running server keeps no history)."""
        if not self.results[i].finished:
            raise ValueError(f"request {i} has not finished; cancel it first")
        self.requests[i] = self.results[i] = None

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ one step
    def step(self, record_wall: bool = False) -> EngineStep:
        """Plan and run one step (possibly idle); returns its log."""
        t0 = time.perf_counter() if record_wall else None
        index, self._preempted, trace = self.steps_run, [], self.trace
        if trace is not None:
            trace.step_begin(index)
        plan = self._plan(index)
        n_running = len(self.running) if plan else 0
        if not plan and self.waiting and not self.running:  # nothing will ever free the memory it waits for
            raise RuntimeError("the engine is stuck: waiting requests cannot be admitted into an empty pool")
        entries = self._apply(plan, index) if plan else []
        self.steps_run += 1
        backend = self.backend
        log = EngineStep(index, entries, len(self.waiting), n_running, backend.free_blocks,
                         (time.perf_counter() - t0) if record_wall else None,
                         getattr(backend, "available_blocks", backend.free_blocks), self._preempted)
        if trace is not None:
            trace.step_end(log, self.results)
        return log

    def _plan(self, step: int) -> list:
        """This step's batch: [(_Running, phase, n_tokens)]; admits waiting requests (FCFS)."""
        self._budget = float("inf") if self.token_budget is None else self.token_budget
        plan = []
        if self.policy == "decode_first":
            self._plan_decodes(plan)
        for run in list(self.running):  # prefill chunks of admitted requests, oldest first
            if run.cache is not None and not run.decoding and self._budget > 0:
                self._plan_chunk(plan, run)
        while self.waiting and self._budget > 0 and len(self.running) < (self.max_running or float("inf")):
            i = self.waiting[0]
            if not self.backend.can_admit(self.requests[i], self._target(i)):
                break  # first come, first served: it blocks those behind it
            self.waiting.popleft()
            if not self._plan_chunk(plan, self._admit(i, step)):
                break
        if self.policy == "prefill_first":
            self._plan_decodes(plan)  # what is left of the budget; the rest wait (their TPOT grows)
        return plan

    def _plan_decodes(self, plan):  # every decoding request: one token each, while the budget lasts
        for run in list(self.running):
            if run.cache is not None and run.decoding and self._budget > 0:
                self._take(plan, run, DECODE, 1)

    def _plan_chunk(self, plan, run) -> bool:
        left = len(run.target) - run.fed
        return self._take(plan, run, PREFILL, int(min(left, self._budget, self.chunk_size or left)))

    def _take(self, plan, run, phase, n) -> bool:
        """Plan n rows of `run`, taking their KV blocks now; when the pool is short, preempt the
        newest running request until they fit (False if `run` itself was the one preempted)."""
        while not self.backend.reserve(run.cache, n):
            victim = self.running[-1]  # the newest admitted
            self._preempt(victim, plan)
            if victim is run:
                return False
        plan.append((run, phase, n))
        self._budget -= n
        return True

    def _preempt(self, run, plan) -> None:
        for entry in [e for e in plan if e[0] is run]:
            plan.remove(entry)
            self._budget += entry[2]
        self.backend.release(run.cache)
        run.cache = None
        self.running.remove(run)
        self.waiting.appendleft(run.index)
        run.result.preemptions += 1
        self.preemptions += 1
        self._preempted.append(run.index)

    def _target(self, i: int) -> list:
        return list(self.requests[i].prompt) + list(self.results[i].tokens)

    def _admit(self, i: int, step: int) -> _Running:
        request, backend, result = self.requests[i], self.backend, self.results[i]
        target = self._target(i)
        cache, cached = backend.admit(request, target)
        if not 0 <= cached < len(target) or len(cache) != cached:
            raise RuntimeError(f"backend {type(backend).__name__} admitted request {i} with {cached} cached "
                               f"tokens and a cache of {len(cache)} positions; it must hold 0 <= cached < "
                               f"{len(target)} positions, the same in both")
        if result.admitted is None:
            result.admitted, result.cached_tokens = step, cached
        run = _Running(i, request, cache, target, cached, result)
        self.running.append(run)
        return run

    def _apply(self, plan, step) -> list:
        """Run the planned batch in ONE forward_batch call; returns the step's Work entries."""
        ids, caches, entries = [], [], []
        for run, phase, n in plan:
            if phase == DECODE:
                ids.append([run.result.tokens[-1]])
            else:
                ids.append(run.target[run.fed:run.fed + n])
                run.result.prefill_chunks.append((step, n))
            caches.append(run.cache)
            entries.append(Work(run.index, phase, n, len(run.cache)))
        if self.trace is not None:
            self.trace.forward_begin(plan, self._preempted)
        logits = forward_batch(self.model, ids, caches, last_only=True)  # one pass for the batch
        if self.trace is not None:
            self.trace.forward_end()
        for (run, phase, n), out in zip(plan, logits):
            if phase == PREFILL:
                run.fed += n
                if not run.decoding:
                    continue  # a middle chunk: its logits pick nothing
                self.backend.prefilled(run.cache, run.target)
                if run.result.first_token_step is None:
                    run.result.first_token_step = step
            self._choose(run, out[-1], step)
        self.running = [run for run in self.running if run.cache is not None]
        return entries

    def _choose(self, run, logits, step) -> None:
        request, result = run.request, run.result
        if request.processors:
            logits = apply_processors(request.processors, list(request.prompt) + result.tokens, logits)
        token = int((request.sampler or self.sampler)(logits))
        result.tokens.append(token)
        if self.keep_logits:
            result.logits.append(logits)
        if (len(result.tokens) == request.max_new_tokens or token in self.stop_tokens
                or token in request.stop_tokens):
            result.finish_step = step
            self.backend.release(run.cache)
            run.cache = None
