"""Drawing a beam search: the tree of candidates, step by step, and a widget over settings.

`beam_tree_layout(result)` is the data (unit-tested): one node per candidate the search
considered, placed at x = step + 1 (the prompt is the root at x = 0) and stacked so that
siblings sit together under their parent; `draw_beam_tree` draws it: kept beams blue,
finished ones green, pruned ones grey, the path of the best beam in red.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

COLORS = {"kept": "C0", "finished": "C2", "pruned": "#b0b0b0"}


def beam_tree_layout(result) -> dict:
    """Nodes and edges of the candidates tree.

    nodes: list of dicts (step, x, y, token, tokens, logprob, status, parent_node, best) where
    parent_node indexes `nodes` (-1: the prompt root at (0, 0)) and best marks the best beam's
    path. edges: (parent_node, node) pairs. At each step the candidates are stacked (y = 0, -1,
    ...) in the order of their parent's y, then of their rank."""
    best = list(result.best.tokens)
    nodes, edges = [], []
    kept_node = {0: -1}  # live beam index of the step before -> its node (the root at step 0)
    parent_y = {-1: 0.0}
    for step, candidates in enumerate(result.steps):
        ordered = sorted(range(len(candidates)),
                         key=lambda i: (-parent_y[kept_node[candidates[i]["parent"]]], i))
        next_kept = {}
        for slot, i in enumerate(ordered):
            c = candidates[i]
            parent = kept_node[c["parent"]]
            node = {"step": step, "x": step + 1, "y": -float(slot), "token": c["token"], "tokens": c["tokens"],
                    "logprob": c["logprob"], "status": c["status"], "parent_node": parent,
                    "best": c["tokens"] == best[:len(c["tokens"])]}
            edges.append((parent, len(nodes)))
            parent_y[len(nodes)] = node["y"]
            if c["status"] == "kept":
                next_kept[c["beam"]] = len(nodes)
            nodes.append(node)
        kept_node = next_kept
    return {"nodes": nodes, "edges": edges, "n_steps": len(result.steps)}


def draw_beam_tree(result, text=str, *, ax=None, title=None, fontsize=7):
    """The candidates tree of `result`; `text(id)` labels a token. Returns the Figure."""
    layout = beam_tree_layout(result)
    nodes = layout["nodes"]
    if ax is None:
        height = max(2.5, 0.32 * (1 + max((-n["y"] for n in nodes), default=0)))
        fig, ax = plt.subplots(figsize=(min(2.0 * (layout["n_steps"] + 1), 15), height), layout="constrained")
    else:
        fig = ax.figure
    for parent, child in layout["edges"]:
        p = (0.0, 0.0) if parent < 0 else (nodes[parent]["x"], nodes[parent]["y"])
        c = nodes[child]
        ax.plot([p[0], c["x"]], [p[1], c["y"]], color="C3" if c["best"] else "#d0d0d0",
                lw=2.0 if c["best"] else 0.8, zorder=1)
    ax.text(0, 0, "prompt", ha="center", va="center", fontsize=fontsize,
            bbox=dict(boxstyle="round", fc="white", ec="black"), zorder=3)
    for n in nodes:
        label = f"{text(n['token'])!r}\n{n['logprob']:.2f}"
        ax.text(n["x"], n["y"], label, ha="center", va="center", fontsize=fontsize, zorder=3,
                color="black" if n["status"] != "pruned" else "#808080",
                bbox=dict(boxstyle="round", fc="white", ec="C3" if n["best"] else COLORS[n["status"]],
                          lw=1.5 if n["best"] else 1.0))
    ax.set_xlim(-0.6, layout["n_steps"] + 0.6)
    ax.set_ylim(min((n["y"] for n in nodes), default=0) - 0.6, 0.6)
    ax.set_xticks(range(layout["n_steps"] + 1), ["prompt"] + [f"step {t + 1}" for t in range(layout["n_steps"])])
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or f"beam search: {len(result.beams)} beams; boxes: token, summed log-prob; "
                          f"blue kept, green finished, grey pruned, red the best beam", fontsize=9)
    return fig


def beam_widget(results: dict, text=str):
    """A widget over precomputed searches: results[(beams, repetition_penalty)] -> BeamSearchResult.
    Sliders pick the beam width and the penalty; the tree is redrawn."""
    import ipywidgets as W

    from .base import STYLE, panel

    widths = sorted({k[0] for k in results})
    penalties = sorted({k[1] for k in results})
    controls = {"beams": W.SelectionSlider(options=widths, value=widths[-1], description="beam width", style=STYLE),
                "penalty": W.SelectionSlider(options=penalties, value=penalties[0],
                                             description="repetition penalty", style=STYLE)}

    def compute(beams, penalty):
        return results[(beams, penalty)]

    def draw(result):
        return draw_beam_tree(result, text, title=f"{len(result.beams)} beams, repetition penalty {controls['penalty'].value}: "
                                                  f"best {''.join(text(t) for t in result.best.tokens)!r} "
                                                  f"(log-prob {result.best.logprob:.2f})")

    return panel(controls, compute, draw, title="Beam search tree")
