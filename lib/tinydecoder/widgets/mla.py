"""The figure and widget of the MLA section (notebook 05): cache elements per token of MHA, GQA,
MQA and MLA side by side, with sliders for MLA's latent width d_c and RoPE key width d_R."""
from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt

from ..lessons.mla import cache_table
from .base import STYLE, panel


def cache_bars_figure(rows: list, title: str):
    """Bars of elements cached per token (rows from mla.cache_table), labelled with the fraction
    of MHA's and the GQA group count that would cache as much."""
    fig, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    kinds = [r["kind"] for r in rows]
    values = [r["elements_per_token"] for r in rows]
    bars = ax.bar(kinds, values, color=["C0", "C1", "C2", "C3"][:len(rows)])
    for bar, r in zip(bars, rows):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                f"{r['elements_per_token']:,}\n{100 * r['fraction_of_mha']:.1f}% of MHA\n"
                f"= {r['equivalent_groups']:g} KV heads", ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylim(top=max(values) * 20)
    ax.set_ylabel("numbers cached per token (all layers)")
    ax.set_title(title, fontsize=9)
    return fig


def mla_cache_widget(n_heads: int, head_dim: int, n_layers: int, n_groups: int, name: str = "model"):
    """Sliders "latent d_c" and "RoPE key d_R": the four caches' sizes for these shapes."""
    controls = {"d_latent": W.IntSlider(value=4 * head_dim, min=head_dim // 2, max=8 * head_dim,
                                        step=head_dim // 2, description="latent d_c",
                                        continuous_update=False, style=STYLE),
                "d_rope": W.IntSlider(value=head_dim // 2, min=2, max=head_dim, step=2,
                                      description="RoPE key d_R", continuous_update=False, style=STYLE)}

    def compute(d_latent, d_rope):
        return {"rows": cache_table(n_heads, head_dim, n_layers, n_groups, d_latent, d_rope),
                "d_latent": d_latent, "d_rope": d_rope}

    return panel(controls, compute,
                 lambda view: cache_bars_figure(view["rows"], f"{name}: MLA with d_c = {view['d_latent']}, "
                                                f"d_R = {view['d_rope']}"),
                 title="KV cache per token: MHA / GQA / MQA / MLA")
