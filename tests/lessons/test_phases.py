"""Prefill vs decode and the cached loop, step by step (tinydecoder.lessons.phases)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinydecoder as td
from tinydecoder.lessons import phases


@pytest.fixture(scope="module")
def toy():
    return td.toy_model()


def small_model(seed=0, **overrides):
    base = dict(vocab_size=13, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, n_layers=3, d_ff=24,
                max_context=32, position="rope", rope_base=100.0)
    base.update(overrides)
    return td.random_model(td.Config(**base), seed=seed, dtype=np.float64)


@pytest.mark.parametrize("B, S", [(1, 4), (2, 4), (3, 6)])
def test_phase_shapes_and_flops(B, S):
    model = small_model()
    prompt = list(range(1, S + 1))
    pre, dec, token = phases.prefill_then_decode(model, prompt, batch=B)
    Hq, Hkv, d = 4, 2, 4
    assert phases.phase_shapes(pre) == {"Q": (B, Hq, S, d), "new K/V": (B, Hkv, S, d),
                                        "visible K/V": (B, Hkv, S, d), "scores": (B, Hq, S, S)}
    T = S + 1
    assert phases.phase_shapes(dec, layer=2) == {"Q": (B, Hq, 1, d), "new K/V": (B, Hkv, 1, d),
                                                 "visible K/V": (B, Hkv, T, d), "scores": (B, Hq, 1, T)}
    for layer in range(3):
        assert pre.total_flops(op="attention", layer=layer) == 4 * B * Hq * S ** 2 * d
        assert dec.total_flops(op="attention", layer=layer) == 4 * B * Hq * T * d
    assert phases.attention_flops(B, Hq, S, S, d) == 4 * B * Hq * S * S * d
    rows_pre, rows_dec = phases.rows_per_op(pre), phases.rows_per_op(dec)
    assert set(rows_pre.values()) == {B * S} and set(rows_dec.values()) == {B}
    assert "q_proj" in rows_pre and "attention" in rows_dec
    assert token == td.greedy(td.forward(model, prompt)[-1])


def test_phase_shapes_errors(toy):
    with pytest.raises(ValueError, match="no attention record"):
        phases.phase_shapes(td.Trace())
    trace = td.Trace()
    td.forward_each(toy, [[0, 1], [2]], trace=trace)
    with pytest.raises(ValueError, match="different shapes"):
        phases.phase_shapes(trace)


def test_skipping_queries_only_in_the_last_layer_is_exact(toy):
    full = td.forward(toy, td.SEED_PROMPT)[-1:]
    last = phases.forward_skipping_queries(toy, td.SEED_PROMPT, "last")
    np.testing.assert_allclose(last, full, atol=1e-14)
    np.testing.assert_allclose(last, td.forward(toy, td.SEED_PROMPT, last_only=True), atol=1e-15)
    np.testing.assert_allclose(phases.forward_skipping_queries(toy, td.SEED_PROMPT, "none"), full, atol=1e-15)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=2, max_size=8), st.integers(0, 3))
def test_skipping_queries_in_every_layer_changes_the_logits(prompt, seed):
    model = small_model(seed)
    full = td.forward(model, prompt)[-1:]
    np.testing.assert_allclose(phases.forward_skipping_queries(model, prompt, "last"), full, atol=1e-12)
    wrong = phases.forward_skipping_queries(model, prompt, "all")
    assert np.max(np.abs(wrong - full)) > 1e-6


def test_skipping_queries_one_token_or_one_layer_is_harmless():
    """Nothing to skip with one position; with one layer, 'all' is 'last'."""
    model = small_model(n_layers=1)
    np.testing.assert_allclose(phases.forward_skipping_queries(model, [3, 4, 5], "all"),
                               td.forward(model, [3, 4, 5])[-1:], atol=1e-14)
    model = small_model()
    np.testing.assert_allclose(phases.forward_skipping_queries(model, [3], "all"),
                               td.forward(model, [3]), atol=1e-14)


def test_skipping_queries_saves_query_rows(toy):
    trace = td.Trace()
    phases.forward_skipping_queries(toy, td.SEED_PROMPT, "all", trace=trace)
    assert [r.inputs[0][0] for r in trace.select(op="q_proj")] == [1, 1]
    assert [r.inputs[0][0] for r in trace.select(op="k_proj")] == [4, 4]
    with pytest.raises(ValueError, match="layers must be one of"):
        phases.forward_skipping_queries(toy, [0], "some")


def test_generation_table_seed(toy):
    gen = td.generate(toy, td.SEED_PROMPT, 4)
    table = phases.generation_table(gen)
    assert [(r["round"], r["phase"], r["input"], r["cache_after"], r["chosen"]) for r in table] == [
        (1, "prefill", [0, 1, 2, 3], 4, 3), (2, "decode", [3], 5, 2),
        (3, "decode", [2], 6, 0), (4, "decode", [0], 7, 4)]
    diffs = phases.recompute_differences(toy, gen)
    assert len(diffs) == 4 and max(diffs) < 1e-12


def test_recompute_differences_see_a_wrong_logit(toy):
    gen = td.generate(toy, td.SEED_PROMPT, 3)
    gen.events[1].logits = gen.events[1].logits + np.array([0, 0, 0.5, 0, 0, 0])
    diffs = phases.recompute_differences(toy, gen)
    assert diffs[1] == pytest.approx(0.5) and diffs[0] < 1e-12 and diffs[2] < 1e-12


def test_prefix_difference(toy):
    assert phases.prefix_difference(toy, [0, 1, 2, 3], [5, 5, 1]) < 1e-12
    assert phases.prefix_difference(small_model(), [1, 2], [3]) < 1e-12


def test_cached_steps_follow_generate(toy):
    steps = phases.cached_steps(toy, td.SEED_PROMPT, 4, layer=1)
    gen = td.generate(toy, td.SEED_PROMPT, 4)
    assert [s.next_token for s in steps] == gen.new_tokens
    assert [(s.cache_before, s.cache_after) for s in steps] == [(0, 4), (4, 5), (5, 6), (6, 7)]
    assert [s.weights.shape for s in steps] == [(2, 4, 4), (2, 1, 5), (2, 1, 6), (2, 1, 7)]
    assert steps[2].input_tokens == [2] and steps[2].positions == [5]
    assert steps[3].context == [0, 1, 2, 3, 3, 2, 0]
    for s in steps:
        np.testing.assert_allclose(s.weights.sum(-1), 1.0, atol=1e-12)
    # the decode row equals the last row of a full recompute's weights
    trace = td.Trace()
    td.forward(toy, steps[3].context, trace=trace)
    np.testing.assert_allclose(steps[3].weights[:, 0], trace.attention_weights[(1, 0)][:, -1], atol=1e-13)
    with pytest.raises(ValueError, match="layer 2 is out of range"):
        phases.cached_steps(toy, [0], 1, layer=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        phases.cached_steps(toy, [0], 0)


def test_skipping_queries_everywhere_changes_later_layers_keys(toy):
    """Why 'all' is wrong: layer 1's K for the non-last positions come from stale hidden states."""
    right, wrong = toy.new_cache(), toy.new_cache()
    td.forward(toy, td.SEED_PROMPT, right)
    phases.forward_skipping_queries(toy, td.SEED_PROMPT, "all", cache=wrong)
    np.testing.assert_allclose(wrong.k[0][:4], right.k[0][:4], atol=1e-15)  # layer 0: from the embeddings
    gap = np.abs(wrong.k[1][:4] - right.k[1][:4]).max(axis=(1, 2))  # [S]
    assert np.all(gap[:3] > 1e-3) and gap[3] < 1e-14  # the last row was updated, the others not
    with pytest.raises(ValueError, match="already holds 4 positions"):
        phases.forward_skipping_queries(toy, [0], "all", cache=wrong)
