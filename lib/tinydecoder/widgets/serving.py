"""Widgets of Parts II and III: the roofline, KV capacity, the paged cache, chunked prefill, batching."""

from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np

from .. import viz
from ..core.reference import LAYER_STEPS, decoder_block, layer_input  # noqa: F401 (notebooks use widgets.layer_input)
from ..core.validate import check_token_ids
from .base import STYLE, panel, show  # noqa: F401

# ----------------------------------------------------------------------------- 18: chunked prefill

def chunked_prefill_view(model, token_ids, chunk_size):
    """Prefill token_ids in chunks of chunk_size and in one shot; compare.
    -> {"chunk_size", "spans" [(a, b)], "masks" [[b-a, b] additive], "forward_calls",
        "max_abs_diff" (max |Δ logits| over every position), "same_next_token",
        "score_pairs" (per chunk), "one_shot_pairs"}."""
    from ..core.reference import forward
    from ..decoding.generate import work_counts
    from ..serving.chunked import chunk_masks, prefill_chunked

    ids = check_token_ids(model.config, token_ids)
    run = prefill_chunked(model, ids, chunk_size)
    full = forward(model, ids)  # [S, V]
    return {"chunk_size": int(chunk_size), "spans": run.spans, "masks": chunk_masks(len(ids), chunk_size),
            "forward_calls": len(run.spans), "max_abs_diff": float(np.max(np.abs(run.logits - full))),
            "same_next_token": int(np.argmax(run.last_logits)) == int(np.argmax(full[-1])),
            "score_pairs": list(run.score_pairs), "one_shot_pairs": work_counts(model.config, 0, len(ids))[1]}


def chunked_prefill_text(view) -> str:
    return (f"chunk size {view['chunk_size']}: {view['forward_calls']} forward calls, chunks "
            f"{[b - a for a, b in view['spans']]}; score pairs per chunk {view['score_pairs']} "
            f"(sum {sum(view['score_pairs'])} = one shot {view['one_shot_pairs']}); "
            f"max |Δ logits| vs one shot = {view['max_abs_diff']:.1e}; "
            f"same next token: {view['same_next_token']}")


def chunked_prefill_figure(view, labels=None):
    n = view["spans"][-1][1]
    if len(view["spans"]) <= 6:
        fig = viz.chunk_mask_panels(n, view["chunk_size"], labels=labels,
                                    title=f"chunk size {view['chunk_size']}: one mask per forward call")
    else:
        fig, ax = plt.subplots(figsize=(6.5, 5), layout="constrained")
        viz.chunk_overview(ax, n, view["chunk_size"], labels=labels,
                           title=f"chunk size {view['chunk_size']}: {len(view['spans'])} chunks (framed)")
    return fig


def chunked_prefill_widget(model, token_ids, labels=None, max_chunk=None):
    """Slider "chunk size": the chunk masks of a chunked prefill, and its equality with one shot."""
    ids = [int(t) for t in check_token_ids(model.config, token_ids)]
    size = W.IntSlider(value=min(4, len(ids)), min=1, max=max_chunk or len(ids), description="chunk size",
                       continuous_update=False, style=STYLE)

    def draw(view):
        show(chunked_prefill_figure(view, labels))
        return chunked_prefill_text(view)

    return panel({"chunk_size": size}, lambda chunk_size: chunked_prefill_view(model, ids, chunk_size), draw)
# ----------------------------------------------------------------------------- 19: continuous batching

def schedule_view(model, requests, token_budget, policy="decode_first"):
    """The continuous-batching schedule of `requests` at this token budget and policy, the
    one-request-at-a-time baseline, and a per-request table.
    -> {"schedule", "baseline", "rows" (dicts: request, arrival, ttft and tpot both ways), "summary"}."""
    from ..serving.scheduler import run_one_at_a_time, run_schedule

    sched = run_schedule(model, requests, token_budget=token_budget, policy=policy)
    base = run_one_at_a_time(model, requests)
    rows = [{"request": m["request"], "arrival": m["arrival"], "prompt": m["prompt"], "new": m["new"],
             "ttft": m["ttft"], "tpot": m["tpot"], "ttft_one_at_a_time": b["ttft"], "tpot_one_at_a_time": b["tpot"]}
            for m, b in zip(sched.metrics(), base.metrics())]
    return {"schedule": sched, "baseline": base, "rows": rows,
            "summary": {"continuous": sched.summary(), "one at a time": base.summary()}}


def schedule_table(view):
    """A viz.Table of schedule_view's rows, plus a last row with the totals."""
    rows = [[r["request"], r["arrival"], r["prompt"], r["new"], r["ttft"], r["tpot"], r["ttft_one_at_a_time"],
             r["tpot_one_at_a_time"]] for r in view["rows"]]
    s, b = view["summary"]["continuous"], view["summary"]["one at a time"]
    rows.append(["mean / total steps", "", "", "", s["mean_ttft"], s["mean_tpot"], b["mean_ttft"], b["mean_tpot"]])
    rows.append(["total engine steps", "", "", "", s["total_steps"], "", b["total_steps"], ""])
    return viz.Table(["request", "arrival", "prompt", "new", "TTFT", "TPOT", "TTFT 1-at-a-time", "TPOT 1-at-a-time"],
                     rows, caption="TTFT and TPOT in engine steps, continuous batching vs one request at a time")


def schedule_widget(model, patterns, budgets=(1, 32), value=8):
    """Slider "token budget", dropdowns "arrivals" (patterns: {name: [Request]}) and "policy":
    the Gantt timeline, the batch sizes and the TTFT/TPOT table against one-at-a-time."""
    from ..serving.scheduler import POLICIES

    budget = W.IntSlider(value=value, min=budgets[0], max=budgets[1], description="token budget",
                         continuous_update=False, style=STYLE)
    pattern = W.Dropdown(options=list(patterns), value=list(patterns)[0], description="arrivals", style=STYLE)
    policy = W.Dropdown(options=list(POLICIES), value=POLICIES[0], description="policy", style=STYLE)

    def compute(token_budget, pattern, policy):
        return schedule_view(model, patterns[pattern], token_budget, policy)

    def draw(view):
        s = view["schedule"]
        show(viz.schedule_figure(s, title=f"token budget {s.token_budget}: {s.total_steps} steps"))
        return schedule_table(view)

    return panel({"token_budget": budget, "pattern": pattern, "policy": policy}, compute, draw)
# ----------------------------------------------------------------------------- 11: roofline

def roofline_figure(bandwidth_gbps, peak_gflops, points=None, ax=None, title=None):
    """Log-log roofline: the bandwidth slope and the matmul roof, with ops placed on it.
    points: {label: (intensities [n], GFLOP/s [n], names [n] or None)}, one marker style each."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 4.8), layout="constrained")
    xs = np.logspace(-2, 3, 200)  # FLOP/byte
    ax.loglog(xs, np.minimum(peak_gflops, bandwidth_gbps * xs), color="black", linewidth=2, label="roofline")
    ridge = peak_gflops / bandwidth_gbps
    ax.axvline(ridge, color="#999999", linestyle=":", linewidth=1)
    ax.text(ridge * 1.1, peak_gflops * 0.05, f"ridge {ridge:.1f} FLOP/byte", fontsize=8, color="#555555")
    for i, (label, (xv, yv, names)) in enumerate((points or {}).items()):
        ax.scatter(xv, yv, s=40, marker="os^Dv"[i % 5], color=f"C{i}", label=label, zorder=3)
        spots = {}  # ops at (nearly) the same point share one label
        for x, y, name in zip(xv, yv, names or []):
            key = (round(float(np.log10(x)), 1), round(float(np.log10(y)), 1))
            spots.setdefault(key, (x, y, []))[2].append(name)
        above = i % 2 == 0  # the first series labelled above its points, the second below
        for x, y, group in spots.values():
            if len(group) > 2:  # a crowd: a block of text beside the point (right and up, or left and down)
                text = "\n".join(", ".join(group[k:k + 3]) for k in range(0, len(group), 3))
                ax.annotate(text, (x, y), textcoords="offset points", xytext=(8, 4) if above else (-8, -4),
                            fontsize=7, color=f"C{i}", ha="left" if above else "right",
                            va="bottom" if above else "top")
            else:
                ax.annotate(", ".join(group), (x, y), textcoords="offset points", xytext=(2, 7 if above else -7),
                            fontsize=7, color=f"C{i}", rotation=50 if above else -50, rotation_mode="anchor",
                            ha="left", va="bottom" if above else "top")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("GFLOP/s")
    ax.set_xlim(xs[0], xs[-1])
    ax.set_ylim(bandwidth_gbps * xs[0] * 0.5, peak_gflops * 30)  # room for the labels above the roof
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title)
    return fig if fig is not None else ax


def roofline_widget(intensities_by_batch, bandwidth_gbps, peak_gflops, prefill=None):
    """Slider "decode batch size": the ops of one layer's decode step for that batch on the
    roofline (and, when given, the prefill's ops for comparison)."""
    from ..perf.roofline import roofline_view

    batch = W.SelectionSlider(options=list(intensities_by_batch), value=list(intensities_by_batch)[0],
                              description="decode batch size", continuous_update=False, style=STYLE)

    def compute(batch):
        return roofline_view(intensities_by_batch[batch], bandwidth_gbps, peak_gflops) | {"batch": batch}

    def draw(view):
        points = {f"decode, batch {view['batch']}": (view["intensity"], view["attainable"], view["ops"])}
        if prefill is not None:
            pv = roofline_view(prefill, bandwidth_gbps, peak_gflops)
            points["prefill"] = (pv["intensity"], pv["attainable"], None)
        n_mem = view["bound"].count("memory")
        return roofline_figure(bandwidth_gbps, peak_gflops, points,
                               title=f"decode batch {view['batch']}: {n_mem} of {len(view['ops'])} ops memory-bound")

    return panel({"batch": batch}, compute, draw, title="roofline")
# ----------------------------------------------------------------------------- 16: KV capacity

CAPACITY_DTYPES = ("float32", "bfloat16", "float16", "fp8")
HEAD_DIMS = (32, 48, 64, 80, 96, 128, 160, 192, 256)
CONTEXTS = tuple(2 ** k for k in range(8, 18))  # 256 .. 131072


def capacity_text(data, n_layers, n_kv_heads, head_dim, dtype, context, budget_gib) -> str:
    """The capacity widget's output as text (from `capacity.capacity_for`'s numbers)."""
    from ..serving.capacity import bytes_per_element, format_bytes

    b = bytes_per_element(dtype)
    return "\n".join([
        f"bytes per token   = 2 x {n_layers} layers x {n_kv_heads} KV heads x {head_dim} x {b} B "
        f"= {data['bytes_per_token']:,} B ({format_bytes(data['bytes_per_token'])})",
        f"bytes per request = {data['bytes_per_token']:,} B x {context:,} tokens "
        f"= {data['bytes_per_request']:,} B ({format_bytes(data['bytes_per_request'])})",
        f"in {budget_gib:g} GiB: {data['requests']:,} requests of {context:,} tokens "
        f"({data['tokens']:,} tokens in all)"])


def capacity_widget(n_layers=30, n_kv_heads=3, head_dim=64, dtype="float32", context=8192, budget_gib=8.0):
    """Sliders "layers", "KV heads", "head dim", "context (tokens)", "KV budget (GiB)" and a
    dropdown "dtype": prints bytes per token, per request, and how many requests fit."""
    from ..serving.capacity import capacity_for

    controls = {
        "n_layers": W.IntSlider(value=n_layers, min=1, max=128, description="layers", continuous_update=False,
                                style=STYLE),
        "n_kv_heads": W.IntSlider(value=n_kv_heads, min=1, max=64, description="KV heads", continuous_update=False,
                                  style=STYLE),
        "head_dim": W.SelectionSlider(options=HEAD_DIMS, value=head_dim, description="head dim",
                                      continuous_update=False, style=STYLE),
        "dtype": W.Dropdown(options=CAPACITY_DTYPES, value=dtype, description="dtype", style=STYLE),
        "context": W.SelectionSlider(options=CONTEXTS, value=context, description="context (tokens)",
                                     continuous_update=False, style=STYLE),
        "budget_gib": W.FloatSlider(value=budget_gib, min=0.5, max=160.0, step=0.5, description="KV budget (GiB)",
                                    continuous_update=False, style=STYLE),
    }

    def compute(**values):
        return dict(capacity_for(**values), values=values)

    return panel(controls, compute, lambda d: capacity_text(d, **d["values"]), title="KV cache capacity")
# ----------------------------------------------------------------------------- 17: paged cache

def block_size_figure(view):
    """The block tables at the view's step, titled with the waste numbers."""
    table = view["table"]
    live = np.flatnonzero((table >= 0).any(axis=1))
    fig, ax = plt.subplots(figsize=(min(3 + 0.45 * table.shape[1], 13), 1.2 + 0.32 * max(len(live), 1)),
                           layout="constrained")
    viz.block_table_heatmap(ax, table[live] if len(live) else table[:1], [f"r{i}" for i in live] or None,
                            f"step {view['step']}, block size {view['block_size']}: {view['tokens']} positions in "
                            f"{view['paged_slots']} slots, waste {view['paged_waste']} "
                            f"(contiguous: {view['reserved']} reserved, waste {view['contiguous_waste']})",
                            ylabel="request", annotate=table.shape[1] <= 24)
    ax.title.set_fontsize(9)
    return fig


def block_size_widget(workload, step, sizes=(1, 2, 4, 8, 16, 32), value=4):
    """Slider "block size": the block tables of the running requests at `step` of the workload, and
    the waste (allocated slots - positions) of paging vs contiguous reservation."""
    from ..lessons.memory_replay import block_size_view

    slider = W.SelectionSlider(options=list(sizes), value=value, description="block size",
                               continuous_update=False, style=STYLE)
    return panel({"block_size": slider},
                 lambda block_size: block_size_view(workload, block_size, step) | {"block_size": block_size},
                 block_size_figure, title="paged KV cache: block size vs waste")
