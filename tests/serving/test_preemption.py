"""Preemption and cancellation in the continuous-batching engine (serving/engine.py)."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.serving.backends import PagedKV
from tinydecoder.serving.engine import Engine
from tinydecoder.serving.scheduler import Request, run_one_at_a_time, run_schedule

TOY = td.toy_model()


def workload():
    rng = np.random.default_rng(3)
    return [Request(rng.integers(0, 6, size=n), m, a) for n, m, a in [(9, 12, 0), (5, 14, 0), (7, 10, 1), (6, 12, 2)]]


def test_a_full_pool_preempts_the_newest_and_greedy_tokens_stay_as_alone():
    reqs = workload()
    alone = run_one_at_a_time(TOY, reqs)
    backend = PagedKV(TOY, n_blocks=10, block_size=4, admission="on_demand")
    sched = run_schedule(TOY, reqs, token_budget=8, backend=backend)
    preempted = [i for s in sched.steps for i in s.preempted]
    assert preempted, "the pool of 10 blocks must run out for this workload"
    assert sched.summary()["preemptions"] == len(preempted) == sum(r.preemptions for r in sched.results)
    for i, r in enumerate(sched.results):
        assert r.tokens == alone.results[i].tokens, f"request {i}"
        assert r.tokens == td.generate(TOY, list(reqs[i].prompt), reqs[i].max_new_tokens).new_tokens
    # the victim is always the newest admitted request among those running at that step
    first = next(s for s in sched.steps if s.preempted)
    assert first.preempted[0] == max(w.request for s in sched.steps[:first.index] for w in s.entries)
    assert backend.pool.blocks_used == 0 and backend.pool.blocks_free == 10


def test_reserve_admission_never_preempts():
    backend = PagedKV(TOY, n_blocks=10, block_size=4)
    sched = run_schedule(TOY, workload(), token_budget=8, backend=backend)
    assert sched.summary()["preemptions"] == 0


def test_a_resumed_request_prefills_its_prompt_and_generated_tokens():
    backend = PagedKV(TOY, n_blocks=10, block_size=4, admission="on_demand")
    sched = run_schedule(TOY, workload(), token_budget=8, backend=backend)
    r = next(r for r in sched.results if r.preemptions)
    prefilled = sum(n for _, n in r.prefill_chunks)
    assert prefilled > len(r.request.prompt) - r.cached_tokens  # it prefilled again after the preemption


def test_cancel_frees_the_blocks_between_steps():
    backend = PagedKV(TOY, n_blocks=16, block_size=4, admission="on_demand")
    engine = Engine(TOY, backend=backend, token_budget=8)
    a, b = engine.add(Request([0, 1, 2, 3, 4], 20)), engine.add(Request([5, 4, 3], 20))
    for _ in range(3):
        engine.step()
    assert backend.pool.blocks_used > 0
    assert engine.cancel(a) and engine.results[a].cancelled and not engine.cancel(a)
    while engine.busy:
        engine.step()
    assert len(engine.results[b].tokens) == 20 and backend.pool.blocks_used == 0


def test_per_request_sampler_processors_and_stop_tokens():
    engine = Engine(TOY, backend=PagedKV(TOY, 16, 4, admission="on_demand"), token_budget=8, keep_logits=False)
    from tinydecoder.decoding.processors import LogitBias
    from tinydecoder.decoding.sampling import make_sampler
    i = engine.add(Request([0, 1, 2], 6, sampler=make_sampler(temperature=1.0, seed=7)))
    j = engine.add(Request([0, 1, 2], 6, processors=(LogitBias({t: -np.inf for t in range(5)}),)))
    k = engine.add(Request([0, 1, 2], 6, stop_tokens=(td.generate(TOY, [0, 1, 2], 1).new_tokens[0],)))
    while engine.busy:
        engine.step()
    alone = td.generate(TOY, [0, 1, 2], 6, sampler=make_sampler(temperature=1.0, seed=7)).new_tokens
    assert engine.results[i].tokens == alone and engine.results[i].logits == []
    assert engine.results[j].tokens == [5] * 6
    assert len(engine.results[k].tokens) == 1


def test_a_request_that_can_never_fit_is_refused():
    engine = Engine(TOY, backend=PagedKV(TOY, 2, 4, admission="on_demand"))
    with pytest.raises(ValueError, match="more than the whole pool"):
        engine.add(Request([0, 1, 2, 3, 4, 5], 8))
