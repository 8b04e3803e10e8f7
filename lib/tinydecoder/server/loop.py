"""The engine loop: one thread that owns the Part III engine (serving.engine.Engine over a
paged KV pool with prefix reuse, chunked prefill and preemption) and runs it step after step.

HTTP handlers never touch the engine. They `submit` a request and read its events from an
asyncio queue; they `cancel` it when the client goes away. Submissions and cancellations are
applied between steps, so requests join and leave the batch only there.

    loop = EngineLoop(served, kv_blocks=256, max_batch=16); loop.start()
    handle = loop.submit(Request(ids, 32), asyncio_loop)   # QueueFullError when too many wait
    await handle.events.get()   # StreamEvent(tokens=[...], finish_reason=None | "stop" | "length" | "cancelled")
    loop.stop()                 # cancels what is left, joins the thread (bounded)
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from ..serving.backends import PagedKV
from ..serving.engine import Engine
from ..serving.requests import Request
from .metrics import ServerMetrics


class QueueFullError(RuntimeError):
    """Too many requests are waiting; the client should retry later (HTTP 503)."""


@dataclass
class StreamEvent:
    """What a request's stream receives from the engine: new tokens, and how it ended."""

    tokens: list  # new token ids since the last event
    finish_reason: str | None = None  # None while running; "stop", "length" or "cancelled" at the end
    preempted: bool = False


@dataclass
class Handle:
    request: Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    arrival: float = field(default_factory=time.perf_counter)
    index: int | None = None  # in the engine, once admitted to it
    sent: int = 0  # tokens already delivered
    first_token: float | None = None
    preemptions: int = 0
    done: bool = False

    def deliver(self, event: StreamEvent) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class EngineLoop:
    """The engine on its own thread; see the module docstring."""

    def __init__(self, served, *, kv_blocks: int = 256, max_batch: int = 16, token_budget: int | None = None,
                 chunk_size: int | None = 64, max_waiting: int = 64, step_pause_s: float = 0.0,
                 metrics: ServerMetrics | None = None, trace=None):
        self.served = served
        self.backend = PagedKV(served.model, kv_blocks, served.block_size, cache_prefixes=True,
                               admission="on_demand")
        budget = token_budget or max(max_batch, 64) + max_batch
        self.engine = Engine(served.model, backend=self.backend, token_budget=budget, max_running=max_batch,
                             chunk_size=chunk_size, stop_tokens=() if served.eos_id is None else (served.eos_id,),
                             keep_logits=False, trace=trace)
        self.trace = trace  # a serving.trace_events.TraceRecorder (saved on stop if it has a path), or None
        self.max_waiting = int(max_waiting)
        self.step_pause_s = float(step_pause_s)  # > 0: slow motion (a notebook's timeline, a test's disconnect)
        self.metrics = metrics or ServerMetrics()
        self.metrics.blocks_total.set(kv_blocks)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._inbox, self._cancels, self._live = [], [], {}
        self._stopping = False
        self._hits = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tinydecoder-engine", daemon=True)
        self._publish()

    # ------------------------------------------------------------- from handlers
    def check(self, request: Request) -> None:
        """ValueError unless the request could ever run (context and pool size)."""
        self.engine.check(request)

    def submit(self, request: Request, loop: asyncio.AbstractEventLoop) -> Handle:
        self.check(request)
        with self._lock:
            if self._stopping:
                raise QueueFullError("the server is shutting down")
            if len(self._inbox) + len(self.engine.waiting) >= self.max_waiting:
                raise QueueFullError(f"{self.max_waiting} requests are already waiting")
            handle = Handle(request, loop, asyncio.Queue())
            self._inbox.append(handle)
        self._wake.set()
        return handle

    def cancel(self, handle: Handle, reason: str = "cancelled") -> None:
        """End the request (no-op once it finished); its blocks return between steps. `reason`
        goes into its last event ("cancelled": the client went away; "stop": a stop string)."""
        with self._lock:
            if not handle.done:
                self._cancels.append((handle, reason))
        self._wake.set()

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every request still queued or running, stop the thread (waits at most `timeout` s)."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self.trace is not None and self.trace.path is not None:
            self.trace.save()  # valid JSON on every shutdown, Ctrl-C included

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def pool_stats(self):
        return self.backend.pool.stats()

    # ------------------------------------------------------------- the thread
    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    inbox, self._inbox = self._inbox, []
                    cancels, self._cancels = self._cancels, []
                    stopping = self._stopping
                for h in inbox:
                    h.index = self.engine.add(h.request, self._arrival(h))
                    self._live[h.index] = h
                    self.metrics.prompt_tokens.inc(len(h.request.prompt))
                for h, reason in cancels + ([(h, "cancelled") for h in self._live.values()] if stopping else []):
                    if not h.done:
                        self.engine.cancel(h.index, reason)
                        self._finish(h, reason)
                if stopping:
                    break
                if not self.engine.busy:
                    self._publish()
                    self._wake.wait(0.1)
                    self._wake.clear()
                    continue
                log = self.engine.step()
                self._after_step(log)
                if self.step_pause_s:
                    time.sleep(self.step_pause_s)
        except BaseException as e:  # a bug: tell every client, keep the process alive for /health to report it
            self.error = e
            for h in list(self._live.values()):
                if self.trace is not None:
                    self.trace.finish(h.index, "error")
                self._finish(h, "error")
            raise
        finally:
            self._publish()

    def _arrival(self, h: Handle):
        """When the handler submitted it, for the trace (if the trace's clock is the handle's)."""
        return h.arrival if self.trace is not None and self.trace.clock is time.perf_counter else None

    def _after_step(self, log) -> None:
        now = time.perf_counter()
        m = self.metrics
        m.steps.inc()
        m.preemptions.inc(len(log.preempted))
        for i in log.preempted:
            self._live[i].preemptions += 1
        for w in log.entries:
            h = self._live.get(w.request)
            if h is None:
                continue
            result = self.engine.results[w.request]
            new = result.tokens[h.sent:]
            if not new:
                continue
            if h.first_token is None:
                h.first_token = now
                m.ttft.observe(now - h.arrival)
            h.sent += len(new)
            m.generated_tokens.inc(len(new))
            if result.finished:
                ended = result.tokens[-1] in self.engine.stop_tokens  # an end token on the last allowed step
                reason = "length" if len(result.tokens) >= h.request.max_new_tokens and not ended else "stop"
                if h.sent > 1:
                    m.tpot.observe((now - h.first_token) / (h.sent - 1))
                self._finish(h, reason, new)
            else:
                h.deliver(StreamEvent(new))
        self._publish()

    def _finish(self, h: Handle, reason: str, tokens=()) -> None:
        h.done = True
        h.deliver(StreamEvent(list(tokens), reason))
        self._live.pop(h.index, None)
        if h.index is not None:
            self.engine.forget(h.index)

    def _publish(self) -> None:
        m, pool = self.metrics, self.backend.pool
        m.running.set(len(self.engine.running))
        m.waiting.set(len(self.engine.waiting) + len(self._inbox))
        m.blocks_used.set(pool.blocks_used)
        m.blocks_free.set(pool.blocks_free)
        m.prefix_hits.inc(pool.prefix_hit_tokens - self._hits)
        self._hits = pool.prefix_hit_tokens
