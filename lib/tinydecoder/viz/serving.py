"""Figures of Part III's serving chapters: chunked prefill masks, batching timelines, KV memory maps."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from ..core.validate import is_int
from .common import MASK_COLOR, MASK_HATCH, MAX_TICKS, heatmap  # noqa: F401

# ----------------------------------------------------------------------------- 18: chunked prefill

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

    from ..serving.chunked import chunk_masks, chunk_spans

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

    from ..serving.chunked import chunk_spans

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
# ----------------------------------------------------------------------------- 19: continuous batching

def schedule_timeline(ax, schedule, *, names=None, title=None, annotate=True):
    """A Gantt chart of a scheduler.Schedule: one row per request, one column per engine step.
    Orange: a prefill chunk (its token count written in), blue: a decode step, light grey:
    arrived but waiting for admission, pale yellow: admitted but given no work that step,
    ▼ above the step it arrives in, ★ inside the cell of the step that chose its first token
    (its last prefill chunk). Step t is the cell from x = t to t + 1; its tick label sits at
    the cell's centre. Returns the codes drawn (scheduler.timeline_codes)."""
    from ..serving.scheduler import DECODING, PREFILLING, STALLED, WAITING, timeline_codes

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
        r = schedule.results[i]
        for t in range(n_steps):  # a chunk's size; in the first token's cell it moves left of the star
            if annotate and codes[i, t] == PREFILLING and n_steps <= 60:
                x = t + (0.3 if t == r.first_token_step else 0.5)
                ax.text(x, i, str(sizes[(i, t)]), ha="center", va="center", fontsize=7, color="black")
        ax.plot(r.request.arrival + 0.5, i - 0.5, marker="v", color="black", markersize=6)  # arrives
        ax.plot(r.first_token_step + 0.72, i, marker="*", color="crimson", markersize=10,  # chosen in
                markeredgecolor="white", markeredgewidth=0.6)  # that step's cell
    names = names or [r.request.name or f"r{i}" for i, r in enumerate(schedule.results)]
    ax.set_yticks(range(n_req), labels=[f"{n} ({len(r.request.prompt)}+{r.request.max_new_tokens})"
                                        for n, r in zip(names, schedule.results)])
    ax.set_ylim(n_req - 0.4, -0.75)
    ax.set_xlim(-0.3, n_steps + 0.3)
    step_ticks(ax, n_steps)
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


def step_ticks(ax, n_steps: int, max_ticks: int = 25):
    """Label step t at the centre of its cell (x = t + 0.5), every step or every k-th one."""
    every = max(1, -(-n_steps // max_ticks))
    steps = np.arange(0, n_steps, every)
    ax.set_xticks(steps + 0.5, labels=[str(t) for t in steps])
    return steps


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
    step_ticks(ax, len(schedule.steps))
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
# ----------------------------------------------------------------------------- 16-17: KV memory

MEMORY_STATES = ("free", "allocated, empty", "holding a position")
MEMORY_COLORS = ("#f4f4f4", "#f4a261", "#2a9d8f")


def block_id_colors(n_blocks: int):
    """A categorical colour map for physical block ids 0..n_blocks-1: neighbouring ids get
    unrelated colours (tab20, repeated past 20), because a block id is a name, not a size."""
    from matplotlib.colors import ListedColormap

    if not is_int(n_blocks) or n_blocks < 1:
        raise ValueError(f"n_blocks must be an integer >= 1, got {n_blocks!r}")
    palette = plt.get_cmap("tab20").colors
    return ListedColormap([palette[i % len(palette)] for i in range(int(n_blocks))], name="block_ids")


def block_table_heatmap(ax, table, row_labels=None, title=None, *, shared=None, annotate=True,
                        ylabel="sequence", colorbar=True, n_blocks=None):
    """Block tables as a heatmap: row = sequence, column = logical block, colour and number =
    the physical block holding it (categorical colours: one per block id); cells without a
    block (-1) grey and hatched. `shared`: (row, col) cells to outline (e.g. blocks held by
    more than one sequence); `n_blocks`: the pool size (default: the largest id shown + 1)."""
    table = np.asarray(table)
    if table.ndim != 2:
        raise ValueError(f"block table must be 2-D [sequences, logical blocks], got shape {table.shape}")
    n = max(1, int(table.max()) + 1 if n_blocks is None else int(n_blocks))
    im = heatmap(ax, table.astype(float), row_labels, None, title, mask=table < 0, cmap=block_id_colors(n),
                 annotate=annotate and table.size <= 400, fmt="{:.0f}", xlabel="logical block",
                 ylabel=ylabel, colorbar=colorbar, cbar_label="physical block" if colorbar else None,
                 vmin=-0.5, vmax=n - 0.5)
    if colorbar and im.colorbar is not None:
        from matplotlib.ticker import MaxNLocator

        im.colorbar.locator = MaxNLocator(integer=True)
        im.colorbar.update_ticks()
    for i, j in (shared or ()):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
    return im


def block_holders_heatmap(ax, table, holders, row_labels=None, title=None, *, n_sequences=None,
                          xlabel="logical block", ylabel="request"):
    """Prefix sharing in block tables: colour = how many sequences hold the block (one colour
    per count 1..n_sequences, the colour bar's ticks exactly those counts), the number in a
    cell = the physical block; cells without a block grey and hatched."""
    from matplotlib.colors import ListedColormap

    table, holders = np.asarray(table), np.asarray(holders)
    if table.shape != holders.shape or table.ndim != 2:
        raise ValueError(f"table and holders must be 2-D of one shape, got {table.shape} and {holders.shape}")
    n = int(holders.max()) if n_sequences is None else int(n_sequences)
    if n < 1 or holders.max() > n:
        raise ValueError(f"n_sequences must be >= 1 and >= every holder count, got {n_sequences!r}")
    blues = plt.get_cmap("Blues")
    cmap = ListedColormap([blues(0.25 + 0.7 * k / max(1, n - 1)) for k in range(n)])
    im = heatmap(ax, holders.astype(float), row_labels, None, title, mask=table < 0, cmap=cmap,
                 vmin=0.5, vmax=n + 0.5, xlabel=xlabel, ylabel=ylabel, colorbar=True,
                 cbar_label="sequences holding the block")
    im.colorbar.set_ticks(range(1, n + 1))
    for (r, c), block in np.ndenumerate(table):
        if block >= 0:
            red, green, blue, _ = cmap(im.norm(holders[r, c]))
            dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
            ax.text(c, r, str(int(block)), ha="center", va="center", fontsize=8, color="white" if dark else "black")
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


def workload_memory_lines(ax, memory, title=None):
    """Positions held vs contiguous reservation vs paged slots over a workload (a WorkloadMemory);
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
