"""Figures shared by every chapter: labels, masks, heatmaps, vectors, shape tables (see viz/__init__ for the conventions)."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from ..core.ops import causal_mask, softmax
from ..core.reference import MATMUL_OPS  # noqa: F401 (viz.MATMUL_OPS)

MASK_COLOR = "#d0d0d0"
MASK_HATCH = "///"
MAX_TICKS = 32  # label every row/column up to this many


# ----------------------------------------------------------------------------- labels, masks

def token_labels(token_ids, names=None, start=0):
    """Tick labels "position:token" for a sequence, e.g. ["0:0", "1:1", ...].

    names: a list (id -> text) or a callable(id) -> text, to show token text instead of the id;
    start: the position of the first token (a decode step's query sits at position T-1)."""
    out = []
    for i, t in enumerate(token_ids):
        t = int(t)
        name = t if names is None else (names(t) if callable(names) else names[t])
        out.append(f"{start + i}:{name}")
    return out


def future_mask(n_queries, n_keys):
    """Boolean [S, T], True where query i may NOT see key j (the queries are the last S of T)."""
    return np.isneginf(causal_mask(n_queries, n_keys, np.float64))


def resolve_mask(mask, shape):
    """Turn a mask argument into a boolean array of `shape` (True = hidden).

    None -> nothing hidden; "causal" -> future_mask(*shape); a bool array as is; a numeric
    array is read as an additive mask (-inf = hidden, as ops.causal_mask returns)."""
    if mask is None:
        return np.zeros(shape, bool)
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask must be None, 'causal', or an array; got {mask!r}")
        if len(shape) != 2:
            raise ValueError(f"mask='causal' needs a 2-D matrix [S, T], got shape {shape}")
        return future_mask(*shape)
    m = np.asarray(mask)
    if m.shape != tuple(shape):
        raise ValueError(f"mask has shape {m.shape} but the matrix has shape {tuple(shape)}")
    return m.astype(bool) if m.dtype == bool else np.isneginf(m)


def fmt_shape(shape) -> str:
    """(4, 8) -> "[4,8]", the seed's way of writing shapes."""
    return "[" + ",".join(str(int(n)) for n in shape) + "]"
# ----------------------------------------------------------------------------- heatmaps

def heatmap(ax, matrix, row_labels=None, col_labels=None, title=None, *, mask=None,
            cmap="viridis", colorbar=True, annotate=False, fmt="{:.2f}", vmin=None, vmax=None,
            symmetric=False, xlabel="key position", ylabel="query position", cbar_label=None):
    """Draw a 2-D matrix on `ax` with labelled ticks and axes, a colour bar, and masked cells
    grey and hatched. Non-finite cells (e.g. -inf scores) are always treated as masked.

    row_labels / col_labels: tick labels (default 0..n-1); annotate: write each value in its
    cell (fmt is a format string); symmetric: colour limits ±max|x| (for signed data, with a
    diverging cmap such as "RdBu_r"). Returns the AxesImage (its .colorbar is set when drawn)."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim == 1:
        m = m[None, :]
    if m.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D matrix, got shape {m.shape}")
    n_rows, n_cols = m.shape
    hidden = resolve_mask(mask, m.shape) | ~np.isfinite(m)
    shown = np.ma.masked_array(m, mask=hidden)
    finite = m[~hidden]
    if symmetric:
        lim = float(np.max(np.abs(finite))) if finite.size else 1.0
        vmin, vmax = (-lim, lim) if vmin is None and vmax is None else (vmin, vmax)
    cm = plt.get_cmap(cmap).with_extremes(bad=MASK_COLOR)
    im = ax.imshow(shown, cmap=cm, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    for i, j in zip(*np.nonzero(hidden)):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=MASK_COLOR, edgecolor="#808080",
                               hatch=MASK_HATCH, linewidth=0.0))
    if col_labels is not None or n_cols <= MAX_TICKS:  # beyond that, matplotlib picks the ticks
        ax.set_xticks(range(n_cols), labels=col_labels if col_labels is not None else range(n_cols))
    if row_labels is not None or n_rows <= MAX_TICKS:
        ax.set_yticks(range(n_rows), labels=row_labels if row_labels is not None else range(n_rows))
    if col_labels is not None and max((len(str(c)) for c in col_labels), default=0) > 3:
        plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if annotate:
        for i in range(n_rows):
            for j in range(n_cols):
                if hidden[i, j]:
                    text, color = ("−∞" if np.isneginf(m[i, j]) else ""), "#404040"
                else:
                    text = fmt.format(m[i, j])
                    r, g, b, _ = im.cmap(im.norm(m[i, j]))
                    color = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
                ax.text(j, i, text, ha="center", va="center", fontsize=8, color=color)
    if colorbar:
        cb = ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        if cbar_label:
            cb.set_label(cbar_label)
    return im


def head_heatmaps(weights, row_labels=None, col_labels=None, *, title=None, head_names=None,
                  mask="causal", cmap="viridis", annotate=False, fmt="{:.2f}", vmin=None, vmax=None,
                  xlabel="key position", ylabel="query position", cbar_label="attention weight",
                  panel_size=(3.2, 2.8)):
    """One heatmap per head of weights [H, S, T], side by side on one shared colour scale with
    one colour bar. mask: "causal" (default, the future keys hidden), None, or an [S, T] mask
    shared by all heads. head_names: panel titles (default "head 0", ...). Returns the figure."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 3:
        raise ValueError(f"head_heatmaps needs weights [H, S, T], got shape {w.shape}")
    H, S, T = w.shape
    head_names = head_names or [f"head {h}" for h in range(H)]
    if len(head_names) != H:
        raise ValueError(f"{len(head_names)} head names for {H} heads")
    hidden = resolve_mask(mask, (S, T))
    finite = w[:, ~hidden][np.isfinite(w[:, ~hidden])]
    vmin = float(finite.min()) if vmin is None and finite.size else vmin
    vmax = float(finite.max()) if vmax is None and finite.size else vmax
    fig, axes = plt.subplots(1, H, figsize=(panel_size[0] * H + 0.8, panel_size[1]), squeeze=False,
                             layout="constrained")
    axes = axes[0]
    for h, ax in enumerate(axes):
        im = heatmap(ax, w[h], row_labels, col_labels, head_names[h], mask=hidden, cmap=cmap,
                     colorbar=False, annotate=annotate, fmt=fmt, vmin=vmin, vmax=vmax, xlabel=xlabel,
                     ylabel=ylabel if h == 0 else "")
    cb = fig.colorbar(im, ax=list(axes), fraction=0.046 if H > 1 else 0.06, pad=0.02)
    cb.set_label(cbar_label)
    if title:
        fig.suptitle(title)
    return fig


def attention_steps(scores, row_labels=None, col_labels=None, *, title=None, annotate=True):
    """Three panels for one head: raw scaled scores [S, T], the additive causal mask (0 / −∞),
    and the weights softmax(scores + mask). Returns the figure."""
    s = np.asarray(scores, dtype=np.float64)
    S, T = s.shape
    additive = causal_mask(S, T, np.float64)
    weights = softmax(s + additive)
    fig, axes = plt.subplots(1, 3, figsize=(11.5, 3.2), layout="constrained")
    heatmap(axes[0], s, row_labels, col_labels, "scores  q·k / √d", cmap="RdBu_r", symmetric=True,
            annotate=annotate)
    heatmap(axes[1], np.where(np.isneginf(additive), -np.inf, 0.0), row_labels, col_labels,
            "causal mask (+0 or −∞)", colorbar=False, annotate=annotate, fmt="{:.0f}", cmap="Greys",
            vmin=0, vmax=1, ylabel="")  # visible cells white, masked cells grey and hatched
    heatmap(axes[2], weights, row_labels, col_labels, "weights = softmax(scores + mask)",
            mask="causal", vmin=0, vmax=1, annotate=annotate, ylabel="", cbar_label="weight")
    if title:
        fig.suptitle(title)
    return fig


def mask_legend(ax, label="masked (future key)", loc="upper right"):
    """Add a legend entry explaining the hatched cells."""
    return ax.legend(handles=[Patch(facecolor=MASK_COLOR, edgecolor="#808080", hatch=MASK_HATCH,
                                    label=label)], loc=loc, fontsize=8, framealpha=0.9)
# ----------------------------------------------------------------------------- vectors

def vector_bars(ax, vectors, title=None, *, xlabel="dimension", ylabel="value", colors=None):
    """Grouped bars of several 1-D vectors of the same length, e.g.
    {"token": e, "position": p, "sum": e + p}. Returns the list of bar containers."""
    names = list(vectors)
    arrays = [np.asarray(vectors[n], dtype=np.float64) for n in names]
    if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1:
        raise ValueError(f"vector_bars needs 1-D vectors of one length, got shapes {[a.shape for a in arrays]}")
    D, n = arrays[0].shape[0], len(arrays)
    width = 0.8 / n
    x = np.arange(D)
    bars = [ax.bar(x + (i - (n - 1) / 2) * width, a, width, label=name,
                   color=None if colors is None else colors[i]) for i, (name, a) in enumerate(zip(names, arrays))]
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(x)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return bars


def arrows_2d(ax, vectors, title=None, *, colors=None, limit=None):
    """2-D vectors drawn as arrows from the origin, labelled: {"q": (1, 0), "k0": (1, 0), ...}.
    Square axes with limits ±limit (default: the longest vector plus a margin)."""
    names = list(vectors)
    arrays = [np.asarray(vectors[n], dtype=np.float64) for n in names]
    if any(a.shape != (2,) for a in arrays):
        raise ValueError(f"arrows_2d needs 2-D vectors, got shapes {[a.shape for a in arrays]}")
    lim = limit or 1.25 * max(1e-9, max(float(np.hypot(*a)) for a in arrays))
    for i, (name, a) in enumerate(zip(names, arrays)):
        color = None if colors is None else colors[i]
        ax.annotate("", xy=a, xytext=(0, 0), arrowprops=dict(arrowstyle="->", lw=2, color=color or f"C{i}"))
        ax.text(a[0] * 1.08, a[1] * 1.08, name, color=color or f"C{i}", ha="center", va="center")
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_aspect("equal")
    ax.axhline(0, color="#999999", linewidth=0.5)
    ax.axvline(0, color="#999999", linewidth=0.5)
    ax.set_xlabel("dim 0")
    ax.set_ylabel("dim 1")
    if title:
        ax.set_title(title)
# ----------------------------------------------------------------------------- shapes

class Table:
    """A small table that shows as HTML in Jupyter and as aligned text when printed.

    Table(["op", "output"], [["embed", "[4,8]"], ...], caption="...")"""

    def __init__(self, columns, rows, caption=None):
        self.columns = [str(c) for c in columns]
        self.rows = [[str(c) for c in row] for row in rows]
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"row {row} has {len(row)} cells but the table has {len(self.columns)} columns")
        self.caption = caption

    def column(self, name):
        """The cells of one column, as strings."""
        return [row[self.columns.index(name)] for row in self.rows]

    def __str__(self):
        widths = [max(len(c), *(len(r[i]) for r in self.rows)) if self.rows else len(c)
                  for i, c in enumerate(self.columns)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        out = [self.caption] if self.caption else []
        out += [line(self.columns), line(["-" * w for w in widths])] + [line(r) for r in self.rows]
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self):
        esc = html.escape
        head = "".join(f"<th>{esc(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td><code>{esc(c)}</code></td>" if c.startswith("[") else
                                         f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in self.rows)
        cap = f"<caption>{esc(self.caption)}</caption>" if self.caption else ""
        return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def shape_rows(trace, layer=0):
    """The ops of one layer plus those outside the blocks, in execution order, as dicts
    {op, layer, computes, output, flops}; `computes` writes a matmul as "[4,8] × [8,8]"."""
    rows = []
    for op, inputs, output, flops in trace.table(layer):
        sep = " × " if op in MATMUL_OPS else ", "
        rows.append(dict(op=op, layer="—" if op in ("embed", "final_norm", "lm_head") else layer,
                         computes=sep.join(fmt_shape(s) for s in inputs), output=fmt_shape(output),
                         flops=flops))
    return rows


def shape_table(trace, layer=0, caption=None):
    """A Table of shape_rows(trace, layer): the shape walk of a traced forward pass."""
    rows = shape_rows(trace, layer)
    return Table(["op", "layer", "inputs", "output", "FLOPs"],
                 [[r["op"], r["layer"], r["computes"], r["output"], f"{r['flops']:,}"] for r in rows],
                 caption=caption)


def shape_boxes(ax, shapes, title=None, *, unit=0.25, gap=1.0, colors=None):
    """Draw matrices as rectangles to scale (rows down, columns across), left to right, each
    labelled with its name and shape: [("x", (4, 8)), ("Wq", (8, 8)), ("q", (4, 8))]."""
    x0 = 0.0
    tallest = max(s[0] for _, s in shapes) * unit
    for i, (name, shape) in enumerate(shapes):
        rows, cols = (1, shape[0]) if len(shape) == 1 else shape[-2:]
        w, h = cols * unit, rows * unit
        ax.add_patch(Rectangle((x0, tallest - h), w, h, facecolor=colors[i] if colors else f"C{i % 10}",
                               alpha=0.35, edgecolor="black"))
        ax.text(x0 + w / 2, tallest + 0.15, name, ha="center", va="bottom", fontsize=9)
        ax.text(x0 + w / 2, tallest - h - 0.15, fmt_shape(shape), ha="center", va="top", fontsize=9)
        x0 += w + gap
    ax.set_xlim(-0.3, x0 - gap + 0.3)
    ax.set_ylim(-0.8, tallest + 0.8)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title)
