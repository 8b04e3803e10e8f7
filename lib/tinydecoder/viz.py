"""Plots for the notebooks: heatmaps of scores, weights and masks, shape tables and diagrams.

Conventions (so that every notebook's figures look alike):
- a drawing function takes an `ax` (or makes its own figure) and returns what it drew
  (the image, or the figure); none calls plt.show() — the notebook cell does;
- masks are boolean arrays, True = the cell is hidden (a future key), drawn grey and hatched;
  `mask="causal"` builds the causal mask of an [S, T] matrix (queries = the last S of T);
- matrices are [rows, cols] = [queries / positions, keys / dimensions].
"""
from __future__ import annotations

import html

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from .ops import causal_mask, softmax

MASK_COLOR = "#d0d0d0"
MASK_HATCH = "///"
MAX_TICKS = 32  # label every row/column up to this many
MATMUL_OPS = ("q_proj", "k_proj", "v_proj", "o_proj", "ffn_gate", "ffn_up", "ffn_down", "lm_head")


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


# ----------------------------------------------------------------------------- 10: chunked prefill

CACHED_KEY_COLOR, CHUNK_KEY_COLOR = "#6baed6", "#fd8d3c"  # keys read from the cache / of the chunk itself


def _chunk_cells(n_rows_from, n_rows_to, n_cols, chunk_start):
    """Values for a chunk's cells: 0 where the key comes from the cache (before chunk_start),
    1 where it is one of the chunk's own keys."""
    return np.broadcast_to((np.arange(n_cols) >= chunk_start).astype(np.float64),
                           (n_rows_to - n_rows_from, n_cols))


def _two_colour_bar(fig, im, axes):
    cb = fig.colorbar(im, ax=axes, fraction=0.046, pad=0.02, ticks=[0.25, 0.75])
    cb.ax.set_yticklabels(["key from\nthe cache", "key of\nthis chunk"])
    return cb


def chunk_mask_panels(n_tokens, chunk_size, past=0, labels=None, *, title=None, max_panels=8):
    """One panel per chunk of a chunked prefill: the chunk's mask [b - a rows, b columns] (from
    chunked.chunk_masks): keys already in the cache blue, the chunk's own keys orange, the cut-off
    triangle grey and hatched. labels: tick labels for positions 0..past+n_tokens-1.
    Panels are as wide as their masks. Returns the figure."""
    from matplotlib.colors import ListedColormap

    from .chunked import chunk_masks, chunk_spans

    spans = chunk_spans(past + n_tokens, chunk_size, start=past)
    masks = chunk_masks(n_tokens, chunk_size, past=past)
    if len(spans) > max_panels:
        raise ValueError(f"{len(spans)} chunks would need {len(spans)} panels (max_panels={max_panels}); "
                         f"use a larger chunk size or chunk_overview()")
    total = past + n_tokens
    labels = list(labels) if labels is not None else [str(i) for i in range(total)]
    cmap = ListedColormap([CACHED_KEY_COLOR, CHUNK_KEY_COLOR])
    widths = [b for _, b in spans]
    fig, axes = plt.subplots(1, len(spans), figsize=(min(1.2 + 0.42 * sum(widths) + 1.1 * len(spans), 16),
                                                     1.6 + 0.34 * max(b - a for a, b in spans)),
                             width_ratios=widths, squeeze=False, layout="constrained")
    axes = axes[0]
    for j, ((a, b), m, ax) in enumerate(zip(spans, masks, axes)):
        im = heatmap(ax, _chunk_cells(a, b, b, a), labels[a:b], labels[:b],
                     f"chunk {j}: rows {a}..{b - 1}\nmask [{b - a}×{b}]", mask=m, cmap=cmap, vmin=0, vmax=1,
                     colorbar=False, xlabel="key position", ylabel="query position" if j == 0 else "")
        if a > 0:
            ax.axvline(a - 0.5, color="black", linewidth=1.2)
    _two_colour_bar(fig, im, list(axes))
    if title:
        fig.suptitle(title)
    return fig


def chunk_overview(ax, n_tokens, chunk_size, past=0, labels=None, *, title=None, colorbar=True):
    """The whole prefill matrix of a chunked prefill on one axis, [n_tokens rows, past + n_tokens
    columns]: each row coloured by where its visible keys come from (blue: the cache, orange: its
    own chunk), the future hatched, and a black frame around each chunk's rectangle.
    Returns the AxesImage."""
    from matplotlib.colors import ListedColormap

    from .chunked import chunk_spans

    total = past + n_tokens
    spans = chunk_spans(total, chunk_size, start=past)
    values = np.zeros((n_tokens, total))  # rows: the positions prefilled here (past..total-1)
    for a, b in spans:
        values[a - past:b - past] = _chunk_cells(a, b, total, a)
    if labels is not None:
        labels = list(labels)
        row_labels, col_labels = labels[past:], labels
    else:  # position numbers; beyond MAX_TICKS matplotlib picks the ticks
        row_labels = [str(i) for i in range(past, total)] if n_tokens <= MAX_TICKS else None
        col_labels = None
    im = heatmap(ax, values, row_labels, col_labels, title, mask="causal",
                 cmap=ListedColormap([CACHED_KEY_COLOR, CHUNK_KEY_COLOR]), vmin=0, vmax=1, colorbar=False)
    if row_labels is None:
        from matplotlib.ticker import FuncFormatter, MaxNLocator

        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{int(round(y)) + past}"))
    for a, b in spans:
        ax.add_patch(Rectangle((-0.5, a - past - 0.5), b, b - a, fill=False, edgecolor="black", linewidth=1.6))
    if colorbar:
        _two_colour_bar(ax.figure, im, ax)
    return im


# ----------------------------------------------------------------------------- 11: continuous batching

def schedule_timeline(ax, schedule, *, names=None, title=None, annotate=True):
    """A Gantt chart of a scheduler.Schedule: one row per request, one column per engine step.
    Orange: a prefill chunk (its token count written in), blue: a decode step, light grey:
    arrived but waiting for admission, pale yellow: admitted but given no work that step,
    ▼ its arrival, ★ the end of the step that chose its first token. Returns the codes drawn
    (scheduler.timeline_codes)."""
    from .scheduler import DECODING, PREFILLING, STALLED, WAITING, timeline_codes

    codes = timeline_codes(schedule)
    n_req, n_steps = codes.shape
    colors = {WAITING: "#e6e6e6", STALLED: "#fff2a8", PREFILLING: "C1", DECODING: "C0"}
    sizes = {(w.request, s.index): w.n_tokens for s in schedule.steps for w in s.entries}
    for i in range(n_req):
        for t in range(n_steps):
            c = colors.get(int(codes[i, t]))
            if c is None:
                continue
            ax.add_patch(Rectangle((t, i - 0.4), 1, 0.8, facecolor=c, edgecolor="white", linewidth=0.8,
                                   hatch="..." if codes[i, t] == WAITING else None))
            if annotate and codes[i, t] == PREFILLING and n_steps <= 60:
                ax.text(t + 0.5, i, str(sizes[(i, t)]), ha="center", va="center", fontsize=7, color="black")
        r = schedule.results[i]
        ax.plot(r.request.arrival, i - 0.5, marker="v", color="black", markersize=6)  # arrives
        ax.plot(r.first_token_step + 1, i, marker="*", color="crimson", markersize=11,  # chosen at
                markeredgecolor="white", markeredgewidth=0.6)  # the end of that step
    names = names or [r.request.name or f"r{i}" for i, r in enumerate(schedule.results)]
    ax.set_yticks(range(n_req), labels=[f"{n} ({len(r.request.prompt)}+{r.request.max_new_tokens})"
                                        for n, r in zip(names, schedule.results)])
    ax.set_ylim(n_req - 0.4, -0.75)
    ax.set_xlim(-0.3, n_steps + 0.3)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_xlabel("engine step")
    ax.set_ylabel("request (prompt + new tokens)")
    ax.legend(handles=[Patch(facecolor="C1", label="prefill chunk (tokens)"), Patch(facecolor="C0", label="decode"),
                       Patch(facecolor="#e6e6e6", hatch="...", label="waiting"),
                       Patch(facecolor="#fff2a8", label="admitted, idle"),
                       plt.Line2D([], [], marker="v", color="black", linestyle="", label="arrival"),
                       plt.Line2D([], [], marker="*", color="crimson", linestyle="", label="first token")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if title:
        ax.set_title(title)
    return codes


def batch_token_bars(ax, schedule, *, title=None):
    """Tokens in each step's batch, stacked: decode rows (blue) under prefill rows (orange), with
    the token budget as a dashed line. Returns the per-step totals."""
    decode = np.array([sum(w.n_tokens for w in s.entries if w.phase == "decode") for s in schedule.steps])
    prefill = np.array([sum(w.n_tokens for w in s.entries if w.phase == "prefill") for s in schedule.steps])
    x = np.arange(len(schedule.steps)) + 0.5
    ax.bar(x, decode, width=0.9, color="C0", label="decode rows")
    ax.bar(x, prefill, width=0.9, bottom=decode, color="C1", label="prefill rows")
    if schedule.token_budget is not None:
        ax.axhline(schedule.token_budget, color="black", linestyle="--", linewidth=1,
                   label=f"token budget {schedule.token_budget}")
    ax.set_xlim(-0.3, len(schedule.steps) + 0.3)
    ax.set_xlabel("engine step")
    ax.set_ylabel("tokens in batch")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if title:
        ax.set_title(title)
    return decode + prefill


def schedule_figure(schedule, *, title=None, names=None):
    """The timeline over the batch sizes, sharing the step axis. Returns the figure."""
    n_req = len(schedule.results)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(min(4 + 0.28 * schedule.total_steps, 15), 1.6 + 0.5 * n_req + 2.0),
                                      height_ratios=[max(n_req, 2), 2.2], sharex=True, layout="constrained")
    schedule_timeline(top, schedule, names=names, title=title)
    batch_token_bars(bottom, schedule)
    top.set_xlabel("")
    return fig


def ttft_bars(ax, schedules, *, metric="ttft", title=None):
    """Grouped bars of one per-request metric ("ttft", "tpot", "latency") for several schedules of
    the same requests: {"continuous": s1, "one at a time": s2}. Returns {name: values}."""
    names = list(schedules)
    values = {n: [getattr(r, metric) or 0 for r in schedules[n].results] for n in names}
    n_req = len(next(iter(values.values())))
    width = 0.8 / len(names)
    x = np.arange(n_req)
    for k, n in enumerate(names):
        bars = ax.bar(x + (k - (len(names) - 1) / 2) * width, values[n], width, label=n)
        ax.bar_label(bars, fmt="%g", fontsize=7)
    first = schedules[names[0]]
    ax.set_xticks(x, labels=[r.request.name or f"r{i}" for i, r in enumerate(first.results)])
    ax.set_xlabel("request")
    ax.set_ylabel(f"{metric} (engine steps)")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return values


# ----------------------------------------------------------------------------- 08-09: KV memory

MEMORY_STATES = ("free", "allocated, empty", "holding a position")
MEMORY_COLORS = ("#f4f4f4", "#f4a261", "#2a9d8f")


def block_table_heatmap(ax, table, row_labels=None, title=None, *, shared=None, annotate=True,
                        ylabel="sequence", colorbar=True, n_blocks=None):
    """Block tables as a heatmap: row = sequence, column = logical block, colour and number =
    the physical block holding it; cells without a block (-1) grey and hatched. `shared`:
    (row, col) cells to outline (e.g. blocks held by more than one sequence); `n_blocks`: the
    pool size, to fix the colour scale (default: the largest id shown)."""
    from matplotlib.ticker import MaxNLocator

    table = np.asarray(table)
    if table.ndim != 2:
        raise ValueError(f"block table must be 2-D [sequences, logical blocks], got shape {table.shape}")
    top = max(1, int(table.max()) if n_blocks is None else int(n_blocks) - 1)
    im = heatmap(ax, table.astype(float), row_labels, None, title, mask=table < 0, cmap="viridis",
                 annotate=annotate and table.size <= 400, fmt="{:.0f}", xlabel="logical block",
                 ylabel=ylabel, colorbar=colorbar, cbar_label="physical block" if colorbar else None,
                 vmin=0, vmax=top)
    if colorbar and im.colorbar is not None:
        im.colorbar.locator = MaxNLocator(integer=True)
        im.colorbar.update_ticks()
    for i, j in (shared or ()):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
    return im


def memory_map(ax, states, title=None, *, slots_per_block=None, xlabel="memory slot (position)",
               ylabel="step", colorbar=True):
    """Memory over time: row = step, column = slot; free / allocated-but-empty / holding a
    position in three colours. `slots_per_block` draws faint block boundaries."""
    from matplotlib.colors import BoundaryNorm, ListedColormap

    states = np.asarray(states)
    cmap = ListedColormap(MEMORY_COLORS)
    im = ax.imshow(states, cmap=cmap, norm=BoundaryNorm([-0.5, 0.5, 1.5, 2.5], 3), aspect="auto",
                   interpolation="nearest")
    if slots_per_block and slots_per_block > 1 and states.shape[1] // slots_per_block <= 80:
        for x in range(slots_per_block, states.shape[1], slots_per_block):
            ax.axvline(x - 0.5, color="white", linewidth=0.4)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if colorbar:
        cb = ax.figure.colorbar(im, ax=ax, ticks=[0, 1, 2], fraction=0.046, pad=0.04)
        cb.ax.set_yticklabels(MEMORY_STATES, fontsize=8)
    return im


def trace_memory_lines(ax, memory, title=None):
    """Positions held vs contiguous reservation vs paged slots over a trace (a TraceMemory);
    the gaps above the held line are waste."""
    steps = memory.steps
    ax.plot(steps, memory.reserved, color="C3", label="contiguous: reserved slots")
    ax.plot(steps, memory.paged_slots, color="C0", label=f"paged: slots in blocks (B={memory.block_size})")
    ax.plot(steps, memory.tokens, color="black", linewidth=2, label="positions held")
    ax.fill_between(steps, memory.tokens, memory.reserved, color="C3", alpha=0.15)
    ax.fill_between(steps, memory.tokens, memory.paged_slots, color="C0", alpha=0.3)
    ax.set_xlabel("step")
    ax.set_ylabel("KV slots (positions)")
    ax.legend(fontsize=8, loc="upper right")
    if title:
        ax.set_title(title)
    return ax


# ----------------------------------------------------------------------------- 07: a real model

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
    if isinstance(ncols, bool) or not isinstance(ncols, (int, np.integer)) or ncols < 1:
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
