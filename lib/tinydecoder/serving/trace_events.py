"""A trace of every request, in Chrome's trace-event JSON (open it in https://ui.perfetto.dev or
chrome://tracing). Not `core.trace`, which traces the ops of one forward pass.

    trace = TraceRecorder("run.json")
    engine = Engine(model, backend=..., trace=trace)   # or EngineLoop(served, trace=trace)
    ... run it ...
    trace.save()                                       # {"traceEvents": [...]}, valid JSON

Two processes in the file. "engine" has one track of engine steps: a "step" span holding its
"plan", its "forward" (the one batched pass) and its "sample" (tokens chosen, finishes recorded).
"requests" has one track per request: "queued" (arrival, or a preemption, until it is next
scheduled), one "prefill" span per prompt chunk, one "decode" span per decode step, a
"preempted" instant and a "finish" instant (args.finish_reason: "length", "stop", "cancelled",
...), all inside one "request" span. Every span whose step chose a token for the request carries
args.token: the first token comes from the last prefill chunk, each later one from a decode step
(after a preemption, the recompute's last chunk chooses the next one). args.step is the engine
step, so counts in steps are exact while the microseconds are the machine's.

Times are "X" (complete) events with ts and dur in microseconds from the recorder's start; the
clock is `time.perf_counter` unless another is given (a test's fake clock). An engine without a
recorder (trace=None, the default) makes no call here. `GenerateTrace` is a logits processor that
records one sequence's rounds the same way (`generate --trace FILE`)."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

ENGINE_PID, REQUESTS_PID = 1, 2
STEPS_TID = 1


class TraceRecorder:
    """Collects trace events in memory; `save()` writes them (atomically) as one JSON object."""

    def __init__(self, path=None, *, clock=time.perf_counter, process_names=("engine", "requests")):
        self.path = None if path is None else Path(path)
        self.clock = clock
        self.t0 = clock()
        self.events = []
        self._lock = threading.Lock()
        self._named = set()
        self._queued = {}  # request index -> (since, why): its open "queued" span
        self._arrived = {}  # request index -> arrival time (the "request" span's start)
        self._step = None  # the open step: dict of its times and planned rows
        self.steps_seen = 0  # engine steps ended: a request queued now is first schedulable in this step
        self.meta(ENGINE_PID, None, "process_name", process_names[0])
        self.meta(REQUESTS_PID, None, "process_name", process_names[1])
        self.meta(ENGINE_PID, STEPS_TID, "thread_name", "engine steps")

    # ------------------------------------------------------------------ raw events
    def us(self, t: float) -> float:
        """A clock reading as microseconds since the recorder started."""
        return round((t - self.t0) * 1e6, 3)

    def meta(self, pid, tid, name, value) -> None:
        event = {"name": name, "ph": "M", "pid": pid, "args": {"name": value}}
        if tid is not None:
            event["tid"] = tid
        self._add(event)

    def complete(self, name, start, end, pid, tid, cat, **args) -> None:
        """An "X" event from clock reading `start` to `end`."""
        ts, dur = self.us(start), max(0.0, round(self.us(end) - self.us(start), 3))
        self._add({"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args})

    def instant(self, name, at, pid, tid, cat, **args) -> None:
        self._add({"name": name, "cat": cat, "ph": "i", "s": "t", "ts": self.us(at), "pid": pid, "tid": tid,
                   "args": args})

    def _add(self, event) -> None:
        with self._lock:
            self.events.append(event)

    def request_track(self, i: int, name: str | None = None) -> int:
        tid = i + 1
        if tid not in self._named:
            self._named.add(tid)
            self.meta(REQUESTS_PID, tid, "thread_name", name or f"request {i}")
            self.meta(REQUESTS_PID, tid, "thread_sort_index", tid)
        return tid

    # ------------------------------------------------------------------ engine hooks
    def arrive(self, i: int, name: str | None = None, at: float | None = None) -> None:
        """Request i joined the waiting queue (at: its arrival on this clock; default now)."""
        at = self.clock() if at is None else at
        self.request_track(i, name)
        self._arrived[i] = at
        self._queued[i] = (at, "arrival", self.steps_seen)

    def step_begin(self, step: int) -> None:
        self._step = {"step": step, "begin": self.clock()}

    def forward_begin(self, plan, preempted) -> None:
        """The batch is planned: [(run, phase, n_tokens)] as the engine's _apply gets it, and the
        requests preempted while planning it (their wait starts; one readmitted at once ends it)."""
        s, now = self._step, self.clock()
        s["plan_end"] = now
        self._preemptions(preempted, now)
        s["rows"] = [(run.index, phase, n, len(run.result.tokens), len(run.cache)) for run, phase, n in plan]
        for run, _, _ in plan:  # first scheduled since arrival or preemption: its wait ends here
            if run.index in self._queued:
                since, why, from_step = self._queued.pop(run.index)
                self.complete("queued", since, now, REQUESTS_PID, self.request_track(run.index), "request",
                              step=s["step"], after=why, steps=s["step"] - from_step)

    def forward_end(self) -> None:
        self._step["forward_end"] = self.clock()

    def step_end(self, log, results) -> None:
        """The step's log (EngineStep) and the engine's results list."""
        s, end = self._step, self.clock()
        step = s["step"]
        tid = STEPS_TID
        if "rows" in s:
            self.complete("plan", s["begin"], s["plan_end"], ENGINE_PID, tid, "engine", step=step)
            self.complete("forward", s["plan_end"], s["forward_end"], ENGINE_PID, tid, "engine", step=step,
                          rows=sum(r[2] for r in s["rows"]), requests=len(s["rows"]))
            self.complete("sample", s["forward_end"], end, ENGINE_PID, tid, "engine", step=step)
        self.complete("step", s["begin"], end, ENGINE_PID, tid, "engine", step=step, rows=log.batch_tokens,
                      requests=len(log.entries), waiting=log.waiting, running=log.running,
                      free_blocks=log.free_blocks, preempted=list(log.preempted))
        self._preemptions(log.preempted, end)
        for i, phase, n, made, start in s.get("rows", ()):
            result = results[i]
            args = {"step": step, "tokens": n, "position": start}
            if len(result.tokens) > made:
                args["token"] = result.tokens[made]
            self.complete(phase, s["plan_end"], end, REQUESTS_PID, self.request_track(i), "request", **args)
            if result.finish_step == step and not result.cancelled:
                reason = "length" if len(result.tokens) >= result.request.max_new_tokens else "stop"
                self.finish(i, reason, result, at=end)
        self._step = None
        self.steps_seen = step + 1

    def _preemptions(self, preempted, at) -> None:
        s = self._step
        if s.get("preemptions_seen"):
            return
        s["preemptions_seen"] = True
        for i in preempted:
            self.instant("preempted", at, REQUESTS_PID, self.request_track(i), "request", step=s["step"])
            self._queued[i] = (at, "preempted", s["step"])  # it lost this step

    def finish(self, i: int, reason: str, result=None, at: float | None = None) -> None:
        """Request i ended (reason: "length", "stop", "cancelled", "error", ...)."""
        at = self.clock() if at is None else at
        tid = self.request_track(i)
        if i in self._queued:  # ended while waiting (cancelled): its wait ends too
            since, why, from_step = self._queued.pop(i)
            self.complete("queued", since, at, REQUESTS_PID, tid, "request", after=why,
                          steps=max(0, self.steps_seen - from_step))
        args = {"finish_reason": reason}
        if result is not None:
            args |= {"step": result.finish_step, "prompt_tokens": len(result.request.prompt),
                     "generated_tokens": len(result.tokens), "preemptions": result.preemptions}
        self.instant("finish", at, REQUESTS_PID, tid, "request", **args)
        since = self._arrived.pop(i, at)
        self.complete("request", since, at, REQUESTS_PID, tid, "request", **args)

    # ------------------------------------------------------------------ output
    def trace(self) -> dict:
        """{"traceEvents": [...]}: metadata first, then events in time order."""
        with self._lock:
            events = list(self.events)
        meta = [e for e in events if e["ph"] == "M"]
        timed = sorted((e for e in events if e["ph"] != "M"), key=lambda e: (e["ts"], -e.get("dur", 0)))
        return {"traceEvents": meta + timed, "displayTimeUnit": "ms"}

    def save(self, path=None) -> Path:
        """Write the trace (to `path`, or the recorder's own); a temporary file is renamed over
        the target, so a reader never sees half a file. Returns the path."""
        path = Path(path) if path is not None else self.path
        if path is None:
            raise ValueError("no path to save the trace to: give TraceRecorder(path) or save(path)")
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(self.trace(), f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path


def load_trace(path) -> list:
    """The events of a trace file (its "traceEvents" list)."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path} is not a Chrome trace: expected a JSON object with a 'traceEvents' list")
    return data["traceEvents"]


class GenerateTrace:
    """A logits processor that records one sequence's rounds into a TraceRecorder (it changes no
    logits): per round a "prefill" or "decode" span on the request's track (args.token: the token
    it chose) and its "forward" and "sample" on the engine track. `generate` calls it between
    the forward and the sampler, then (is_done) after the token is chosen; call `close()` at the
    end to record a last round that ended on a stop token."""

    def __init__(self, recorder: TraceRecorder, name: str = "generate"):
        self.recorder, self.name = recorder, name
        self.tokens, self.rounds = None, 0

    def start(self, prompt) -> None:
        self.prompt_length = len(prompt)
        self.recorder.request_track(0, self.name)
        self.begin = self.recorder.clock()
        self.recorder._arrived[0] = self.begin
        self.forward_end = None

    def __call__(self, tokens, logits):
        self.tokens, self.forward_end = tokens, self.recorder.clock()
        return logits

    def is_done(self, tokens, prompt_length) -> bool:
        if self.forward_end is not None:  # a round ends once; asking again (a caller's should_stop) records nothing
            self._round(self.recorder.clock())
        return False

    def _round(self, end) -> None:
        r, step = self.recorder, self.rounds
        phase = "prefill" if step == 0 else "decode"
        fed = self.prompt_length if step == 0 else 1
        r.complete("forward", self.begin, self.forward_end, ENGINE_PID, STEPS_TID, "engine", step=step, rows=fed)
        r.complete("sample", self.forward_end, end, ENGINE_PID, STEPS_TID, "engine", step=step)
        r.complete(phase, self.begin, end, REQUESTS_PID, r.request_track(0), "request", step=step, tokens=fed,
                   token=int(self.tokens[-1]))
        self.rounds, self.begin, self.forward_end = step + 1, end, None

    def close(self, reason: str = "length") -> None:
        if self.tokens is None:
            return
        if self.forward_end is not None:  # the last round chose a stop token: is_done was not called
            self._round(self.recorder.clock())
            reason = "stop"
        self.recorder.finish(0, reason)
