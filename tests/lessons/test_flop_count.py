"""Helpers added for notebooks 05-07 (issue 11): prefill FLOPs from a config, fixed heatmap scales."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import tinydecoder as td  # noqa: E402
from tinydecoder import viz, widgets  # noqa: E402
from tinydecoder.lessons import flop_count  # noqa: E402

SMOLLM2_SHAPE = td.Config(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, n_layers=30,
                          d_ff=1536, max_context=8192, position="rope", rope_base=100000.0,
                          tied_embeddings=True, name="SmolLM2-135M")


def traced_flops(model, ids, last_only):
    trace = td.Trace()
    td.forward(model, ids, last_only=last_only, trace=trace)
    return {(r.layer, r.op): r.flops for r in trace.ops if r.flops}


@pytest.mark.parametrize("last_only", [False, True])
@pytest.mark.parametrize("n_tokens", [1, 4, 7])
def test_prefill_flops_equal_a_real_trace(last_only, n_tokens):
    cfg = td.Config(vocab_size=16, d_model=24, n_heads=6, n_kv_heads=2, head_dim=4, n_layers=3, d_ff=40,
                    max_context=16, position="rope")
    model = td.random_model(cfg, seed=1, dtype=np.float64)
    ids = list(range(n_tokens))
    assert flop_count.prefill_flops(cfg, n_tokens, last_only=last_only) == traced_flops(model, ids, last_only)


def test_prefill_flops_on_the_toy_model():
    model = td.toy_model()
    for last_only in (False, True):
        assert flop_count.prefill_flops(model.config, 4, last_only=last_only) == traced_flops(
            model, td.SEED_PROMPT, last_only)


def test_last_only_saving_smollm2_shape_matches_notebook_08_trace():
    # notebook 08 traces the real SmolLM2 on a 5-token prompt: 1,346,526,720 -> 1,093,446,144 FLOPs,
    # LM head 283,115,520 -> 56,623,104
    s = flop_count.last_only_saving(SMOLLM2_SHAPE, 5)
    assert (s["full"], s["last_only"]) == (1_346_526_720, 1_093_446_144)
    assert s["saved"] == 253_080_576 and s["lm_head_saved"] == 226_492_416
    assert s["last_layer_saved"] == s["saved"] - s["lm_head_saved"]
    assert 0.89 < s["lm_head_share"] < 0.9


def test_last_only_saves_nothing_on_one_token():
    s = flop_count.last_only_saving(SMOLLM2_SHAPE, 1)
    assert s["saved"] == 0 and s["lm_head_share"] == 0.0


def test_prefill_flops_errors():
    with pytest.raises(ValueError, match="n_tokens must be a positive integer"):
        flop_count.prefill_flops(SMOLLM2_SHAPE, 0)
    with pytest.raises(ValueError, match="config must be a tinydecoder Config"):
        flop_count.prefill_flops({"d_model": 576}, 5)


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
