"""The machine model of notebook 23: colocated, chunked and disaggregated serving simulated from a
few costs. Hand-computed cases pin the arithmetic; the sweep's crossover is checked against the
simulated numbers it comes from."""
import numpy as np
import pytest

from tinydecoder.lessons.disagg_model import MODES, Load, Machine, crossover, simulate, sweep, workload

UNIT = dict(step_base_s=1.0, decode_row_s=0.0, prefill_token_s=0.5, kv_bytes_per_token=10,
            link_bytes_per_s=100.0, link_latency_s=0.25, devices=2, prefill_devices=1, token_budget=4)


def test_costs_of_a_step_and_a_transfer():
    m = Machine(**UNIT)
    assert m.step_s(3, 4, 2) == pytest.approx((1.0 + 0 + 2.0) / 2)
    assert m.transfer_s(5) == pytest.approx(0.25 + 50 / 100)


def test_two_requests_by_hand():
    """A decodes 4 tokens; B (prompt 4) arrives while A decodes and stalls it (colocated) or not."""
    m = Machine(**UNIT)
    load = Load(arrivals=(0.0, 0.6), prompt_tokens=(2, 4), new_tokens=(4, 2))
    co = simulate(m, load, "colocated")
    # step 1: A's prompt (2 tokens): (1 + 1) / 2 = 1.0 -> A's first token at 1.0; step 2 (B has
    # arrived): A decodes + B's 4 tokens: (1 + 2) / 2 = 1.5 -> 2.5; then decode steps of 0.5 each
    assert co.token_times[0] == pytest.approx([1.0, 2.5, 3.0, 3.5])
    assert co.token_times[1] == pytest.approx([2.5, 3.0])
    assert co.prefill_steps_with_decodes == 1
    di = simulate(m, load, "disaggregated")
    # prefill side (1 device): A at 0 -> 1 + 1 = 2.0, B from 2.0 -> 2 + 1 + 2 = 5.0; transfers 0.45, 0.65
    assert [t[0] for t in di.token_times] == pytest.approx([2.0, 5.0])
    # decode side (1 device, steps of 1.0): A joins at 2.45 -> 3.45, 4.45, 5.45; B joins at 5.65 -> 6.65
    assert di.token_times[0][1:] == pytest.approx([3.45, 4.45, 5.45])
    assert di.token_times[1][1:] == pytest.approx([6.65])
    # every gap after the first token: colocated, A's second token waited for B's prompt (1.5);
    # disaggregated, the first gap holds the transfer and the wait for the next decode step
    assert list(co.tpot) == pytest.approx([1.5, 0.5, 0.5, 0.5])
    assert list(di.tpot) == pytest.approx([1.45, 1.0, 1.0, 1.65])


def test_chunked_spreads_a_prompt_over_steps_under_the_budget():
    m = Machine(**UNIT)
    load = Load(arrivals=(0.0, 0.6), prompt_tokens=(2, 6), new_tokens=(5, 2))
    ch = simulate(m, load, "chunked")
    # step 1: A's 2 tokens (1.0); then A decodes + 3 of B's tokens per step (budget 4): (1 + 1.5)/2 = 1.25
    assert ch.token_times[0][:3] == pytest.approx([1.0, 2.25, 3.5])
    assert ch.token_times[1][0] == pytest.approx(3.5)  # B's 6 tokens in two chunks of 3
    assert ch.prefill_steps_with_decodes == 2


def test_the_tail_at_scale_and_its_price():
    m = Machine.h100_like()
    load = workload(rate=8.0, prompt_tokens=2048, new_tokens=128, n_requests=150, seed=0)
    r = {mode: simulate(m, load, mode) for mode in MODES}
    assert all(len(t) == 128 for res in r.values() for t in res.token_times)
    di, co = r["disaggregated"], r["colocated"]
    assert di.p(99) / di.p(50) < 1.2 < co.p(99) / co.p(50)  # decode steps stay flat apart
    assert di.p(50) > co.p(50)  # a decode step on 1 device of 2 is slower: the price
    assert di.p(99) < min(co.p(99), r["chunked"].p(99))


def test_sweep_and_crossover():
    m = Machine.h100_like()
    rates = [0.5, 2.0, 8.0]
    got = sweep(m, rates, lambda rate: workload(rate, 2048, 128, n_requests=100, seed=1))
    assert set(got) == set(MODES) and all(len(v) == 3 for v in got.values())
    x = crossover(rates, got["disaggregated"], got["colocated"])
    assert x is not None and 0.5 < x <= 8.0
    assert got["disaggregated"][0] > got["colocated"][0] and got["disaggregated"][-1] < got["colocated"][-1]
    assert crossover([1, 2, 3], [5, 4, 3], [1, 1, 1]) is None
    assert crossover([1, 2, 3], [0, 0, 0], [1, 1, 1]) is None
    assert crossover([1, 2, 3], [3, 2, 0], [2, 2, 2]) == pytest.approx(2.0)
    assert crossover([1, 2], [3, 1], [2, 2]) == pytest.approx(1.5)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="prefill_devices must be an integer in 1..1"):
        Machine(**(UNIT | dict(prefill_devices=2)))
    with pytest.raises(ValueError, match="step_base_s must be > 0"):
        Machine(**(UNIT | dict(step_base_s=0)))
    with pytest.raises(ValueError, match="mode must be one of"):
        simulate(Machine(**UNIT), workload(1.0, 4, 2, 3), "fast")
    with pytest.raises(ValueError, match="rate > 0"):
        workload(0, 4, 2)
    assert np.all(np.diff(workload(2.0, 4, 2, 20).arrivals) >= 0)
