"""lessons.step_cost: pricing a schedule's steps from measured step costs (synthetic costs here;
no speed is asserted)."""
import pytest

import tinydecoder as td
from tinydecoder.lessons.step_cost import measure_step_seconds, schedule_seconds, step_cost_sentence, step_seconds
from tinydecoder.serving.scheduler import demo_requests, run_one_at_a_time, run_schedule

COST = {1: 0.010, 2: 0.012, 4: 0.016, 8: 0.024}


def test_step_seconds_interpolates_and_extends():
    assert step_seconds(1, COST) == pytest.approx(0.010)
    assert step_seconds(3, COST) == pytest.approx(0.014)
    assert step_seconds(12, COST) == pytest.approx(0.024 + 4 * 0.002)
    assert step_seconds(0, COST) == 0.0
    assert step_seconds([1, 8], COST).tolist() == pytest.approx([0.010, 0.024])


def test_schedule_seconds_sums_the_steps():
    model = td.toy_model()
    sched = run_schedule(model, demo_requests(), token_budget=8)
    expected = sum(float(step_seconds(s.batch_tokens, COST)) for s in sched.steps)
    assert schedule_seconds(sched, COST) == pytest.approx(expected)
    flat = {1: 0.01}  # every step the same cost: seconds are steps
    assert schedule_seconds(run_one_at_a_time(model, demo_requests()), flat) == pytest.approx(0.01 * 29)


def test_sentence_says_what_the_numbers_say():
    s = step_cost_sentence(COST)
    assert "8 rows took 2.4x" in s and "less than 8 steps" in s and "3.3x the tokens per second" in s
    assert "at least 2 steps" in step_cost_sentence({1: 1.0, 2: 2.5})


def test_bad_costs():
    with pytest.raises(ValueError, match="step of 1 row"):
        step_seconds(2, {2: 0.1})
    with pytest.raises(ValueError, match="positive"):
        step_seconds(2, {1: 0.1, 2: 0.0})
    with pytest.raises(ValueError, match="batch sizes"):
        measure_step_seconds(td.toy_model(), rows=())


def test_measure_runs_on_a_small_model():
    from tinydecoder.perf.bench import toy_bench_model

    cost = measure_step_seconds(toy_bench_model(), rows=(1, 2), context=8, repeat=1)
    assert sorted(cost) == [1, 2] and all(v > 0 for v in cost.values())
