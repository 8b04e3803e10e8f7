"""tinydecoder.viz: heatmaps draw what they are given, with labels, colour bars and visible masks."""
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.patches import Rectangle

import tinydecoder as td
from tinydecoder import viz


def hatched_cells(ax):
    return sorted((int(round(p.get_y() + 0.5)), int(round(p.get_x() + 0.5)))
                  for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch())


def test_heatmap_has_colorbar_labels_and_title():
    fig, ax = plt.subplots()
    m = np.arange(6.0).reshape(2, 3)
    im = viz.heatmap(ax, m, ["a", "b"], ["x", "y", "z"], "my title")
    assert im.colorbar is not None and len(fig.axes) == 2  # the matrix and its colour bar
    assert ax.get_xlabel() == "key position" and ax.get_ylabel() == "query position"
    assert ax.get_title() == "my title"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["x", "y", "z"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    np.testing.assert_array_equal(im.get_array(), m)


def test_heatmap_without_colorbar():
    fig, ax = plt.subplots()
    im = viz.heatmap(ax, np.ones((2, 2)), colorbar=False)
    assert im.colorbar is None and len(fig.axes) == 1


def test_causal_mask_cells_are_hatched_and_hidden():
    fig, ax = plt.subplots()
    im = viz.heatmap(ax, np.ones((3, 3)), mask="causal")
    assert hatched_cells(ax) == [(0, 1), (0, 2), (1, 2)]
    np.testing.assert_array_equal(np.ma.getmaskarray(im.get_array()), np.triu(np.ones((3, 3), bool), 1))


def test_minus_inf_scores_are_masked_even_without_a_mask():
    fig, ax = plt.subplots()
    scores = np.array([[0.5, -np.inf], [0.1, 0.2]])
    viz.heatmap(ax, scores, annotate=True)
    assert hatched_cells(ax) == [(0, 1)]
    assert [t.get_text() for t in ax.texts] == ["0.50", "−∞", "0.10", "0.20"]


def test_annotation_text_contrasts_with_the_cell():
    fig, ax = plt.subplots()
    viz.heatmap(ax, np.array([[0.0, 1.0]]), annotate=True, vmin=0, vmax=1)  # viridis: dark, yellow
    assert [t.get_color() for t in ax.texts] == ["white", "black"]


def test_symmetric_limits():
    fig, ax = plt.subplots()
    im = viz.heatmap(ax, np.array([[-0.5, 2.0]]), symmetric=True)
    assert im.get_clim() == (-2.0, 2.0)


def test_resolve_mask_forms():
    causal = viz.resolve_mask("causal", (2, 4))  # a chunk of 2 queries at positions 2, 3
    np.testing.assert_array_equal(causal, [[False, False, False, True], [False] * 4])
    np.testing.assert_array_equal(viz.resolve_mask(td.causal_mask(3, 3), (3, 3)), np.triu(np.ones((3, 3), bool), 1))
    assert not viz.resolve_mask(None, (2, 2)).any()
    with pytest.raises(ValueError, match="shape"):
        viz.resolve_mask(np.zeros((2, 2), bool), (3, 3))
    with pytest.raises(ValueError, match="causal"):
        viz.resolve_mask("future", (2, 2))


def test_future_mask_of_a_decode_step_hides_nothing():
    assert not viz.future_mask(1, 7).any()
    assert viz.future_mask(4, 4).sum() == 6


def test_heatmap_rejects_3d():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="2-D"):
        viz.heatmap(ax, np.zeros((2, 2, 2)))


def test_head_heatmaps_one_panel_per_head_shared_colorbar():
    model = td.toy_model()
    trace = td.Trace()
    td.forward(model, td.SEED_PROMPT, trace=trace)
    w = trace.attention_weights[(0, 0)]  # [2, 4, 4]
    labels = viz.token_labels(td.SEED_PROMPT)
    fig = viz.head_heatmaps(w, labels, labels, title="layer 0")
    assert len(fig.axes) == 3  # two heads + one colour bar
    panels = [ax for ax in fig.axes if ax.get_title().startswith("head")]
    assert [ax.get_title() for ax in panels] == ["head 0", "head 1"]
    for h, ax in enumerate(panels):
        np.testing.assert_allclose(ax.images[0].get_array().filled(np.nan)[np.tril_indices(4)],
                                   w[h][np.tril_indices(4)])
        assert hatched_cells(ax) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
        assert ax.get_xlabel() == "key position"
    assert panels[0].images[0].get_clim() == panels[1].images[0].get_clim()
    assert fig.get_suptitle() == "layer 0"


def test_head_heatmaps_checks_its_input():
    with pytest.raises(ValueError, match=r"\[H, S, T\]"):
        viz.head_heatmaps(np.zeros((4, 4)))
    with pytest.raises(ValueError, match="head names"):
        viz.head_heatmaps(np.zeros((2, 3, 3)), head_names=["only one"])


def test_attention_steps_weights_are_softmax_of_masked_scores():
    scores = np.array([[1.0, 5.0, 2.0], [0.0, 1.0, 3.0], [2.0, 2.0, 2.0]])
    fig = viz.attention_steps(scores)
    weights_ax = [ax for ax in fig.axes if ax.get_title().startswith("weights")][0]
    w = weights_ax.images[0].get_array()
    np.testing.assert_allclose(w.filled(0.0).sum(axis=1), 1.0)
    assert w[0, 0] == 1.0  # the first query sees only itself, whatever the other scores
    np.testing.assert_allclose(w[2], [1 / 3] * 3)
    mask_ax = [ax for ax in fig.axes if ax.get_title().startswith("causal mask")][0]
    assert hatched_cells(mask_ax) == [(0, 1), (0, 2), (1, 2)]


def test_token_labels():
    assert viz.token_labels([5, 3]) == ["0:5", "1:3"]
    assert viz.token_labels([5, 3], ["a", "b", "c", "d", "e", "f"], start=4) == ["4:f", "5:d"]
    assert viz.token_labels([1], lambda t: f"<{t}>") == ["0:<1>"]


def test_fmt_shape_and_table():
    assert viz.fmt_shape((4, 8)) == "[4,8]" and viz.fmt_shape(np.zeros((2, 1, 3)).shape) == "[2,1,3]"
    t = viz.Table(["op", "output"], [["embed", "[4,8]"], ["lm_head", "[4,6]"]], caption="shapes")
    assert str(t).splitlines() == ["shapes", "op       output", "-------  ------", "embed    [4,8]", "lm_head  [4,6]"]
    html = t._repr_html_()
    assert "<caption>shapes</caption>" in html and "<td><code>[4,6]</code></td>" in html
    assert t.column("output") == ["[4,8]", "[4,6]"]
    with pytest.raises(ValueError, match="columns"):
        viz.Table(["a", "b"], [["only one"]])


def test_shape_table_of_the_toy_forward_matches_the_seed():
    trace = td.Trace()
    td.forward(td.toy_model(), td.SEED_PROMPT, trace=trace)
    t = viz.shape_table(trace, layer=0)
    ops, inputs, outputs = t.column("op"), t.column("inputs"), t.column("output")
    assert ops[0] == "embed" and ops[-2:] == ["final_norm", "lm_head"]
    row = dict(zip(ops, zip(inputs, outputs)))
    assert row["embed"][1] == "[4,8]"
    assert row["q_proj"] == ("[4,8] × [8,8]", "[4,8]")
    assert row["k_proj"] == ("[4,8] × [8,4]", "[4,4]") and row["v_proj"] == ("[4,8] × [8,4]", "[4,4]")
    assert row["o_proj"] == ("[4,8] × [8,8]", "[4,8]")
    assert row["ffn_gate"] == ("[4,8] × [8,16]", "[4,16]") and row["ffn_down"] == ("[4,16] × [16,8]", "[4,8]")
    assert row["lm_head"] == ("[4,8] × [8,6]", "[4,6]")
    assert set(t.column("layer")) == {"—", "0"}
    assert viz.shape_rows(trace, 1)[2]["layer"] == 1


def test_vector_bars_heights_are_the_values():
    fig, ax = plt.subplots()
    a, b = np.array([1.0, -2.0, 3.0]), np.array([0.5, 0.5, 0.5])
    bars = viz.vector_bars(ax, {"a": a, "b": b, "sum": a + b})
    assert len(bars) == 3
    np.testing.assert_allclose([r.get_height() for r in bars[2]], a + b)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b", "sum"]
    with pytest.raises(ValueError, match="one length"):
        viz.vector_bars(ax, {"a": a, "b": np.ones(2)})


def test_arrows_2d_and_shape_boxes():
    fig, (ax1, ax2) = plt.subplots(1, 2)
    viz.arrows_2d(ax1, {"q": (1, 0), "k": (0, 2)})
    assert [t.get_text() for t in ax1.texts if t.get_text()] == ["q", "k"]
    assert ax1.get_xlim() == (-2.5, 2.5)
    with pytest.raises(ValueError, match="2-D"):
        viz.arrows_2d(ax1, {"q": (1, 0, 0)})
    viz.shape_boxes(ax2, [("x", (4, 8)), ("Wq", (8, 8)), ("q", (4, 8))])
    rects = [p for p in ax2.patches if isinstance(p, Rectangle)]
    assert [(r.get_width(), r.get_height()) for r in rects] == [(2.0, 1.0), (2.0, 2.0), (2.0, 1.0)]
    assert "[8,8]" in [t.get_text() for t in ax2.texts]


def test_mask_legend_explains_the_hatching():
    fig, ax = plt.subplots()
    viz.heatmap(ax, np.ones((2, 2)), mask="causal")
    legend = viz.mask_legend(ax)
    assert [t.get_text() for t in legend.get_texts()] == ["masked (future key)"]
    assert legend.legend_handles[0].get_hatch() == viz.MASK_HATCH


def test_shape_boxes_custom_colors():
    fig, ax = plt.subplots()
    viz.shape_boxes(ax, [("a", (2, 2)), ("b", (1, 3))], colors=["red", "blue"])
    rects = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert [matplotlib.colors.to_hex(r.get_facecolor(), keep_alpha=False) for r in rects] == ["#ff0000", "#0000ff"]


# ================================================================== notebooks 04-06: the GQA head mapping, the KV-cache strip
def _lines(ax):
    return [(tuple(l.get_xdata()), tuple(l.get_ydata())) for l in ax.lines]


@pytest.mark.parametrize("Hq, Hkv", [(9, 3), (4, 4), (8, 1), (6, 2)])
def test_head_mapping_draws_one_line_per_query_head_to_its_kv_head(Hq, Hkv):
    fig, ax = plt.subplots()
    mapping = viz.head_mapping(ax, Hq, Hkv, "t")
    assert mapping.tolist() == [h // (Hq // Hkv) for h in range(Hq)]
    lines = _lines(ax)
    assert len(lines) == Hq
    # each line starts at query box h and ends at the centre of KV box mapping[h]
    kv_centre = {t.get_text(): t.get_position()[0] for t in ax.texts if t.get_text()[:2] == "KV"
                 and t.get_text()[2:].isdigit()}
    q_centre = {t.get_text(): t.get_position()[0] for t in ax.texts if t.get_text()[:1] == "q"
                and t.get_text()[1:].isdigit()}
    assert len(kv_centre) == Hkv and len(q_centre) == Hq
    for h, ((x0, x1), _) in enumerate(lines):
        assert x0 == pytest.approx(q_centre[f"q{h}"])
        assert x1 == pytest.approx(kv_centre[f"KV{mapping[h]}"])
    plt.close(fig)


def test_head_mapping_can_draw_a_wrong_mapping_and_checks_it():
    fig, ax = plt.subplots()
    wrong = viz.head_mapping(ax, 4, 2, kv_head_of=[h % 2 for h in range(4)])
    assert wrong.tolist() == [0, 1, 0, 1]
    colours = [l.get_color() for l in ax.lines]
    assert colours[0] == colours[2] != colours[1] == colours[3]
    with pytest.raises(ValueError, match="does not divide"):
        viz.head_mapping(ax, 9, 2)
    with pytest.raises(ValueError, match=r"KV head in 0\.\.1"):
        viz.head_mapping(ax, 4, 2, kv_head_of=[0, 1, 2, 0])
    plt.close(fig)


def test_cache_strip_colours_old_new_and_future_rows():
    fig, ax = plt.subplots()
    weights = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    labels = viz.cache_strip(ax, [0, 1, 2, 3, 3], 4, 5, weights, capacity=7)
    assert labels == ["0:0", "1:1", "2:2", "3:3", "4:3"]
    cells = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() == pytest.approx(0.6)]
    assert len(cells) == 7
    faces = [p.get_facecolor() for p in cells]
    assert faces[0] == faces[3] != faces[4]  # 4 old rows, 1 new
    assert faces[5][3] == 0 and faces[6][3] == 0  # future rows: empty (transparent) cells
    bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_width() == pytest.approx(0.6)]
    np.testing.assert_allclose([b.get_height() for b in bars], 1.2 * weights)
    assert ax.get_xlim() == (-0.5, 6.5)
    plt.close(fig)


def test_cache_strip_rejects_bad_lengths():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="cache_before < cache_after"):
        viz.cache_strip(ax, [0, 1], 2, 2)
    with pytest.raises(ValueError, match=r"weights must have shape \(2,\)"):
        viz.cache_strip(ax, [0, 1], 0, 2, [1.0])
    plt.close(fig)
