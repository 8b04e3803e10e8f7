"""The continuous-batching scheduler: each request gets exactly what generate() gives it alone,
whatever the token budget, chunk size, policy and arrival pattern; the batch respects the budget,
one forward_batch call per step, FCFS admission, memory limits, and the step log adds up."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinydecoder as td
from tinydecoder.serving import engine as eng
from tinydecoder.serving import scheduler as sch
from tinydecoder.serving.scheduler import (
    DECODING,
    DONE,
    NOT_ARRIVED,
    PREFILLING,
    STALLED,
    WAITING,
    ContiguousKV,
    Request,
    run_one_at_a_time,
    run_schedule,
    timeline_codes,
)

TOY = td.toy_model()  # float64

requests_strategy = st.lists(
    st.builds(Request, st.lists(st.integers(0, 5), min_size=1, max_size=14), st.integers(1, 7),
              st.integers(0, 8)),
    min_size=1, max_size=5)


def alone(model, request, stop_tokens=()):
    return td.generate(model, list(request.prompt), request.max_new_tokens, stop_tokens=stop_tokens)


def assert_matches_alone(model, schedule, tol, stop_tokens=()):
    for result in schedule.results:
        ref = alone(model, result.request, stop_tokens)
        assert result.tokens == ref.new_tokens
        assert len(result.logits) == len(ref.events)
        for got, event in zip(result.logits, ref.events):
            assert np.max(np.abs(got - event.logits)) <= tol


def assert_log_consistent(schedule):
    budget = schedule.token_budget
    codes = timeline_codes(schedule)
    for step in schedule.steps:
        if budget is not None:
            assert step.batch_tokens <= budget
        assert len({w.request for w in step.entries}) == len(step.entries)  # one entry per request
    for i, r in enumerate(schedule.results):
        prefill = sum(w.n_tokens for s in schedule.steps for w in s.entries if w.request == i and w.phase == "prefill")
        decodes = sum(1 for s in schedule.steps for w in s.entries if w.request == i and w.phase == "decode")
        assert prefill + r.cached_tokens == len(r.request.prompt)
        assert decodes == len(r.tokens) - 1  # the last chosen token is never fed back
        assert r.request.arrival <= r.admitted <= r.first_token_step <= r.finish_step
        assert np.sum((codes[i] == PREFILLING) | (codes[i] == DECODING)) == len(r.prefill_chunks) + decodes
        assert np.all(codes[i, :r.request.arrival] == NOT_ARRIVED)
        assert np.all(codes[i, r.request.arrival:r.admitted] == WAITING)
        assert np.all(codes[i, r.finish_step + 1:] == DONE)
        # positions are contiguous: each entry starts where the last one ended
        pos = r.cached_tokens
        for s in schedule.steps:
            for w in s.entries:
                if w.request == i:
                    assert w.start == pos
                    pos += w.n_tokens


@settings(max_examples=80, deadline=None)
@given(requests_strategy, st.one_of(st.none(), st.integers(1, 20)), st.one_of(st.none(), st.integers(1, 6)),
       st.sampled_from(sch.POLICIES))
def test_every_request_gets_what_it_gets_alone(requests, budget, chunk_size, policy):
    schedule = run_schedule(TOY, requests, token_budget=budget, chunk_size=chunk_size, policy=policy)
    assert_matches_alone(TOY, schedule, 1e-9)
    assert_log_consistent(schedule)
    # decode first: a running request never misses a decode step
    if policy == "decode_first":
        assert all(r.tpot in (None, 1.0) for r in schedule.results)


@settings(max_examples=40, deadline=None)
@given(requests_strategy, st.integers(1, 12), st.integers(14, 60))
def test_memory_limit_is_respected_and_results_unchanged(requests, budget, capacity):
    backend = ContiguousKV(TOY, capacity_tokens=capacity)
    need = {id(r): r.positions_needed for r in requests}
    if max(need.values()) > capacity:
        with pytest.raises(ValueError, match="more than the whole pool"):
            run_schedule(TOY, requests, token_budget=budget, backend=backend)
        return
    schedule = run_schedule(TOY, requests, token_budget=budget, backend=backend)
    assert_matches_alone(TOY, schedule, 1e-9)
    assert all(0 <= s.free_blocks <= capacity for s in schedule.steps)
    assert schedule.steps[-1].free_blocks == capacity  # everything released at the end
    for step in schedule.steps:  # what is reserved during a step fits the pool
        live = [r for r in schedule.results if r.admitted <= step.index <= r.finish_step]
        assert sum(r.request.positions_needed for r in live) <= capacity


@settings(max_examples=40, deadline=None)
@given(requests_strategy, st.integers(1, 20))
def test_fcfs_admission(requests, budget):
    schedule = run_schedule(TOY, requests, token_budget=budget)
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i))
    admitted = [schedule.results[i].admitted for i in order]
    assert admitted == sorted(admitted)


def test_float32_rope_gqa_model():
    cfg = td.Config(vocab_size=40, d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, n_layers=2, d_ff=48,
                    max_context=64, position="rope", norm_scale=True)
    model = td.random_model(cfg, seed=1, dtype=np.float32)
    rng = np.random.default_rng(0)
    requests = [Request(rng.integers(0, 40, size=n), m, a) for n, m, a in [(9, 5, 0), (17, 3, 1), (4, 6, 1), (12, 4, 5)]]
    for budget in (3, 8, None):
        schedule = run_schedule(model, requests, token_budget=budget)
        assert_matches_alone(model, schedule, 1e-4)
        assert all(np.asarray(l).dtype == np.float32 for r in schedule.results for l in r.logits)


def test_one_forward_batch_call_per_busy_step(monkeypatch):
    calls = []
    real = eng.forward_batch

    def counting(model, batch, caches, **kw):
        calls.append([len(b) for b in batch])
        return real(model, batch, caches, **kw)

    monkeypatch.setattr(eng, "forward_batch", counting)
    requests = [Request([0, 1, 2, 3], 4, 0), Request([5, 4, 3, 2, 1], 3, 1), Request([1], 2, 6)]
    schedule = run_schedule(TOY, requests, token_budget=4)
    busy = [s for s in schedule.steps if not s.idle]
    assert len(calls) == len(busy) == schedule.forward_calls
    assert calls == [[w.n_tokens for w in s.entries] for s in busy]


def test_a_small_schedule_by_hand():
    """Budget 4: r0 (4 prompt tokens) prefills in step 0; r1 arrives at step 1 with 5 prompt tokens
    and gets 3 of them next to r0's decode, then the last 2 in step 2."""
    requests = [Request(td.SEED_PROMPT, 4, 0, "a"), Request([5, 4, 3, 2, 1], 3, 1, "b")]
    schedule = run_schedule(TOY, requests, token_budget=4)
    log = [[(w.request, w.phase, w.n_tokens) for w in s.entries] for s in schedule.steps]
    assert log == [[(0, "prefill", 4)],
                   [(0, "decode", 1), (1, "prefill", 3)],
                   [(0, "decode", 1), (1, "prefill", 2)],
                   [(0, "decode", 1), (1, "decode", 1)],
                   [(1, "decode", 1)]]
    a, b = schedule.results
    assert a.tokens == td.SEED_CONTINUATION
    assert (a.ttft, a.tpot, b.ttft, b.tpot) == (1, 1.0, 2, 1.0)
    assert b.prefill_chunks == [(1, 3), (2, 2)]
    assert schedule.total_steps == 5 and [s.batch_tokens for s in schedule.steps] == [4, 4, 3, 2, 1]
    assert timeline_codes(schedule).tolist() == [[PREFILLING, DECODING, DECODING, DECODING, DONE],
                                                 [NOT_ARRIVED, PREFILLING, PREFILLING, DECODING, DECODING]]


def test_prefill_first_makes_decodes_wait():
    requests = [Request([0, 1], 4, 0), Request([1, 2, 3, 4, 5, 0, 1, 2], 2, 1)]
    first = run_schedule(TOY, requests, token_budget=2, max_running=2, policy="prefill_first")
    codes = timeline_codes(first)
    assert STALLED in codes[0]  # r0 waited for r1's prompt
    assert first.results[0].tpot > 1.0
    decode_first = run_schedule(TOY, requests, token_budget=2, max_running=2)
    assert decode_first.results[0].tpot == 1.0
    assert decode_first.results[1].ttft > first.results[1].ttft  # the trade: TTFT vs TPOT
    assert_matches_alone(TOY, first, 1e-9)


def test_one_at_a_time_baseline():
    requests = [Request([0, 1, 2, 3], 4, 0), Request([5, 4, 3, 2, 1, 0, 1], 3, 1), Request([1, 1], 5, 1)]
    base = run_one_at_a_time(TOY, requests)
    assert_matches_alone(TOY, base, 1e-9)
    assert all(s.running <= 1 and len(s.entries) == 1 for s in base.steps)
    assert base.total_steps == sum(r.max_new_tokens for r in requests)  # no idle steps here
    assert [r.ttft for r in base.results] == [1, 4, 7]  # r2 starts at step 7, arrived at 1
    assert all(len(r.prefill_chunks) == 1 for r in base.results)  # whole prompt in one step
    cont = run_schedule(TOY, requests, token_budget=8)
    assert cont.total_steps < base.total_steps
    assert cont.summary()["mean_ttft"] < base.summary()["mean_ttft"]


def test_idle_steps_until_arrival():
    schedule = run_schedule(TOY, [Request([0, 1], 2, 3)], token_budget=4)
    assert [s.idle for s in schedule.steps] == [True, True, True, False, False]
    assert schedule.forward_calls == 2 and schedule.results[0].ttft == 1


def test_stop_tokens_finish_early_and_free_memory():
    requests = [Request(td.SEED_PROMPT, 4, 0), Request([3, 3, 1], 5, 0)]
    backend = ContiguousKV(TOY, capacity_tokens=20)
    schedule = run_schedule(TOY, requests, token_budget=8, stop_tokens=(2,), backend=backend)
    assert schedule.results[0].tokens == [3, 2]
    assert_matches_alone(TOY, schedule, 1e-9, stop_tokens=(2,))
    assert schedule.steps[-1].free_blocks == 20


def test_metrics_rows():
    requests = [Request([0, 1, 2], 3, 0, "first"), Request([4, 4], 1, 2)]
    schedule = run_schedule(TOY, requests, token_budget=4)
    rows = schedule.metrics()
    assert [r["request"] for r in rows] == ["first", "r1"]
    assert rows[1]["tpot"] is None and rows[1]["new"] == 1 and rows[1]["ttft"] == 1
    assert schedule.summary()["prefilled_tokens"] == 5


def test_wall_times_are_optional():
    schedule = run_schedule(TOY, [Request([0, 1], 2, 0)], record_wall=True)
    assert all(s.wall_s >= 0 for s in schedule.steps)
    assert all(s.wall_s is None for s in run_schedule(TOY, [Request([0, 1], 2, 0)]).steps)


@pytest.mark.parametrize("kwargs, match", [
    ({"token_budget": 0}, "token_budget must be an integer >= 1"),
    ({"token_budget": 2, "max_running": 3}, "max_running"),
    ({"policy": "random"}, "policy must be one of"),
    ({"chunk_size": -1}, "chunk_size"),
])
def test_bad_settings_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_schedule(TOY, [Request([0, 1], 2)], **kwargs)


def test_bad_requests_are_clear_errors():
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        Request([0, 1], 0)
    with pytest.raises(ValueError, match="arrival must be an integer >= 0"):
        Request([0, 1], 2, -1)
    with pytest.raises(ValueError, match="empty prompt"):
        Request([], 2)
    with pytest.raises(TypeError, match="token ids must be integers"):
        Request([0.5, 1.7], 2)
    with pytest.raises(ValueError, match="out of range"):
        run_schedule(TOY, [Request([0, 7], 2)])
    with pytest.raises(ValueError, match="context limit"):
        run_schedule(TOY, [Request([0] * 60, 10)])
    with pytest.raises(ValueError, match="no requests"):
        run_schedule(TOY, [])


# ------------------------------------------------------------------ on the paged KV cache
from tinydecoder.serving.backends import PagedKV  # noqa: E402

SYSTEM = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 1, 3]  # a shared "system prompt" of 14 tokens

shared_prefix_requests = st.lists(
    st.builds(lambda tail, new, arrival, share: Request((SYSTEM if share else []) + tail, new, arrival),
              st.lists(st.integers(0, 5), min_size=1, max_size=8), st.integers(1, 6), st.integers(0, 10),
              st.booleans()),
    min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(shared_prefix_requests, st.sampled_from([1, 3, 4, 16]), st.one_of(st.none(), st.integers(1, 16)),
       st.integers(8, 48), st.booleans())
def test_paged_backend_gives_the_same_results(requests, block_size, budget, n_tokens_pool, prefixes):
    n_blocks = max(1, -(-n_tokens_pool // block_size))
    backend = PagedKV(TOY, n_blocks=n_blocks, block_size=block_size, cache_prefixes=prefixes)
    if any(-(-r.positions_needed // block_size) > n_blocks for r in requests):
        with pytest.raises(ValueError, match="more than the whole pool"):
            run_schedule(TOY, requests, token_budget=budget, backend=backend)
        return
    schedule = run_schedule(TOY, requests, token_budget=budget, backend=backend)
    assert_matches_alone(TOY, schedule, 1e-9)
    assert_log_consistent(schedule)
    assert backend.pool.blocks_used == 0 and backend.pool.blocks_free == n_blocks  # all reclaimed
    assert all(0 <= s.free_blocks <= n_blocks for s in schedule.steps)
    for r in schedule.results:
        assert r.cached_tokens % block_size == 0 and r.cached_tokens < len(r.request.prompt)
        if not prefixes:
            assert r.cached_tokens == 0
    assert schedule.prefilled_tokens == sum(len(r.prompt) for r in requests) - sum(r.cached_tokens for r in schedule.results)


def test_prefix_reuse_saves_prefill_tokens():
    """Three chats share a 14-token system prompt; the first fills the cache, the later two
    (arriving after it finished its prefill) reuse the system prompt's full blocks."""
    requests = [Request(SYSTEM + [2, 2], 3, 0), Request(SYSTEM + [5], 3, 4), Request(SYSTEM + [1, 0, 4], 2, 5)]
    results = {}
    for block_size in (1, 4, 16):
        backend = PagedKV(TOY, n_blocks=64, block_size=block_size)
        schedule = run_schedule(TOY, requests, token_budget=8, backend=backend)
        assert_matches_alone(TOY, schedule, 1e-9)
        results[block_size] = [r.cached_tokens for r in schedule.results]
        assert backend.pool.stats().prefix_hit_tokens == sum(results[block_size])
    assert results[1] == [0, 14, 14]  # whole system prompt
    assert results[4] == [0, 12, 12]  # rounded down to whole blocks of 4
    assert results[16] == [0, 0, 0]  # not one full block of 16 in common
    without = run_schedule(TOY, requests, token_budget=8,
                           backend=PagedKV(TOY, n_blocks=64, block_size=4, cache_prefixes=False))
    with_reuse = run_schedule(TOY, requests, token_budget=8, backend=PagedKV(TOY, n_blocks=64, block_size=4))
    assert without.prefilled_tokens - with_reuse.prefilled_tokens == 24
    assert [r.tokens for r in without.results] == [r.tokens for r in with_reuse.results]


def test_small_pool_delays_admission_but_not_results():
    requests = [Request([0, 1, 2, 3, 4, 5, 0, 1], 8, 0), Request([5, 4, 3, 2, 1], 8, 0), Request([1, 2, 3], 6, 0)]
    roomy = run_schedule(TOY, requests, token_budget=16, backend=PagedKV(TOY, n_blocks=64, block_size=4))
    tight = run_schedule(TOY, requests, token_budget=16, backend=PagedKV(TOY, n_blocks=5, block_size=4))
    assert [r.admitted for r in roomy.results] == [0, 0, 0]
    assert tight.results[1].admitted > 0  # waited for request 0's blocks to come back
    assert [r.tokens for r in tight.results] == [r.tokens for r in roomy.results]
    assert_matches_alone(TOY, tight, 1e-9)
    assert min(s.free_blocks for s in tight.steps) >= 0


def test_scheduler_rejects_a_backend_that_lies_about_its_cache():
    class Liar(ContiguousKV):
        def admit(self, request, tokens=None):
            cache, _ = super().admit(request, tokens)
            return cache, 2  # claims two cached tokens but holds none

    with pytest.raises(RuntimeError, match="must hold 0 <= cached"):
        run_schedule(TOY, [Request([0, 1, 2, 3], 2)], backend=Liar(TOY))
