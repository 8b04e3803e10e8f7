"""Figures and the widget of notebook 14 (long context): per-position loss of dense, window-only
and sinks + window caches, which positions a cache holds, and sliding-window capacity."""
from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np

from ..algorithms.sink_cache import kept_positions
from ..core.validate import is_int
from ..serving.capacity import bytes_per_request, sliding_window_kv_bytes
from .base import STYLE, panel

COLORS = {"dense": "C0", "window only": "C3", "sinks + window": "C2"}


def trailing_mean(values, width: int) -> np.ndarray:
    """Mean of the last `width` values up to each index (fewer at the start).  -> [N] float64"""
    x = np.asarray(values, dtype=np.float64)
    if not is_int(width) or width < 1:
        raise ValueError(f"width must be an integer >= 1, got {width!r}")
    c = np.concatenate([[0.0], np.cumsum(x)])
    i = np.arange(1, len(x) + 1)
    start = np.maximum(0, i - width)
    return (c[i] - c[start]) / (i - start)


def nll_curves_figure(curves: dict, evict_from: int, width: int = 16):
    """Per-position negative log-likelihood (a trailing mean over `width` positions) for each
    named curve, with a line where eviction starts. curves: name -> nll [N-1]."""
    fig, ax = plt.subplots(figsize=(9, 3.6), layout="constrained")
    for name, nll in curves.items():
        ax.plot(np.arange(1, len(nll) + 1), trailing_mean(nll, width), color=COLORS.get(name),
                label=f"{name} (ppl {float(np.exp(np.mean(nll[evict_from:]))):.1f} after eviction starts)")
    ax.axvline(evict_from, color="k", linestyle=":", linewidth=1)
    ax.text(evict_from + 2, ax.get_ylim()[1] * 0.95, "cache full: eviction starts", fontsize=8, va="top")
    ax.set_xlabel("position of the predicted token")
    ax.set_ylabel(f"NLL (nats), mean of last {width}")
    ax.legend(fontsize=8, loc="upper right")
    return fig


def stream_view(curves: dict, tokens_seen: int, sinks: int, window: int, cache: str, width: int = 16) -> dict:
    """What the cache `cache` ("dense", "window only" or "sinks + window") holds after
    `tokens_seen` tokens, and the loss so far. Returns {"held" [N] bool, "sink" [N] bool,
    "tokens_seen", "cache", "recent_nll" (mean NLL of the last `width` predictions), "n_held"}."""
    n = len(next(iter(curves.values()))) + 1
    if cache not in curves:
        raise ValueError(f"cache must be one of {list(curves)}, got {cache!r}")
    if not 1 <= tokens_seen <= n:
        raise ValueError(f"tokens_seen must be in 1..{n}, got {tokens_seen}")
    if cache == "dense":
        kept = np.arange(tokens_seen)
    else:
        kept = kept_positions(tokens_seen, sinks if cache == "sinks + window" else 0,
                              window + (0 if cache == "sinks + window" else sinks))
    held = np.zeros(n, bool)
    held[kept] = True
    sink = np.zeros(n, bool)
    if cache == "sinks + window" and tokens_seen > sinks + window:
        sink[:sinks] = True
    nll = curves[cache][:tokens_seen - 1]
    recent = float(np.mean(nll[-width:])) if len(nll) else float("nan")
    return {"held": held, "sink": sink, "tokens_seen": tokens_seen, "cache": cache,
            "recent_nll": recent, "n_held": int(held.sum())}


def stream_figure(view: dict):
    """A strip of the stream's positions: held in the window, held as a sink, evicted, unseen."""
    n, t = len(view["held"]), view["tokens_seen"]
    state = np.full(n, 3)  # 0 window, 1 sink, 2 evicted, 3 not yet seen
    state[:t] = 2
    state[view["held"]] = 0
    state[view["sink"]] = 1
    cmap = plt.matplotlib.colors.ListedColormap(["#4caf50", "#1565c0", "#e0e0e0", "white"])
    fig, ax = plt.subplots(figsize=(9, 1.5), layout="constrained")
    ax.imshow(state[None, :], aspect="auto", cmap=cmap, vmin=-0.5, vmax=3.5, interpolation="nearest")
    ax.set_yticks([])
    ax.set_xlabel("position in the stream (blue: sinks, green: window, grey: evicted)")
    ax.set_title(f"{view['cache']}: {view['n_held']} positions held after {t} tokens; "
                 f"mean NLL of the last predictions {view['recent_nll']:.2f}", fontsize=9)
    return fig


def stream_widget(curves: dict, sinks: int, window: int):
    """Slider "tokens seen" and dropdown "cache": which positions each cache holds, and its loss."""
    n = len(next(iter(curves.values()))) + 1
    controls = {"tokens_seen": W.IntSlider(value=min(n, sinks + window + 40), min=1, max=n,
                                           description="tokens seen", continuous_update=False, style=STYLE),
                "cache": W.Dropdown(options=list(curves), value="sinks + window", description="cache",
                                    style=STYLE)}
    return panel(controls, lambda tokens_seen, cache: stream_view(curves, tokens_seen, sinks, window, cache),
                 stream_figure, title="a bounded cache over a stream")


def sliding_window_figure(config, windows, max_tokens: int, dtype: str = "float32"):
    """KV-cache MB against tokens: a dense cache grows forever, a sliding window stops at its size."""
    tokens = np.arange(1, max_tokens + 1, max(1, max_tokens // 200))
    fig, ax = plt.subplots(figsize=(7, 3.4), layout="constrained")
    dense = [bytes_per_request(config, t, dtype) / 1e6 for t in tokens]
    ax.plot(tokens, dense, color="k", label="dense (all positions)")
    for w in windows:
        ax.plot(tokens, [sliding_window_kv_bytes(config, t, w, dtype) / 1e6 for t in tokens], label=f"sliding window {w}")
    ax.set_xlabel("tokens in the sequence")
    ax.set_ylabel("KV cache (MB)")
    ax.legend(fontsize=8)
    return fig
