"""A radix tree of cached token sequences, drawn as an icicle chart (notebook 18).

Each node is a bar from the position where its edge starts to where it ends (x: token
position); each cached sequence (leaf) gets a lane, and a node spans the lanes of every
sequence below it, so a prefix shared by k sequences is a bar k lanes tall. Optional dotted
lines at every multiple of a block size show where a block-hash chain may cut.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

__all__ = ["radix_icicle"]


def _layout(tree):
    """[(node, start, lane_lo, lane_hi)] with lanes given to leaves in token order."""
    rows, next_lane = [], [0]

    def visit(node, start):
        lo = next_lane[0]
        if node.is_leaf:
            next_lane[0] += 1
        for t in sorted(node.children):
            visit(node.children[t], start + len(node.key))
        if node is not tree.root:
            rows.append((node, start, lo, next_lane[0]))

    visit(tree.root, 0)
    return rows, next_lane[0]


def radix_icicle(ax, tree, label=None, *, block_size=None, title=None, min_label_tokens=6,
                 lane_names=None):
    """Draw `tree` (a serving.radix.RadixCache) on `ax`. label(key tuple) -> str names a node's
    edge (default: its token count); block_size draws the block boundaries. Lanes follow
    `tree.sequences()` (leaves in token order), so lane_names[i] names tree.sequences()[i].
    Returns the [(node, start, lane_lo, lane_hi)] layout drawn."""
    rows, n_lanes = _layout(tree)
    if not rows:
        ax.set_title(title or "empty tree")
        return rows
    most = max(hi - lo for _, _, lo, hi in rows)
    cmap = plt.get_cmap("Blues", most + 2)
    end = max(start + len(node.key) for node, start, _, _ in rows)
    fig = ax.get_figure()
    axes_inches = fig.get_size_inches()[0] * ax.get_position().width
    chars_per_token = axes_inches * 72 / end / (0.62 * 7)  # 7-point text, ~0.62 em per character
    for node, start, lo, hi in rows:
        width = len(node.key)
        ax.add_patch(Rectangle((start, lo + 0.06), width, hi - lo - 0.12, facecolor=cmap(hi - lo + 1),
                               edgecolor="black", linewidth=0.8,
                               hatch="//" if node.lock_ref else None))
        text = f"{width}" if label is None else label(node.key)
        if width >= min_label_tokens and text:
            room = max(1, int(width * chars_per_token) - 1)  # characters that fit, roughly
            shown = text if len(text) <= room else text[:max(1, room - 1)] + "…"
            dark = (hi - lo + 1) / (most + 2) > 0.6
            ax.text(start + width / 2, (lo + hi) / 2, shown, ha="center", va="center", fontsize=7,
                    color="white" if dark else "black", clip_on=True)
    if block_size:
        for x in np.arange(block_size, end + 1, block_size):
            ax.axvline(x, color="C3", linestyle=":", linewidth=0.8)
    ax.set_xlim(0, end)
    ax.set_ylim(n_lanes, 0)
    ax.set_yticks(np.arange(n_lanes) + 0.5)
    ax.set_yticklabels(lane_names if lane_names is not None else [f"sequence {i}" for i in range(n_lanes)],
                       fontsize=8)
    ax.set_xlabel("token position" + (f" (dotted: block boundaries, B = {block_size})" if block_size else ""))
    if title:
        ax.set_title(title)
    return rows
