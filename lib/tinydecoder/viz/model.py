"""Figures of Part I's model chapters: GQA head mapping, the KV cache strip, a real model's attention maps."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from ..core.validate import is_int
from .common import MASK_COLOR, MASK_HATCH, MAX_TICKS, future_mask, heatmap, token_labels  # noqa: F401

# ----------------------------------------------------------------------------- GQA and the KV cache

def head_mapping(ax, n_heads, n_kv_heads, title=None, *, kv_head_of=None):
    """Query heads as a row of boxes on top, KV heads below, a line from each query head to the
    KV head it reads; one colour per KV head. kv_head_of: the mapping, an [Hq] sequence
    (default h // (Hq // Hkv)), e.g. a wrong one to show a bug. Returns the mapping drawn."""
    if n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} does not divide n_heads={n_heads}")
    group = n_heads // n_kv_heads
    mapping = (np.arange(n_heads) // group if kv_head_of is None
               else np.asarray(kv_head_of, dtype=int))
    if mapping.shape != (n_heads,) or mapping.min() < 0 or mapping.max() >= n_kv_heads:
        raise ValueError(f"kv_head_of must give each of the {n_heads} query heads a KV head in "
                         f"0..{n_kv_heads - 1}, got {mapping.tolist()}")
    width = max(n_heads, 1)
    q_x = np.arange(n_heads) + 0.5  # box centres
    kv_x = (np.arange(n_kv_heads) + 0.5) * width / n_kv_heads
    size = 0.8
    for h, x in enumerate(q_x):
        c = f"C{mapping[h] % 10}"
        ax.plot([x, kv_x[mapping[h]]], [1.6 - size / 2, size / 2], color=c, linewidth=1.5)
        ax.add_patch(Rectangle((x - size / 2, 1.6 - size / 2), size, size, facecolor=c, alpha=0.35,
                               edgecolor="black"))
        ax.text(x, 1.6, f"q{h}", ha="center", va="center", fontsize=8 if n_heads <= 16 else 6)
    kv_w = min(size * group, width / n_kv_heads * 0.9)
    for j, x in enumerate(kv_x):
        ax.add_patch(Rectangle((x - kv_w / 2, -size / 2), kv_w, size, facecolor=f"C{j % 10}", alpha=0.7,
                               edgecolor="black"))
        ax.text(x, 0, f"KV{j}", ha="center", va="center", fontsize=8 if n_kv_heads <= 16 else 6)
    ax.text(-0.3, 1.6, "query heads", ha="right", va="center", fontsize=9)
    ax.text(-0.3, 0, "KV heads\n(cached)", ha="right", va="center", fontsize=9)
    ax.set_xlim(-2.6, width + 0.2)
    ax.set_ylim(-0.7, 2.3)
    ax.axis("off")
    if title:
        ax.set_title(title)
    return mapping


def cache_strip(ax, context, cache_before, cache_after, weights=None, title=None, *, capacity=None,
                names=None):
    """The KV cache of one sequence as a row of cells, cell j at x = j (so it lines up with a
    heatmap's column j): rows already cached before this round (blue), rows appended by it
    (orange), and, up to `capacity`, dashed empty cells for rows later rounds will add.
    weights: [cache_after] attention weights of the round's newest query, drawn as bars above
    the cells (how much it reads each row). context: the tokens at positions 0..cache_after-1."""
    T = int(cache_after)
    capacity = T if capacity is None else int(capacity)
    if not 0 <= cache_before < T <= min(len(context), capacity):
        raise ValueError(f"need 0 <= cache_before < cache_after <= len(context) and <= capacity, got "
                         f"{cache_before}, {cache_after}, {len(context)}, {capacity}")
    labels = token_labels(context[:T], names)
    for j in range(capacity):
        if j < T:
            new = j >= cache_before
            ax.add_patch(Rectangle((j - 0.45, 0), 0.9, 0.6, facecolor="C1" if new else "C0",
                                   alpha=0.75 if new else 0.45, edgecolor="black"))
            ax.text(j, 0.3, labels[j], ha="center", va="center", fontsize=8)
        else:
            ax.add_patch(Rectangle((j - 0.45, 0), 0.9, 0.6, facecolor="none", edgecolor="#999999",
                                   linestyle="--"))
            ax.text(j, 0.3, str(j), ha="center", va="center", fontsize=8, color="#999999")
    top = 0.8
    ticks, tick_labels = [0.3], ["cache rows"]
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (T,):
            raise ValueError(f"weights must have shape ({T},), one per cached position, got {w.shape}")
        ax.bar(np.arange(T), 1.2 * w, width=0.6, bottom=top, color="C2", alpha=0.8)
        for j in range(T):
            ax.text(j, top + 1.2 * w[j] + 0.04, f"{w[j]:.2f}", ha="center", va="bottom", fontsize=7)
        ticks.append(top + 0.4)
        tick_labels.append("weight")
    ax.set_yticks(ticks, labels=tick_labels)
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    handles = [Patch(facecolor="C0", alpha=0.45, edgecolor="black", label=f"cached before ({cache_before})"),
               Patch(facecolor="C1", alpha=0.75, edgecolor="black", label=f"appended this round ({T - cache_before})")]
    if capacity > T:
        handles.append(Patch(facecolor="none", edgecolor="#999999", linestyle="--", label="later rounds"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), fontsize=8, ncols=len(handles),
              frameon=False)
    ax.set_xlim(-0.5, capacity - 0.5)
    ax.set_ylim(-0.1, top + 1.75)
    if title:
        ax.set_title(title)
    return labels
# ----------------------------------------------------------------------------- 08: a real model

LOG_FLOOR = 1e-4  # log-scale attention maps clip visible weights below this


def log_attention(weights, floor=LOG_FLOOR):
    """log10 of attention weights [..., S, T] for a log-scale heatmap. Visible cells are clipped
    at `floor` (a weight that underflowed to 0 is still drawn as a visible cell, at the bottom of
    the scale); future keys (the causal mask; queries are the last S of T) become -inf, which
    the heatmaps draw grey and hatched."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim < 2:
        raise ValueError(f"log_attention needs weights [..., S, T], got shape {w.shape}")
    if not 0 < floor < 1:
        raise ValueError(f"floor must be in (0, 1), got {floor!r}")
    out = np.log10(np.maximum(w, floor))
    out[..., future_mask(*w.shape[-2:])] = -np.inf
    return out


def head_grid(weights, row_labels=None, col_labels=None, *, ncols=3, log=False, floor=LOG_FLOOR,
              head_names=None, title=None, panel_size=(3.3, 2.9)):
    """Attention weights [H, S, T] as a grid of heatmaps, `ncols` heads per row (for GQA: the
    group size, so that each row is the query heads sharing one KV head), on one colour scale
    (0..1, or log10 weight from log10(floor) to 0 with log=True) with one colour bar; future
    keys grey and hatched. Tick labels are written on the left column and the bottom row only.
    Returns the figure."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 3:
        raise ValueError(f"head_grid needs weights [H, S, T], got shape {w.shape}")
    H, S, T = w.shape
    if not is_int(ncols) or ncols < 1:
        raise ValueError(f"ncols must be a positive integer, got {ncols!r}")
    head_names = head_names or [f"head {h}" for h in range(H)]
    if len(head_names) != H:
        raise ValueError(f"{len(head_names)} head names for {H} heads")
    shown = log_attention(w, floor) if log else w
    vmin, vmax = (float(np.log10(floor)), 0.0) if log else (0.0, 1.0)
    ncols = min(int(ncols), H)
    nrows = -(-H // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size[0] * ncols + 1.0, panel_size[1] * nrows),
                             squeeze=False, layout="constrained")
    im = None
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        row, col = divmod(h, ncols)
        bottom = h + ncols >= H
        im = heatmap(ax, shown[h], row_labels, col_labels, head_names[h], mask="causal", colorbar=False,
                     vmin=vmin, vmax=vmax, xlabel="key" if bottom else "", ylabel="query" if col == 0 else "")
        ax.tick_params(labelleft=col == 0, labelbottom=bottom, labelsize=7)
    cb = fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02)
    cb.set_label(f"log10 attention weight (clipped at {floor:g})" if log else "attention weight")
    if title:
        fig.suptitle(title)
    return fig


def first_token_lines(ax, mass, title=None):
    """The share of attention that goes to position 0, per layer: mass [L, H] (e.g.
    widgets.first_token_mass). One dot per head, a line for the mean over heads. Returns the mean [L]."""
    m = np.asarray(mass, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"mass must be [layers, heads], got shape {m.shape}")
    L, H = m.shape
    layers = np.arange(L)
    for h in range(H):
        ax.scatter(layers, m[:, h], s=10, color="#9e9e9e", alpha=0.6, label="one head" if h == 0 else None)
    mean = m.mean(axis=1)
    ax.plot(layers, mean, color="C3", marker="o", markersize=4, linewidth=2, label="mean over heads")
    ax.set_xlabel("layer")
    ax.set_ylabel("attention weight on position 0")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(-0.5, L - 0.5)
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title)
    return mean
