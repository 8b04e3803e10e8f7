"""Notebook 14's figures and widget (tinydecoder.long_context_viz)."""
import matplotlib.pyplot as plt
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.widgets import long_context as lv

CURVES = {"dense": np.full(99, 2.0), "window only": np.linspace(2, 4, 99), "sinks + window": np.full(99, 2.1)}


def test_trailing_mean():
    np.testing.assert_allclose(lv.trailing_mean([1, 2, 3, 4], 2), [1, 1.5, 2.5, 3.5])
    with pytest.raises(ValueError, match="width must be an integer >= 1"):
        lv.trailing_mean([1], 0)


def test_stream_view_and_widget():
    view = lv.stream_view(CURVES, 50, 4, 20, "sinks + window")
    assert view["n_held"] == 24 and view["held"][:4].all() and view["sink"][:4].all()
    assert view["held"][30:50].all() and not view["held"][4:30].any() and not view["held"][50:].any()
    window = lv.stream_view(CURVES, 50, 4, 20, "window only")
    assert window["n_held"] == 24 and not window["held"][0] and window["held"][26:50].all()
    assert lv.stream_view(CURVES, 50, 4, 20, "dense")["n_held"] == 50
    assert lv.stream_view(CURVES, 100, 4, 20, "dense")["recent_nll"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="cache must be one of"):
        lv.stream_view(CURVES, 50, 4, 20, "paged")
    with pytest.raises(ValueError, match=r"tokens_seen must be in 1\.\.100"):
        lv.stream_view(CURVES, 0, 4, 20, "dense")
    box = lv.stream_widget(CURVES, 4, 20)
    box.controls["cache"].value = "window only"
    box.controls["tokens_seen"].value = 80
    assert box.data["n_held"] == 24 and box.data["cache"] == "window only"


def test_figures():
    assert isinstance(lv.nll_curves_figure(CURVES, 24), plt.Figure)
    assert isinstance(lv.stream_figure(lv.stream_view(CURVES, 60, 4, 20, "sinks + window")), plt.Figure)
    cfg = td.Config(vocab_size=10, d_model=8, n_heads=2, n_kv_heads=1, head_dim=4, n_layers=2, d_ff=8,
                    max_context=64)
    fig = lv.sliding_window_figure(cfg, [16], 64)
    assert max(fig.axes[0].lines[1].get_ydata()) == pytest.approx(16 * cfg.kv_bytes_per_token(4) / 1e6)
