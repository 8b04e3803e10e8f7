"""A request trace (serving.trace_events) drawn as a timeline: one row per request, time across."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

__all__ = ["TRACE_COLORS", "trace_timeline"]

TRACE_COLORS = {"queued": "#d9d9d9", "prefill": "C1", "decode": "C0"}


def trace_timeline(ax, events, *, title=None, unit="ms"):
    """Each request's spans from a Chrome trace (a list of trace events): queued light grey,
    prefill chunks orange, decode steps blue, one bar per span, in real time from the first
    event; a red x where it was preempted, a black | where it finished. Rows in track order,
    labelled with the track names. unit: "ms" or "us" on the x axis. Returns {phase: number of
    bars drawn}."""
    from ..serving.trace_events import REQUESTS_PID
    from ..serving.trace_summary import request_names

    scale = {"ms": 1e-3, "us": 1.0}.get(unit)
    if scale is None:
        raise ValueError(f"unit must be 'ms' or 'us', got {unit!r}")
    names = request_names(events)
    if not names:
        raise ValueError("the trace has no request tracks (was the recorder given to the engine?)")
    rows = {tid: k for k, tid in enumerate(sorted(names))}
    timed = [e for e in events if e["ph"] != "M"]
    t0 = min(e["ts"] for e in timed)
    bars = {phase: [[] for _ in rows] for phase in TRACE_COLORS}
    for e in timed:
        if e["pid"] != REQUESTS_PID or e["tid"] not in rows:
            continue
        k, x = rows[e["tid"]], (e["ts"] - t0) * scale
        if e["name"] in bars:
            bars[e["name"]][k].append((x, max(e["dur"] * scale, 1e-9)))
        elif e["name"] == "preempted":
            ax.plot(x, k, marker="x", color="crimson", markersize=9, markeredgewidth=2, zorder=3)
        elif e["name"] == "finish":
            ax.plot(x, k, marker="|", color="black", markersize=14, markeredgewidth=2, zorder=3)
    counts = {}
    for phase, per_row in bars.items():
        for k, spans in enumerate(per_row):
            if spans:
                ax.broken_barh(spans, (k - 0.35, 0.7), facecolors=TRACE_COLORS[phase],
                               edgecolors="white", linewidth=0.4)
        counts[phase] = sum(len(s) for s in per_row)
    ax.set_yticks(range(len(rows)), labels=[names[tid] for tid in sorted(names)])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel(f"time since the first event ({'ms' if unit == 'ms' else 'µs'})")
    ax.set_ylabel("request")
    ax.legend(handles=[Patch(facecolor=c, label=p) for p, c in TRACE_COLORS.items()] +
              [plt.Line2D([], [], marker="x", color="crimson", linestyle="", label="preempted"),
               plt.Line2D([], [], marker="|", color="black", linestyle="", markersize=12, label="finish")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if title:
        ax.set_title(title)
    return counts
