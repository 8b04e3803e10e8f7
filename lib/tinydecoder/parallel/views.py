"""Figures and widgets for notebooks 22 and 23 (tensor parallelism, disaggregated serving)."""
from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np

from ..widgets.base import STYLE, panel
from .tp import step_time_model

# Models for the step-time widget: (weight bytes, layers, the degrees their shapes allow). SmolLM2's
# float32 bytes are its Model.nbytes (9 query, 3 KV heads: tp 1 or 3). Llama-3-70B: 70.6e9 parameters
# (its Hugging Face model page) in bfloat16, 80 layers, 64 query and 8 KV heads (its config.json).
MODELS = {"SmolLM2-135M, float32": (538_060_032, 30, (1, 3)),
          "Llama-3-70B, bfloat16": (2 * 70.6e9, 80, (1, 2, 4, 8))}


def timing_figure(rows: dict, title: str = "one decode step"):
    """Stacked bars, one per label: compute (step - collectives) and time inside collectives, in ms.
    rows: label -> {"step_seconds", "comm_seconds"} (tp.decode_summary's keys)."""
    labels = list(rows)
    step = np.array([rows[k]["step_seconds"] for k in labels]) * 1e3
    comm = np.array([rows[k]["comm_seconds"] for k in labels]) * 1e3
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(labels, step - comm, color="#4C72B0", label="computing")
    ax.bar(labels, comm, bottom=step - comm, color="#DD8452", label="inside collectives (waiting included)")
    ax.set_ylabel("ms per decode step")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def model_rows(weight_bytes: float, n_layers: int, bandwidth: float, latency: float, degrees=(1, 2, 4, 8)) -> dict:
    """degree -> (seconds reading weights, seconds waiting for all-reduces) from step_time_model."""
    out = {}
    for tp in degrees:
        read = step_time_model(weight_bytes / tp, bandwidth, 0.0, n_layers)
        out[tp] = (read, step_time_model(0.0, 1.0, latency if tp > 1 else 0.0, n_layers))
    return out


def draw_model(rows: dict):
    fig, ax = plt.subplots(figsize=(6, 3.2))
    degrees = list(rows)
    read = np.array([rows[t][0] for t in degrees]) * 1e6
    wait = np.array([rows[t][1] for t in degrees]) * 1e6
    x = [str(t) for t in degrees]
    ax.bar(x, read, color="#4C72B0", label="weights / bandwidth")
    ax.bar(x, wait, bottom=read, color="#DD8452", label="2 x layers x all-reduce latency")
    for i, total in enumerate(read + wait):
        ax.text(i, total, f"{total:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("tensor-parallel degree (GPUs)")
    ax.set_ylabel("predicted us per decode step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def step_model_widget(bandwidth_tbs: float = 3.35, latency_us: float = 3.5):
    """Sliders for HBM bandwidth and all-reduce latency, a model to choose: the predicted decode step
    at every degree the model's shapes allow (up to 8 GPUs)."""
    controls = {"model": W.Dropdown(options=list(MODELS), description="model", style=STYLE),
                "bandwidth": W.FloatSlider(value=bandwidth_tbs, min=0.5, max=8.0, step=0.05,
                                           description="HBM TB/s per GPU", style=STYLE),
                "latency": W.FloatSlider(value=latency_us, min=0.5, max=50.0, step=0.5,
                                         description="all-reduce us", style=STYLE)}

    def compute(model, bandwidth, latency):
        weight_bytes, layers, degrees = MODELS[model]
        return model_rows(weight_bytes, layers, bandwidth * 1e12, latency * 1e-6, degrees)

    return panel(controls, compute, draw_model, title="step time = weight bytes per GPU / bandwidth + 2 L latency")


def tpot_figure(colocated: list, disaggregated: list, chunked: list | None = None):
    """Time per output token, every gap, sorted (a CDF on a log axis), for each mode given."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    series = ((colocated, "colocated", "#C44E52"), (chunked, "colocated + chunked prefill", "#8172B2"),
              (disaggregated, "disaggregated", "#55A868"))
    for gaps, label, color in [x for x in series if x[0] is not None]:
        g = np.sort(np.asarray(gaps)) * 1e3
        ax.plot(g, np.arange(1, len(g) + 1) / len(g), drawstyle="steps-post", label=label, color=color)
    ax.set_xscale("log")
    ax.set_xlabel("ms between two output tokens of a request")
    ax.set_ylabel("fraction of gaps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def tpot_widget(colocated: list, disaggregated: list, chunked: list | None = None):
    """A percentile slider: the time per output token at that percentile, for each mode given."""
    controls = {"percentile": W.IntSlider(value=99, min=50, max=100, description="percentile", style=STYLE)}
    modes = [(n, g) for n, g in (("colocated", colocated), ("chunked", chunked), ("disaggregated", disaggregated))
             if g is not None]

    def compute(percentile):
        return {name: float(np.percentile(g, percentile)) * 1e3 for name, g in modes} | {"p": percentile}

    def draw(data):
        return f"p{data['p']} time per output token: " + ", ".join(f"{n} {data[n]:.1f} ms" for n, _ in modes)

    return panel(controls, compute, draw, title="time per output token")


def model_sweep_figure(xs, p99: dict, ttft: dict | None = None, xlabel: str = "arrival rate (requests per second)",
                       crossings: dict | None = None):
    """p99 time per output token (and p99 time to first token, when given) against `xs`, one line per
    mode (disagg_model.sweep's output, in seconds); crossings: label -> x, drawn as dotted lines."""
    colors = {"colocated": "#C44E52", "chunked": "#8172B2", "disaggregated": "#55A868"}
    panels = [(p99, "p99 time per output token (ms)")] + ([(ttft, "p99 time to first token (ms)")] if ttft else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.3), squeeze=False)
    for ax, (rows, label) in zip(axes[0], panels):
        for mode, ys in rows.items():
            ax.plot(xs, np.asarray(ys) * 1e3, marker=".", label=mode, color=colors.get(mode))
        for name, x in (crossings or {}).items():
            ax.axvline(x, color="gray", linestyle=":", linewidth=1)
            ax.text(x, ax.get_ylim()[1], f" {name}", fontsize=7, va="top", rotation=90)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig
