"""Notebook 04's RoPE widget: its sliders drive the data it draws."""
import numpy as np
import pytest

from tinydecoder.lessons.rope_lab import rope_score


def test_rope_widget_sliders_drive_the_data():
    import matplotlib.pyplot as plt

    from tinydecoder.widgets import rope_figure, rope_widget

    rng = np.random.default_rng(11)
    q, k = rng.standard_normal(8), rng.standard_normal(8)
    box = rope_widget(q, k, base=100.0, layout="interleaved", max_position=20)
    first = box.data["score"]
    assert (box.data["pos_q"], box.data["pos_k"]) == (5, 2)
    assert first == pytest.approx(rope_score(q, k, 5, 2, 100.0, "interleaved"))
    box.controls["shift"].value = 9  # both move: the vectors turn, the score stays
    assert (box.data["pos_q"], box.data["pos_k"]) == (14, 11)
    assert box.data["score"] == pytest.approx(first, abs=1e-12)
    box.controls["pos_k"].value = 3  # only the key moves: the score changes
    assert abs(box.data["score"] - first) > 1e-3
    fig = rope_figure(box.data)
    assert len(fig.axes) == 5 and "score" in fig.axes[-1].get_title()
    plt.close("all")
