"""Widget of notebook 18 (prefix caching): how many prompt tokens each request finds cached, for
a block size the slider picks, against the prefix it really shares with the requests before it."""
from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np

from ..serving.prefix_replay import prefix_reuse
from .base import STYLE, panel


def prefix_reuse_figure(view):
    """Bars: per request, the tokens it shares with earlier ones and the tokens its blocks reuse."""
    n = len(view["shared"])
    fig, ax = plt.subplots(figsize=(7, 2.8), layout="constrained")
    x = np.arange(n)
    ax.bar(x - 0.2, view["shared"], 0.4, label="shared with an earlier request", color="0.75")
    ax.bar(x + 0.2, view["reused"], 0.4, label=f"reused in blocks of {view['block_size']}", color="tab:blue")
    ax.set_xticks(x, [f"request {i + 1}" for i in range(n)])
    ax.set_ylabel("prompt tokens")
    ax.set_title(f"block size {view['block_size']}: {sum(view['reused'])} of {sum(view['shared'])} shared tokens "
                 f"reused", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def prefix_reuse_widget(prompts, sizes=(1, 2, 4, 8, 16, 32, 64), value=16):
    """Slider "block size": each later request's shared prefix and what whole blocks reuse of it."""
    slider = W.SelectionSlider(options=list(sizes), value=value, description="block size",
                               continuous_update=False, style=STYLE)
    return panel({"block_size": slider}, lambda block_size: prefix_reuse(prompts, block_size),
                 prefix_reuse_figure, title="prefix caching: block size vs tokens reused")
