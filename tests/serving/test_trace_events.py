"""The request trace (serving/trace_events.py): Chrome trace-event JSON from the engine."""
import json
from collections import Counter

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.serving.backends import PagedKV
from tinydecoder.serving.engine import Engine
from tinydecoder.serving.scheduler import Request, run_schedule
from tinydecoder.serving.trace_events import REQUESTS_PID, GenerateTrace, TraceRecorder, load_trace

TOY = td.toy_model()
# Times are written as microseconds with 3 decimals: a span's ts + dur, added in floats, can pass the
# next span's equal ts by a rounding (53.61 + 199.67 = 253.28000000000003).
ROUNDING_US = 1e-6


class FakeClock:
    """Advances 1 ms per reading: deterministic timestamps, strictly increasing."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        self.t += 0.001
        return self.t


def workload():
    rng = np.random.default_rng(3)
    return [Request(rng.integers(0, 6, size=n), m, a, f"r{k}")
            for k, (n, m, a) in enumerate([(9, 12, 0), (5, 14, 0), (7, 10, 1), (6, 12, 2)])]


def by_request(events):
    out = {}
    for e in events:
        if e["ph"] != "M" and e["pid"] == REQUESTS_PID:
            out.setdefault(e["tid"] - 1, []).append(e)
    return out


def check_request_trace(events, results):
    """What every request's track must show: one token-choosing span per generated token (the
    first from a prefill chunk, every other one a decode step), a wait before the first
    schedule, a finish with its reason, spans in time order that do not overlap."""
    tracks = by_request(events)
    assert sorted(tracks) == list(range(len(results)))
    for i, r in enumerate(results):
        evs = tracks[i]
        work = [e for e in evs if e["name"] in ("prefill", "decode")]
        chosen = [e["args"]["token"] for e in work if "token" in e["args"]]
        assert chosen == r.tokens, f"request {i}"
        decodes = [e for e in work if e["name"] == "decode"]
        assert all("token" in e["args"] for e in decodes)
        assert len(decodes) == len(r.tokens) - 1 - r.preemptions  # a recompute's last chunk picks one token
        assert [e["args"]["tokens"] for e in work if e["name"] == "prefill"] == [n for _, n in r.prefill_chunks]
        queued = [e for e in evs if e["name"] == "queued"]
        assert len(queued) == 1 + r.preemptions and queued[0]["args"]["after"] == "arrival"
        assert queued[0]["args"]["step"] == r.admitted
        assert sum(e["name"] == "preempted" for e in evs) == r.preemptions
        finish = [e for e in evs if e["name"] == "finish"]
        assert len(finish) == 1 and finish[0]["args"]["finish_reason"] == "length"
        assert finish[0]["args"]["generated_tokens"] == len(r.tokens)
        spans = sorted((e for e in evs if e["name"] in ("queued", "prefill", "decode")), key=lambda e: e["ts"])
        for a, b in zip(spans, spans[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + ROUNDING_US, (a, b)
        request = next(e for e in evs if e["name"] == "request")
        assert all(request["ts"] <= e["ts"] and e["ts"] + e.get("dur", 0) <= request["ts"] + request["dur"] + ROUNDING_US
                   for e in evs)
    timed = [e for e in events if e["ph"] != "M"]
    assert [e["ts"] for e in timed] == sorted(e["ts"] for e in timed)
    assert all(e.get("dur", 0) >= 0 for e in timed)


def test_an_engine_trace_has_every_decode_step_queue_prefill_preemption_and_finish(tmp_path):
    trace = TraceRecorder(tmp_path / "t.json", clock=FakeClock())
    backend = PagedKV(TOY, n_blocks=10, block_size=4, admission="on_demand")
    sched = run_schedule(TOY, workload(), token_budget=8, chunk_size=4, backend=backend, trace=trace)
    assert sched.summary()["preemptions"] >= 1  # the small pool preempts
    events = load_trace(trace.save())
    check_request_trace(events, sched.results)
    steps = [e for e in events if e["name"] == "step"]
    assert [e["args"]["step"] for e in steps] == list(range(sched.total_steps))
    assert [e["args"]["rows"] for e in steps] == [s.batch_tokens for s in sched.steps]
    names = Counter(e["name"] for e in events)
    assert names["forward"] == names["sample"] == sched.forward_calls
    meta = {(e["pid"], e.get("tid"), e["name"]): e["args"]["name"] for e in events if e["ph"] == "M"}
    assert meta[(REQUESTS_PID, 1, "thread_name")] == "r0" and meta[(1, None, "process_name")] == "engine"


def test_the_trace_changes_no_token_and_is_valid_json(tmp_path):
    reqs = workload()
    plain = run_schedule(TOY, reqs, token_budget=8)
    trace = TraceRecorder(tmp_path / "t.json")  # the real clock
    traced = run_schedule(TOY, reqs, token_budget=8, trace=trace)
    assert [r.tokens for r in traced.results] == [r.tokens for r in plain.results]
    with open(trace.save()) as f:
        data = json.load(f)
    check_request_trace(data["traceEvents"], traced.results)


def test_a_cancelled_request_ends_with_its_reason(tmp_path):
    trace = TraceRecorder(clock=FakeClock())
    engine = Engine(TOY, token_budget=8, max_running=1, trace=trace)
    a, b = engine.add(Request([0, 1, 2], 20)), engine.add(Request([5, 4, 3], 20))
    engine.step()
    assert engine.cancel(b, "stop") and engine.cancel(a)
    events = trace.trace()["traceEvents"]
    tracks = by_request(events)
    assert [e["args"]["finish_reason"] for e in tracks[a] if e["name"] == "finish"] == ["cancelled"]
    assert [e["args"]["finish_reason"] for e in tracks[b] if e["name"] == "finish"] == ["stop"]
    assert [e["args"]["after"] for e in tracks[b] if e["name"] == "queued"] == ["arrival"]  # it never ran
    with pytest.raises(ValueError, match="no path"):
        trace.save()


def test_generate_trace_records_one_round_per_token(tmp_path):
    trace = TraceRecorder(tmp_path / "g.json", clock=FakeClock())
    proc = GenerateTrace(trace)
    gen = td.generate(TOY, [0, 1, 2, 3], 6, processors=[proc])
    proc.close()
    assert gen.new_tokens == td.generate(TOY, [0, 1, 2, 3], 6).new_tokens
    events = load_trace(trace.save())
    work = [e for e in events if e["name"] in ("prefill", "decode")]
    assert [e["name"] for e in work] == ["prefill"] + ["decode"] * 5
    assert [e["args"]["token"] for e in work] == gen.new_tokens
    assert [e["args"]["finish_reason"] for e in events if e["name"] == "finish"] == ["length"]
    assert Counter(e["name"] for e in events)["forward"] == 6


def test_the_summary_counts_what_the_schedule_did():
    from tinydecoder.serving.trace_summary import engine_shares, request_summary

    trace = TraceRecorder(clock=FakeClock())
    backend = PagedKV(TOY, n_blocks=10, block_size=4, admission="on_demand")
    sched = run_schedule(TOY, workload(), token_budget=8, chunk_size=4, backend=backend, trace=trace)
    rows = request_summary(trace.trace()["traceEvents"])
    assert [r["request"] for r in rows] == ["r0", "r1", "r2", "r3"]
    steps_scheduled = {}
    for s in sched.steps:
        for w in s.entries:
            steps_scheduled.setdefault(w.request, set()).add(s.index)
    for i, (row, r) in enumerate(zip(rows, sched.results)):
        assert row["tokens"] == len(r.tokens) and row["preemptions"] == r.preemptions
        assert row["prefill_chunks"] == len(r.prefill_chunks)
        assert row["decode_steps"] == len(r.tokens) - 1 - r.preemptions
        # the steps it waited: from arrival to its finish, every step it was not scheduled in, minus
        # the steps it was running but given no work (admitted, its turn not come)
        lifetime = set(range(r.request.arrival, r.finish_step + 1))
        assert row["queued_steps"] <= len(lifetime - steps_scheduled[i])
        assert row["queued_steps"] >= r.admitted - r.request.arrival
        assert row["finish_reason"] == "length"
        assert row["total_us"] >= row["queued_us"] + row["prefill_us"] + row["decode_us"] > 0
    shares = engine_shares(trace.trace()["traceEvents"])
    assert set(shares) == {"plan", "forward", "sample", "idle steps", "between steps"}
    assert abs(sum(shares.values()) - 1) < 1e-9 and all(v >= -1e-12 for v in shares.values())
    with pytest.raises(ValueError, match="no engine steps"):
        engine_shares([])
