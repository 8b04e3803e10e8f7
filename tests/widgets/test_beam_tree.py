"""The beam tree's data: one node per candidate, each attached to a kept node of the step before,
siblings stacked together, the best beam's path marked; and the drawing and widget run."""
import matplotlib.pyplot as plt
import pytest

import tinydecoder as td
from tinydecoder.widgets.beam import beam_tree_layout, beam_widget, draw_beam_tree


@pytest.fixture(scope="module")
def result():
    return td.beam_search(td.toy_model(), td.SEED_PROMPT, 3, 5, stop_tokens=(4,))


def test_layout_has_a_node_per_candidate(result):
    layout = beam_tree_layout(result)
    nodes = layout["nodes"]
    assert len(nodes) == sum(len(s) for s in result.steps) and layout["n_steps"] == len(result.steps)
    assert [(p, c) for p, c in layout["edges"]] == [(n["parent_node"], i) for i, n in enumerate(nodes)]
    for n in nodes:
        if n["step"] == 0:
            assert n["parent_node"] == -1
        else:
            parent = nodes[n["parent_node"]]
            assert parent["status"] == "kept" and parent["step"] == n["step"] - 1
            assert n["tokens"] == parent["tokens"] + [n["token"]] and n["logprob"] <= parent["logprob"]
    for step in range(layout["n_steps"]):  # y = 0, -1, ... per step, siblings adjacent
        col = [n for n in nodes if n["step"] == step]
        assert sorted(n["y"] for n in col) == [-float(i) for i in range(len(col))][::-1]
        parents_in_order = [n["parent_node"] for n in sorted(col, key=lambda n: -n["y"])]
        assert parents_in_order == sorted(parents_in_order, key=parents_in_order.index)  # grouped


def test_best_path_is_the_best_beam(result):
    nodes = beam_tree_layout(result)["nodes"]
    path = [n for n in nodes if n["best"]]
    assert [n["token"] for n in sorted(path, key=lambda n: n["step"])] == result.best.tokens
    assert path[-1]["logprob"] == pytest.approx(result.best.logprob)
    assert path[-1]["status"] in ("kept", "finished")


def test_drawing_and_widget(result):
    fig = draw_beam_tree(result, text=lambda t: f"<{t}>")
    assert isinstance(fig, plt.Figure) and len(fig.axes[0].texts) == 1 + len(beam_tree_layout(result)["nodes"])
    results = {(b, p): td.beam_search(td.toy_model(), td.SEED_PROMPT, b, 4, processors=[td.RepetitionPenalty(p)])
               for b in (1, 2) for p in (1.0, 2.0)}
    box = beam_widget(results)
    assert box.data is results[(2, 1.0)]
    box.controls["beams"].value = 1
    box.controls["penalty"].value = 2.0
    assert box.data is results[(1, 2.0)]
