"""viz.trace_timeline: a request trace drawn as one row per request."""
import matplotlib.pyplot as plt
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder import viz
from tinydecoder.serving.backends import PagedKV
from tinydecoder.serving.scheduler import Request, run_schedule
from tinydecoder.serving.trace_events import TraceRecorder
from tinydecoder.serving.trace_summary import request_summary


def test_one_bar_per_span_and_one_row_per_request():
    ticks = iter(np.arange(1.0, 1e4, 0.001))
    trace = TraceRecorder(clock=lambda: next(ticks))
    rng = np.random.default_rng(3)
    reqs = [Request(rng.integers(0, 6, size=n), m, a, name) for name, n, m, a in
            [("A", 9, 12, 0), ("B", 5, 14, 0), ("C", 7, 10, 1), ("D", 6, 12, 2)]]
    run_schedule(td.toy_model(), reqs, token_budget=8, chunk_size=4, trace=trace,
                 backend=PagedKV(td.toy_model(), n_blocks=10, block_size=4, admission="on_demand"))
    events = trace.trace()["traceEvents"]
    fig, ax = plt.subplots()
    counts = viz.trace_timeline(ax, events, title="t")
    rows = request_summary(events)
    assert counts == {"queued": sum(1 + r["preemptions"] for r in rows),
                      "prefill": sum(r["prefill_chunks"] for r in rows),
                      "decode": sum(r["decode_steps"] for r in rows)}
    assert [t.get_text() for t in ax.get_yticklabels()] == ["A", "B", "C", "D"]
    assert all(r["prefill_chunks"] and r["decode_steps"] for r in rows)
    assert len(ax.collections) == 3 * len(rows)  # one broken_barh per request and phase
    preempted = [ln for ln in ax.lines if ln.get_marker() == "x"]
    assert len(preempted) == sum(r["preemptions"] for r in rows) >= 1
    with pytest.raises(ValueError, match="unit"):
        viz.trace_timeline(ax, events, unit="s")
    with pytest.raises(ValueError, match="no request tracks"):
        viz.trace_timeline(ax, [])
