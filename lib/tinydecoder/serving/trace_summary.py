"""Reading a request trace (trace_events.py): per request, where its time went; per engine, what
share of the wall time each phase of a step took.

    events = load_trace("run.json")            # or recorder.trace()["traceEvents"]
    request_summary(events)   # [{"request", "queued_steps", "prefill_chunks", "decode_steps", ...}]
    engine_shares(events)     # {"plan": s, "forward": s, "sample": s, "between steps": s}, fractions
"""
from __future__ import annotations

from .trace_events import ENGINE_PID, REQUESTS_PID

PHASES = ("queued", "prefill", "decode")


def request_names(events) -> dict:
    """tid -> the name of its request track, for the requests' process."""
    return {e["tid"]: e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == REQUESTS_PID}


def request_summary(events) -> list:
    """One dict per request track, in track order: its name; counts (exact: steps and events)
    queued_steps (engine steps it waited, arrival and preemptions together), prefill_chunks,
    decode_steps, tokens (spans that chose a token), preemptions, finish_reason; and times in
    microseconds: queued_us, prefill_us, decode_us (sums of its spans) and total_us (its
    "request" span, arrival to finish; None if it has not finished)."""
    names = request_names(events)
    rows = {tid: {"request": name, "queued_steps": 0, "prefill_chunks": 0, "decode_steps": 0, "tokens": 0,
                  "preemptions": 0, "finish_reason": None, "queued_us": 0.0, "prefill_us": 0.0, "decode_us": 0.0,
                  "total_us": None} for tid, name in sorted(names.items())}
    for e in events:
        if e["ph"] == "M" or e["pid"] != REQUESTS_PID or e["tid"] not in rows:
            continue
        row, name = rows[e["tid"]], e["name"]
        if name in PHASES:
            row[f"{name}_us"] += e["dur"]
            if name == "queued":
                row["queued_steps"] += e["args"].get("steps", 0)
            else:
                row["prefill_chunks" if name == "prefill" else "decode_steps"] += 1
                row["tokens"] += "token" in e["args"]
        elif name == "preempted":
            row["preemptions"] += 1
        elif name == "finish":
            row["finish_reason"] = e["args"]["finish_reason"]
        elif name == "request":
            row["total_us"] = e["dur"]
    return list(rows.values())


def engine_shares(events) -> dict:
    """Fractions of the engine's wall time, from the first step's start to the last step's end:
    "plan", "forward", "sample" (summed over steps), "idle steps" (steps that ran nothing) and
    "between steps" (the driver's own time: arrivals, a server's inbox and replies). They add up to 1."""
    spans = [e for e in events if e["ph"] == "X" and e["pid"] == ENGINE_PID]
    steps = [e for e in spans if e["name"] == "step"]
    if not steps:
        raise ValueError("the trace has no engine steps")
    wall = max(e["ts"] + e["dur"] for e in steps) - min(e["ts"] for e in steps)
    if wall <= 0:
        raise ValueError("the trace's steps take no time: was it recorded with a clock that stands still?")
    shares = {p: sum(e["dur"] for e in spans if e["name"] == p) / wall for p in ("plan", "forward", "sample")}
    in_steps = sum(e["dur"] for e in steps) / wall
    shares["idle steps"] = max(0.0, in_steps - sum(shares.values()))
    shares["between steps"] = 1.0 - in_steps
    return shares
