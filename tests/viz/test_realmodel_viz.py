"""Notebook 07's helpers: log-scale attention maps, the head grid, the attention mass on position 0,
and the attention explorer widget (checked on small decoders; one check on SmolLM2 itself)."""
import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.patches import Rectangle

import tinydecoder as td
from tinydecoder import viz, widgets

GQA = td.Config(vocab_size=11, d_model=12, n_heads=6, n_kv_heads=2, head_dim=4, n_layers=3, d_ff=16,
                max_context=32, position="rope", name="gqa-6-2")


@pytest.fixture(scope="module")
def gqa():
    return td.random_model(GQA, seed=3, dtype=np.float64)


@pytest.fixture(scope="module")
def gqa_trace(gqa):
    trace = td.Trace()
    td.forward(gqa, [1, 5, 2, 7, 3, 9, 4], trace=trace)
    return trace


def hatched(ax):
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch() == viz.MASK_HATCH]


# ------------------------------------------------------------------ log_attention

def test_log_attention_clips_visible_cells_and_masks_the_future():
    w = np.array([[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.9, 1e-9, 0.1 - 1e-9]]])  # [1, 3, 3]
    out = viz.log_attention(w, floor=1e-4)
    assert out.shape == w.shape
    np.testing.assert_allclose(out[0, 1, :2], np.log10([0.5, 0.5]))
    assert out[0, 2, 1] == pytest.approx(-4.0)  # 1e-9 is clipped up to the floor, still visible
    assert out[0, 0, 0] == 0.0
    np.testing.assert_array_equal(np.isneginf(out[0]), viz.future_mask(3, 3))


def test_log_attention_of_a_decode_row_hides_nothing():
    w = np.array([[0.7, 0.2, 0.1]])  # one query at the last of 3 positions
    out = viz.log_attention(w)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, np.log10(w))


def test_log_attention_errors():
    with pytest.raises(ValueError, match=r"weights \[\.\.\., S, T\]"):
        viz.log_attention(np.ones(3))
    with pytest.raises(ValueError, match="floor must be in"):
        viz.log_attention(np.ones((2, 2)), floor=0)


# ------------------------------------------------------------------ head_grid

def test_head_grid_one_row_per_kv_head(gqa_trace):
    w = gqa_trace.attention_weights[(1, 0)]  # [6, 7, 7]
    labels = [str(i) for i in range(7)]
    fig = viz.head_grid(w, labels, labels, ncols=GQA.group_size, head_names=[f"h{h}" for h in range(6)])
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 6 and [ax.get_title() for ax in panels] == [f"h{h}" for h in range(6)]
    # 2 rows of 3: the panel at row r, column c shows head 3r + c
    assert [tuple(ax.get_subplotspec().get_geometry()[:2]) for ax in panels] == [(2, 3)] * 6
    for ax, head in zip(panels, w):
        assert len(hatched(ax)) == 7 * 6 // 2  # the causal triangle
        np.testing.assert_allclose(np.ma.getdata(ax.images[0].get_array())[~viz.future_mask(7, 7)],
                                   head[~viz.future_mask(7, 7)])
        assert ax.images[0].get_clim() == (0.0, 1.0)
    # labels on the left column and the bottom row only
    assert [ax.get_ylabel() for ax in panels] == ["query", "", "", "query", "", ""]
    assert [ax.get_xlabel() for ax in panels] == ["", "", "", "key", "key", "key"]
    bars = [ax for ax in fig.axes if not ax.images and ax.get_ylabel()]
    assert len(bars) == 1 and bars[0].get_ylabel() == "attention weight"


def test_head_grid_log_scale_and_a_partial_last_row(gqa_trace):
    w = gqa_trace.attention_weights[(0, 0)][:5]  # 5 heads in rows of 3: one empty cell
    fig = viz.head_grid(w, ncols=3, log=True, floor=1e-3, title="five heads")
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 5 and fig._suptitle.get_text() == "five heads"
    assert panels[0].images[0].get_clim() == (-3.0, 0.0)
    shown = np.ma.getdata(panels[2].images[0].get_array())
    visible = ~viz.future_mask(7, 7)
    np.testing.assert_allclose(shown[visible], np.log10(np.maximum(w[2], 1e-3))[visible])
    assert "log10" in [ax for ax in fig.axes if ax.get_ylabel().startswith("log10")][0].get_ylabel()
    # heads 3 and 4 are on the bottom row, and head 2 (no head below it) carries the x labels too
    assert [ax.get_xlabel() for ax in panels] == ["", "", "key", "key", "key"]


def test_head_grid_errors():
    with pytest.raises(ValueError, match=r"weights \[H, S, T\]"):
        viz.head_grid(np.ones((3, 3)))
    with pytest.raises(ValueError, match="2 head names for 3 heads"):
        viz.head_grid(np.ones((3, 2, 2)) / 2, head_names=["a", "b"])
    with pytest.raises(ValueError, match="ncols must be a positive integer"):
        viz.head_grid(np.ones((3, 2, 2)) / 2, ncols=0)


def test_first_token_lines_draws_every_head_and_the_mean():
    mass = np.array([[0.1, 0.3], [0.8, 0.6], [0.5, 0.5]])
    fig, ax = plt.subplots()
    mean = viz.first_token_lines(ax, mass, "sink")
    np.testing.assert_allclose(mean, [0.2, 0.7, 0.5])
    assert len(ax.collections) == 2  # one scatter per head
    np.testing.assert_allclose(ax.lines[0].get_ydata(), mean)
    assert ax.get_title() == "sink" and ax.get_xlabel() == "layer"
    with pytest.raises(ValueError, match=r"\[layers, heads\]"):
        viz.first_token_lines(ax, np.ones(3))


# ------------------------------------------------------------------ first_token_mass

def test_first_token_mass_is_the_mean_weight_on_key_0(gqa_trace):
    mass = widgets.first_token_mass(gqa_trace)
    assert mass.shape == (GQA.n_layers, GQA.n_heads)
    for layer in range(GQA.n_layers):
        w = gqa_trace.attention_weights[(layer, 0)]  # [6, 7, 7]
        expected = [np.mean([w[h, i, 0] for i in range(1, 7)]) for h in range(6)]
        np.testing.assert_allclose(mass[layer], expected)
    assert np.all((mass > 0) & (mass < 1))


def test_first_token_mass_from_position_0_counts_the_query_that_sees_only_itself(gqa_trace):
    from_1 = widgets.first_token_mass(gqa_trace, from_position=1)
    from_0 = widgets.first_token_mass(gqa_trace, from_position=0)
    np.testing.assert_allclose(from_0, (1.0 + 6 * from_1) / 7)  # query 0 puts weight 1 on key 0


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, GQA.vocab_size - 1), min_size=2, max_size=6), st.integers(0, 4))
def test_first_token_mass_of_a_decode_step(gqa, prompt, new):
    cache = gqa.new_cache()
    td.forward(gqa, prompt, cache)
    trace = td.Trace()
    td.forward(gqa, [new], cache, trace=trace)  # one query at position len(prompt)
    mass = widgets.first_token_mass(trace)
    expected = np.array([trace.attention_weights[(l, 0)][:, 0, 0] for l in range(GQA.n_layers)])
    np.testing.assert_allclose(mass, expected)


def test_first_token_mass_errors(gqa):
    with pytest.raises(ValueError, match="no attention weights"):
        widgets.first_token_mass(td.Trace())
    trace = td.Trace()
    td.forward(gqa, [3], trace=trace)
    with pytest.raises(ValueError, match="no query at a position >= 1"):
        widgets.first_token_mass(trace)


# ------------------------------------------------------------------ attention_view and the widget

def test_attention_view_all_heads_and_one(gqa_trace):
    every = widgets.attention_view(gqa_trace, GQA, 2)
    assert every["heads"] == list(range(6)) and every["kv_heads"] == [0, 0, 0, 1, 1, 1]
    np.testing.assert_array_equal(every["weights"], gqa_trace.attention_weights[(2, 0)])
    assert every["shown"] is every["weights"] and not every["log_scale"]
    one = widgets.attention_view(gqa_trace, GQA, 2, head=4, log_scale=True)
    assert one["heads"] == [4] and one["kv_heads"] == [1]
    np.testing.assert_array_equal(one["weights"][0], every["weights"][4])
    np.testing.assert_array_equal(one["shown"], viz.log_attention(one["weights"]))
    assert one["first_token_mass"][0] == pytest.approx(widgets.first_token_mass(gqa_trace)[2, 4])


def test_attention_view_errors(gqa_trace):
    with pytest.raises(ValueError, match=r"layer 3 is not in the trace: traced layers are \[0, 1, 2\]"):
        widgets.attention_view(gqa_trace, GQA, 3)
    with pytest.raises(ValueError, match=r"head must be 'all' or a query head in 0..5"):
        widgets.attention_view(gqa_trace, GQA, 0, head=6)
    with pytest.raises(ValueError, match="the trace has 6 heads but the config 2"):
        widgets.attention_view(gqa_trace, td.toy_config(), 0)


def test_attention_view_figure_draws_a_grid_or_one_head(gqa_trace):
    labels = [str(i) for i in range(7)]
    grid = widgets.attention_view_figure(widgets.attention_view(gqa_trace, GQA, 1), labels, GQA.group_size)
    assert len([ax for ax in grid.axes if ax.images]) == 6
    assert "mean weight on position 0" in grid._suptitle.get_text()
    single = widgets.attention_view_figure(widgets.attention_view(gqa_trace, GQA, 1, 5, True), labels)
    (ax,) = [ax for ax in single.axes if ax.images]
    assert "head 5 → KV 1" in ax.get_title() and "log scale" in ax.get_title()
    assert ax.images[0].get_clim() == (-4.0, 0.0)


def test_attention_explorer_widget_controls_drive_the_view(gqa_trace):
    box = widgets.attention_explorer_widget(gqa_trace, GQA, [str(i) for i in range(7)])
    assert set(box.controls) == {"layer", "head", "log_scale"}
    layer, head, log = box.controls["layer"], box.controls["head"], box.controls["log_scale"]
    assert isinstance(layer, W.IntSlider) and (layer.min, layer.max) == (0, 2)
    assert isinstance(head, W.Dropdown) and len(head.options) == 7 and head.options[0] == ("all heads", "all")
    assert isinstance(log, W.Checkbox)
    assert all(w.description for w in box.controls.values())
    assert box.data["layer"] == 0 and box.data["heads"] == list(range(6))
    layer.value = 2
    np.testing.assert_array_equal(box.data["weights"], gqa_trace.attention_weights[(2, 0)])
    head.value = 3
    assert box.data["heads"] == [3] and box.data["kv_heads"] == [1]
    log.value = True
    np.testing.assert_array_equal(box.data["shown"], viz.log_attention(gqa_trace.attention_weights[(2, 0)][[3]]))


def test_attention_explorer_needs_a_traced_forward():
    with pytest.raises(ValueError, match="no attention weights"):
        widgets.attention_explorer_widget(td.Trace(), GQA)


# ------------------------------------------------------------------ the real model

@pytest.mark.smollm2
def test_smollm2_heads_pour_attention_onto_the_first_token():
    """Notebook 07's claim: past the first few layers, most attention goes to position 0."""
    from tinydecoder.checkpoint.smollm2 import load_smollm2, smollm2_tokenizer

    model, tok = load_smollm2(), smollm2_tokenizer()
    trace = td.Trace()
    td.forward(model, tok.encode("The capital of France is Paris. The capital of Italy is"), trace=trace)
    mass = widgets.first_token_mass(trace)  # [30, 9]
    assert mass.shape == (30, 9)
    assert mass[:2].mean() < 0.3  # the first layers still look around
    assert mass[3:].mean() > 0.5  # then position 0 soaks up most of the weight
    view = widgets.attention_view(trace, model.config, 20)
    assert view["kv_heads"] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
