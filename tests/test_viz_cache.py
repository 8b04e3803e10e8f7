"""viz additions for notebooks 05-06: the GQA head mapping and the KV-cache strip."""
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.patches import Rectangle

from tinydecoder import viz


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
