"""What notebook 15 shows of speculative decoding: one verification pass at a time (a view, its
HTML with accepted / rejected / target tokens coloured, a slider over the passes), a figure of
every pass, and the measured time of a verification pass as a function of its rows."""
from __future__ import annotations

import html
import time

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np

from .. import fast
from ..core.validate import is_int
from .base import STYLE, panel

COLORS = {"accepted": "#2e7d32", "rejected": "#c62828", "target": "#1565c0", "context": "#757575"}


def step_view(result, step: int) -> dict:
    """Pass `step` (1-based) of a SpeculativeGeneration: {"step", "context" (the tokens before it),
    "proposed", "accepted" (count), "rejected" (the guesses thrown away), "target_token", "kind"
    ("bonus": every guess kept, then one more; "correction": the target's token replaced the first
    rejected guess; "plain": nothing was guessed), "new_before" (tokens generated before it),
    "calls" (target forward passes so far, the prefill included)}."""
    if not is_int(step) or not 1 <= step <= len(result.steps):
        raise ValueError(f"step must be an integer in 1..{len(result.steps)} (the verification passes run), got {step!r}")
    s = result.steps[step - 1]
    before = result.prompt_length + 1 + sum(len(x.tokens) for x in result.steps[:step - 1])
    kind = "plain" if not s.proposed else "bonus" if s.accepted == len(s.proposed) else "correction"
    return {"step": int(step), "context": result.tokens[:before], "proposed": list(s.proposed),
            "accepted": s.accepted, "rejected": list(s.proposed[s.accepted:]), "target_token": s.target_token,
            "kind": kind, "new_before": before - result.prompt_length, "calls": 1 + int(step)}


def _piece(text: str, color: str, strike: bool = False, bold: bool = False) -> str:
    shown = html.escape(text).replace("\n", "⏎<br>").replace(" ", "&nbsp;") or "&empty;"
    style = f"color:{color};" + ("text-decoration:line-through;" if strike else "") + \
        ("font-weight:bold;" if bold else "") + "border:1px solid #ddd;padding:0 1px;margin:0 1px;"
    return f'<span style="{style}">{shown}</span>'


def step_html(view, text, context_tokens: int = 30) -> str:
    """The pass as HTML: the last `context_tokens` tokens of context (grey), the kept guesses
    (green), the rejected ones (red, struck through) and the target's own token (blue, bold).
    `text(id) -> str` gives a token's text."""
    ctx = view["context"][-context_tokens:]
    parts = [_piece(text(t), COLORS["context"]) for t in ctx]
    parts += [_piece(text(t), COLORS["accepted"], bold=True) for t in view["proposed"][:view["accepted"]]]
    parts += [_piece(text(t), COLORS["rejected"], strike=True) for t in view["rejected"]]
    parts.append(_piece(text(view["target_token"]), COLORS["target"], bold=True))
    n = len(view["proposed"])
    head = (f"<b>pass {view['step']}</b> (target forward call {view['calls']}): the draft guessed {n} token(s), "
            f"the target kept {view['accepted']}, then added 1 ({view['kind']}): "
            f"+{view['accepted'] + 1} tokens in one pass. "
            f"<span style='color:{COLORS['accepted']}'>kept</span> · "
            f"<span style='color:{COLORS['rejected']}'>rejected</span> · "
            f"<span style='color:{COLORS['target']}'>target's token</span>")
    return f"<div style='font-family:monospace;line-height:1.8'>{head}<br>{''.join(parts)}</div>"


def speculative_widget(result, text, context_tokens: int = 30):
    """Slider "verification pass": step through the passes of a SpeculativeGeneration."""
    from IPython.display import HTML

    slider = W.IntSlider(value=1, min=1, max=max(1, len(result.steps)), description="verification pass",
                         continuous_update=False, style=STYLE)
    return panel({"step": slider}, lambda step: step_view(result, step),
                 lambda view: HTML(step_html(view, text, context_tokens)))


def steps_figure(results: dict, k: int | None = None):
    """One row per run ({label: SpeculativeGeneration}): for each pass, the guesses kept (green)
    and rejected (red) and the target's token (blue)."""
    fig, axes = plt.subplots(len(results), 1, figsize=(11, 1.2 + 1.5 * len(results)), layout="constrained",
                             sharex=True, squeeze=False)
    for ax, (label, r) in zip(axes[:, 0], results.items()):
        x = np.arange(1, len(r.steps) + 1)
        kept = np.array([s.accepted for s in r.steps])
        rejected = np.array([len(s.proposed) - s.accepted for s in r.steps])
        ax.bar(x, kept, color=COLORS["accepted"], label="guesses kept")
        ax.bar(x, np.ones_like(kept), bottom=kept, color=COLORS["target"], label="target's token")
        ax.bar(x, rejected, bottom=kept + 1, color=COLORS["rejected"], alpha=0.5, label="guesses rejected")
        ax.set_ylabel("tokens")
        ax.set_title(f"{label}: {len(r.new_tokens)} tokens in {r.target_forward_calls} target passes "
                     f"(acceptance {r.acceptance_rate:.2f})", fontsize=10)
        if k is not None:
            ax.axhline(k + 1, color="k", lw=0.6, ls=":")
    axes[0, 0].legend(loc="upper right", fontsize=8, ncols=3)
    axes[-1, 0].set_xlabel("verification pass")
    return fig


def verify_pass_seconds(model, context, rows=(1, 2, 3, 5, 9, 17), repeat: int = 3) -> dict:
    """Measured seconds of one target pass over n new rows after a cached `context` (the best
    of `repeat`), for each n in `rows`: {n: seconds}, on the fast path `speculative_generate`
    verifies with. The cache is rolled back after each pass."""
    cache = model.new_cache(capacity=len(context) + max(rows))
    fast.forward(model, context, cache, last_only=True)
    seconds = {}
    for n in rows:
        ids = list(context[-n:]) if n <= len(context) else [int(context[-1])] * n
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            fast.forward(model, ids, cache, last_only=n == 1)
            best = min(best, time.perf_counter() - start)
            cache.truncate(len(context))
        seconds[int(n)] = best
    return seconds
