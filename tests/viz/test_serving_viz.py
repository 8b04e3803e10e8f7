"""Plots and widgets of notebooks 18 and 11 (chunked prefill, continuous batching): the pure data
functions return the right numbers for given control values, the figures draw what they claim,
and the widgets' controls drive the data."""
import matplotlib.pyplot as plt
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinydecoder as td
from tinydecoder import viz, widgets
from tinydecoder.serving.chunked import chunk_spans
from tinydecoder.serving.scheduler import (
    ARRIVAL_PATTERNS,
    DECODING,
    PREFILLING,
    STALLED,
    WAITING,
    Request,
    demo_requests,
    run_one_at_a_time,
    run_schedule,
)

TOY = td.toy_model()
PROMPT = [0, 1, 2, 3, 4, 5, 1, 2, 3, 0]


# ------------------------------------------------------------------ chunked prefill

@settings(max_examples=20, deadline=None)
@given(st.integers(1, 12))
def test_chunked_prefill_view(chunk_size):
    view = widgets.chunked_prefill_view(TOY, PROMPT, chunk_size)
    spans = chunk_spans(len(PROMPT), chunk_size)
    assert view["spans"] == spans and view["forward_calls"] == len(spans)
    assert [m.shape for m in view["masks"]] == [(b - a, b) for a, b in spans]
    assert view["max_abs_diff"] <= 1e-12 and view["same_next_token"]
    assert sum(view["score_pairs"]) == view["one_shot_pairs"] == td.work_counts(TOY.config, 0, 10)[1]
    text = widgets.chunked_prefill_text(view)
    assert f"{len(spans)} forward calls" in text and "same next token: True" in text


def test_chunked_prefill_widget_slider_drives_the_data():
    box = widgets.chunked_prefill_widget(TOY, PROMPT)
    slider = box.controls["chunk_size"]
    assert slider.description == "chunk size" and slider.max == len(PROMPT)
    assert box.data["chunk_size"] == 4 and box.data["forward_calls"] == 3
    slider.value = 1
    assert box.data["forward_calls"] == 10 and box.data["spans"][-1] == (9, 10)
    slider.value = 10
    assert box.data["forward_calls"] == 1


def test_chunk_mask_panels_one_panel_per_chunk():
    fig = viz.chunk_mask_panels(7, 3, labels=[f"t{i}" for i in range(7)])
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 3  # chunks (0,3), (3,6), (6,7)
    assert [p.get_title().split("\n")[1] for p in panels] == ["mask [3×3]", "mask [3×6]", "mask [1×7]"]
    # hatched patches = hidden cells: the triangle above the diagonal of each chunk
    hatched = [sum(1 for patch in p.patches if patch.get_hatch()) for p in panels]
    assert hatched == [3, 3, 0]
    assert [t.get_text() for t in panels[1].get_xticklabels()] == [f"t{i}" for i in range(6)]
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes)
    with pytest.raises(ValueError, match="max_panels"):
        viz.chunk_mask_panels(20, 1)


def test_chunk_overview_frames_each_chunk():
    fig, ax = plt.subplots()
    im = viz.chunk_overview(ax, 8, 3, past=2)
    data = im.get_array()
    assert data.shape == (8, 10)  # rows: positions 2..9 (prefilled here); columns: every key
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(i) for i in range(2, 10)]
    frames = [p for p in ax.patches if not p.get_fill()]
    assert len(frames) == 3  # chunks (2,5), (5,8), (8,10)
    assert [f.get_height() for f in frames] == [3, 3, 2] and [f.get_width() for f in frames] == [5, 8, 10]
    assert data[6 - 2, 4] == 0 and data[6 - 2, 5] == 1  # position 6 (chunk from 5): key 4 cached, 5 its own
    assert data.mask[0, 3] and not data.mask[0, 2]  # position 2 sees keys 0..2 only


# ------------------------------------------------------------------ continuous batching

def test_demo_requests():
    for pattern, arrivals in ARRIVAL_PATTERNS.items():
        reqs = demo_requests(pattern)
        assert [r.arrival for r in reqs] == list(arrivals)
        assert [len(r.prompt) for r in reqs] == [10, 4, 24, 6, 14]
        assert all(max(r.prompt) < 6 and r.positions_needed <= TOY.config.max_context for r in reqs)
    assert demo_requests("staggered") == demo_requests("staggered")  # seeded
    with pytest.raises(ValueError, match="pattern must be one of"):
        demo_requests("sometimes")


def test_schedule_view_rows_and_table():
    reqs = demo_requests("staggered")
    view = widgets.schedule_view(TOY, reqs, 8)
    cont, base = run_schedule(TOY, reqs, token_budget=8), run_one_at_a_time(TOY, reqs)
    assert [r["ttft"] for r in view["rows"]] == [r.ttft for r in cont.results]
    assert [r["ttft_one_at_a_time"] for r in view["rows"]] == [r.ttft for r in base.results]
    assert view["summary"]["continuous"]["total_steps"] == cont.total_steps
    table = widgets.schedule_table(view)
    assert table.column("request")[:5] == ["A", "B", "C", "D", "E"]
    assert table.column("TTFT")[-1] == str(cont.total_steps)


def test_schedule_widget_controls_drive_the_data():
    patterns = {name: demo_requests(name) for name in ARRIVAL_PATTERNS}
    box = widgets.schedule_widget(TOY, patterns, budgets=(2, 24), value=8)
    assert {w.description for w in box.controls.values()} == {"token budget", "arrivals", "policy"}
    assert box.data["schedule"].token_budget == 8
    steps_8 = box.data["schedule"].total_steps
    box.controls["token_budget"].value = 24
    assert box.data["schedule"].token_budget == 24 and box.data["schedule"].total_steps < steps_8
    box.controls["pattern"].value = "all at once"
    assert [r.request.arrival for r in box.data["schedule"].results] == [0] * 5
    box.controls["policy"].value = "prefill_first"
    assert box.data["schedule"].steps[0].entries[0].phase == "prefill"


def test_schedule_timeline_draws_the_codes():
    reqs = [Request([0, 1, 2, 3], 3, 0, "a"), Request([1, 2, 3, 4, 5], 2, 1, "b"), Request([2], 2, 1, "c")]
    schedule = run_schedule(TOY, reqs, token_budget=3)
    fig, ax = plt.subplots()
    codes = viz.schedule_timeline(ax, schedule)
    busy = int(np.sum(np.isin(codes, [WAITING, STALLED, PREFILLING, DECODING])))
    assert len([p for p in ax.patches]) == busy
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a (4+3)", "b (5+2)", "c (1+2)"]
    prefill_texts = sorted(int(t.get_text()) for t in ax.texts)
    assert prefill_texts == sorted(w.n_tokens for s in schedule.steps for w in s.entries if w.phase == "prefill")


def test_batch_token_bars_and_figure():
    schedule = run_schedule(TOY, demo_requests("all at once"), token_budget=8)
    fig, ax = plt.subplots()
    totals = viz.batch_token_bars(ax, schedule)
    assert totals.tolist() == [s.batch_tokens for s in schedule.steps] and totals.max() <= 8
    assert any("token budget 8" in t.get_text() for t in ax.get_legend().get_texts())
    fig = viz.schedule_figure(schedule, title="x")
    assert len(fig.axes) == 2 and fig.axes[0].get_title() == "x"


def test_ttft_bars():
    reqs = demo_requests("staggered")
    fig, ax = plt.subplots()
    values = viz.ttft_bars(ax, {"continuous": run_schedule(TOY, reqs, token_budget=8),
                                "one at a time": run_one_at_a_time(TOY, reqs)})
    assert values["continuous"] == [r.ttft for r in run_schedule(TOY, reqs, token_budget=8).results]
    assert len(ax.containers) == 2 and ax.get_ylabel() == "ttft (engine steps)"


def test_first_token_star_sits_in_the_cell_of_its_step_under_that_steps_tick():
    """The ★ is drawn inside the cell of first_token_step, and the tick labelled with that
    step's number is in the same cell (notebook 20 asks learners to read the step off it)."""
    schedule = run_schedule(TOY, demo_requests("staggered"), token_budget=8)
    fig, ax = plt.subplots()
    viz.schedule_timeline(ax, schedule)
    stars = [line for line in ax.lines if line.get_marker() == "*"]
    arrivals = [line for line in ax.lines if line.get_marker() == "v"]
    assert len(stars) == len(arrivals) == len(schedule.results)
    ticks = {t.get_text(): x for t, x in zip(ax.get_xticklabels(), ax.get_xticks())}
    for star, arrival, r in zip(stars, arrivals, schedule.results):
        step = r.first_token_step
        x = float(star.get_xdata()[0])
        assert step < x < step + 1  # inside the cell [step, step + 1)
        assert step < ticks[str(step)] < step + 1  # and under the tick that names the step
        assert r.request.arrival < float(arrival.get_xdata()[0]) < r.request.arrival + 1
    assert schedule.results[2].first_token_step == 5  # C: notebook 20's exercise 3
    plt.close(fig)
