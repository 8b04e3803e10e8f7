"""What notebook 25 shows of grammar-constrained decoding: one step of a constrained generation at a
time (the text so far, the model's own favourite tokens and which of them the grammar allows, how
many tokens the mask leaves), a slider over the steps, and a figure of the mask's size per step."""
from __future__ import annotations

import html

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np

from ..core.validate import is_int
from ..decoding.sampling import probabilities
from .base import STYLE, panel


def grammar_steps(generation, grammar, piece, top: int = 5) -> list:
    """One dict per step of `generation` (a td.generate result run with keep_logits=True and
    `grammar` among its processors): "step" (1-based), "text" (the generated text before it),
    "allowed" (tokens the mask leaves), "accepting" (the text so far is complete), "chosen" (the
    token taken), "candidates": the model's `top` most likely tokens before the mask, each
    (piece, probability, allowed). `piece(id) -> str` gives a token's text."""
    if not is_int(top) or top < 1:
        raise ValueError(f"top must be an integer >= 1, got {top!r}")
    if not generation.events or generation.events[0].logits is None:
        raise ValueError("the generation kept no logits: run td.generate(..., keep_logits=True)")
    start = generation.prompt_length
    grammar.start(generation.tokens[:start])
    steps = []
    for k, event in enumerate(generation.events):
        context = generation.tokens[:start + k]
        mask = grammar.mask(context)
        probs = probabilities(event.logits)
        best = np.argsort(-probs, kind="stable")[:top]
        steps.append({"step": k + 1, "text": "".join(piece(t) for t in context[start:]),
                      "allowed": int(mask.sum()), "accepting": grammar.is_accepting(context),
                      "chosen": piece(event.next_token),
                      "candidates": [(piece(int(j)), float(probs[j]), bool(mask[j])) for j in best]})
    return steps


def _label(text: str) -> str:
    """A token's text with its whitespace made visible (⏎ a newline, · a space, ∅ nothing)."""
    return text.replace("\n", "⏎").replace(" ", "·") or "∅"


def _shown(text: str) -> str:
    return html.escape(_label(text))


def step_html(view: dict, vocab_size: int) -> str:
    """A step as HTML: the text so far, then the model's favourites, allowed ones green, masked
    ones red and struck through, and the token the constrained decoder took."""
    rows = "".join(
        f"<tr><td style='font-family:monospace;color:{'#2e7d32' if ok else '#c62828'};"
        f"{'' if ok else 'text-decoration:line-through;'}'>{_shown(p)}</td>"
        f"<td style='text-align:right'>{prob:.3f}</td><td>{'allowed' if ok else 'masked'}</td></tr>"
        for p, prob, ok in view["candidates"])
    state = "complete: an end token is allowed" if view["accepting"] else "incomplete: no end token yet"
    return (f"<div><b>step {view['step']}</b>: the mask leaves {view['allowed']:,} of {vocab_size:,} tokens; "
            f"the text so far is {state}.<br>"
            f"<span style='font-family:monospace'>{_shown(view['text'])}</span><br>"
            f"<table><tr><th>model's favourites</th><th>p</th><th></th></tr>{rows}</table>"
            f"took <b style='font-family:monospace'>{_shown(view['chosen'])}</b></div>")


def grammar_widget(steps: list, vocab_size: int):
    """A slider over the steps of `grammar_steps`; each position shows `step_html`."""
    if not steps:
        raise ValueError("no steps to show: the generation produced no tokens")
    slider = W.IntSlider(value=1, min=1, max=len(steps), description="step", style=STYLE,
                         continuous_update=False)
    return panel({"step": slider}, lambda step: steps[step - 1],
                 lambda view: W.HTML(step_html(view, vocab_size)),
                 title="Constrained decoding, one step at a time")


def draw_mask_sizes(steps: list, vocab_size: int):
    """Tokens the mask leaves at each step (log scale), forced steps (one token) marked."""
    allowed = np.array([s["allowed"] for s in steps])
    x = np.arange(1, len(steps) + 1)
    fig, ax = plt.subplots(figsize=(9, 3), layout="constrained")
    ax.bar(x, allowed, color=["C3" if a == 1 else "C0" for a in allowed])
    ax.axhline(vocab_size, color="k", lw=1, ls="--", label=f"whole vocabulary ({vocab_size:,})")
    ax.set_yscale("log")
    ax.set_xticks(x, [_label(s["chosen"]) for s in steps], rotation=90, fontsize=9, family="monospace")
    ax.set_xlabel("the token taken at each step")
    ax.set_ylabel("tokens the grammar allows")
    ax.legend(handles=[*ax.get_legend_handles_labels()[0], plt.Rectangle((0, 0), 1, 1, color="C3")],
              labels=[f"whole vocabulary ({vocab_size:,})", "forced: one legal token"], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig
