"""Helpers added for notebooks 05-07 (issue 11): fixed heatmap scales, the KV-heads bar chart in bytes."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import tinydecoder as td  # noqa: E402
from tinydecoder import viz, widgets  # noqa: E402

SMOLLM2_SHAPE = td.Config(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, n_layers=30,
                          d_ff=1536, max_context=8192, position="rope", rope_base=100000.0,
                          tied_embeddings=True, name="SmolLM2-135M")


def test_head_heatmaps_fixed_scale():
    w = np.full((2, 1, 3), 0.2)  # all weights small: auto-scaling would stretch them over the colour map
    fig = viz.head_heatmaps(w, mask=None, vmin=0, vmax=1)
    clims = {im.get_clim() for ax in fig.axes for im in ax.get_images()}
    assert clims == {(0.0, 1.0)}
    auto = viz.head_heatmaps(w + np.array([0.0, 0.1, 0.2]), mask=None)
    assert {im.get_clim() for ax in auto.axes for im in ax.get_images()} == {(0.2, 0.4)}
    plt.close("all")


def test_kv_heads_figure_axis_in_bytes():
    fig = widgets.kv_heads_figure(widgets.kv_heads_view(SMOLLM2_SHAPE, 3))
    bar_ax = fig.axes[1]
    assert bar_ax.get_ylabel() == "KV cache, bytes per token"
    heights = sorted(p.get_height() for p in bar_ax.patches)
    assert heights == [15360, 46080, 138240]  # MQA, GQA (3), MHA (9) in float32
    plt.close("all")
