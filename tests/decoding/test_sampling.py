"""Sampling: the distributions the samplers draw from, the draws themselves, and bad settings."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinydecoder import SEED_CONTINUATION, SEED_PROMPT, generate, greedy, toy_model
from tinydecoder.decoding.sampling import (
    Sampler,
    apply_temperature,
    best_tokens,
    check_logits,
    draw,
    kept_tokens,
    make_sampler,
    probabilities,
    rank_tokens,
    sampling_distribution,
    top_k_filter,
    top_p_filter,
)

LOGITS = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -np.inf, 1.0], dtype=np.float32)  # a tie (1 and 6), one -inf


def softmax_of(values):
    """A softmax written independently of the library: plain Python floats."""
    finite = [v for v in values if v != -math.inf]
    top = max(finite)
    e = [math.exp(v - top) if v != -math.inf else 0.0 for v in values]
    return np.array(e) / sum(e)


def chi_square_critical(df, z=3.719):
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.719: 0.9999)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def assert_draws_match(sampler, logits, probs, n=20000):
    counts = np.bincount([sampler(logits) for _ in range(n)], minlength=len(probs))
    assert counts[probs == 0].sum() == 0, "drew a token of probability 0"
    support = probs > 0
    expected = n * probs[support]
    chi2 = float(np.sum((counts[support] - expected) ** 2 / expected))
    df = int(support.sum()) - 1
    if df > 0:
        assert chi2 < chi_square_critical(df), (chi2, counts, expected)


# --- the intended distributions, computed by hand --------------------------------------------

def test_temperature_distribution_is_softmax_of_scaled_logits():
    for t in (0.5, 1.0, 2.0):
        want = softmax_of([float(v) / t for v in LOGITS])
        np.testing.assert_allclose(sampling_distribution(LOGITS, temperature=t), want, rtol=1e-12, atol=0)


def test_top_k_keeps_the_k_best_with_lower_id_first_on_ties():
    # ranking: 0 (2.0), 1 (1.0), 6 (1.0), 2 (0.5), 3, 4, 5 (-inf)
    assert rank_tokens(LOGITS).tolist() == [0, 1, 6, 2, 3, 4, 5]
    probs = sampling_distribution(LOGITS, top_k=2)
    want = np.zeros(7)
    want[[0, 1]] = softmax_of([2.0, 1.0])
    np.testing.assert_allclose(probs, want, rtol=1e-12, atol=0)
    assert kept_tokens(LOGITS, top_k=3).tolist() == [0, 1, 6]
    assert top_k_filter(LOGITS, 3)[[2, 3, 4]].tolist() == [-np.inf] * 3


def test_top_p_keeps_the_token_that_crosses_p():
    p_full = softmax_of([float(v) for v in LOGITS])  # token 0 holds ~0.42, tokens 1 and 6 ~0.156 each
    first = float(p_full[0])
    assert kept_tokens(LOGITS, top_p=first - 1e-6).tolist() == [0]
    assert kept_tokens(LOGITS, top_p=first + 1e-6).tolist() == [0, 1]
    kept = kept_tokens(LOGITS, top_p=0.9)
    mass = np.cumsum(p_full[rank_tokens(LOGITS)])
    n = int(np.searchsorted(mass, 0.9) + 1)
    assert kept.tolist() == rank_tokens(LOGITS)[:n].tolist()
    want = np.zeros(7)
    want[kept] = p_full[kept] / p_full[kept].sum()
    np.testing.assert_allclose(sampling_distribution(LOGITS, top_p=0.9), want, rtol=1e-12, atol=0)
    # p = 1 keeps everything of nonzero probability, never the -inf token
    assert sorted(kept_tokens(LOGITS, top_p=1.0).tolist()) == [0, 1, 2, 3, 4, 6]


def test_top_p_one_keeps_even_the_tiniest_tokens():
    """The running mass reaches 1.0 in float64 long before tokens of probability ~1e-22; p = 1
    must still keep them (it is "no filter"), exactly like plain sampling at T = 1."""
    logits = np.array([50.0] + [0.0] * 1000, dtype=np.float32)
    assert len(kept_tokens(logits, top_p=1.0)) == 1001
    np.testing.assert_array_equal(sampling_distribution(logits, top_p=1.0), sampling_distribution(logits, temperature=1.0))
    assert len(kept_tokens(logits, top_p=0.999)) == 1


def test_filters_apply_in_order_temperature_top_k_top_p():
    t, k, p = 0.5, 4, 0.8
    scaled = [float(v) / t for v in LOGITS]
    ranked = rank_tokens(LOGITS)[:k]  # 0, 1, 6, 2
    pk = softmax_of([scaled[i] for i in ranked])  # renormalised over the top k
    n = int(np.searchsorted(np.cumsum(pk), p) + 1)
    keep = ranked[:n]
    want = np.zeros(7)
    want[keep] = softmax_of([scaled[i] for i in keep])
    np.testing.assert_allclose(sampling_distribution(LOGITS, t, k, p), want, rtol=1e-12, atol=0)


def test_greedy_settings_are_one_hot_on_the_lowest_best_id():
    tied = np.array([0.0, 3.0, 1.0, 3.0], dtype=np.float32)
    for kwargs in ({}, {"temperature": 0}, {"temperature": 0.0, "top_k": 3}, {"temperature": 0, "top_p": 0.5}):
        probs = sampling_distribution(tied, **kwargs)
        assert probs.tolist() == [0.0, 1.0, 0.0, 0.0], kwargs
        assert make_sampler(**kwargs)(tied) == 1 == greedy(tied)
    assert repr(make_sampler()) == "Sampler(greedy)"
    # temperature None with a filter means T = 1, not greedy
    assert sampling_distribution(tied, top_k=2).tolist() == [0.0, 0.5, 0.0, 0.5]


# --- draws ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"temperature": 1.0}, {"temperature": 0.6}, {"temperature": 2.0}, {"top_k": 3},
    {"top_p": 0.8}, {"temperature": 0.8, "top_k": 4, "top_p": 0.9},
])
def test_empirical_distribution_matches(kwargs):
    sampler = make_sampler(seed=123, **kwargs)
    assert_draws_match(sampler, LOGITS, sampling_distribution(LOGITS, **kwargs))


def test_empirical_distribution_detects_a_wrong_distribution():
    """The chi-square check is strong enough to notice T = 1 draws claimed to be T = 0.8."""
    sampler = make_sampler(temperature=1.0, seed=5)
    with pytest.raises(AssertionError):
        assert_draws_match(sampler, LOGITS, sampling_distribution(LOGITS, temperature=0.8))


def test_draw_never_returns_a_zero_probability_token():
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    rng = np.random.default_rng(0)
    assert set(draw(probs, rng) for _ in range(2000)) == {1, 3}
    assert draw(np.array([0.0, 0.0, 1.0]), rng) == 2


logit_vectors = st.lists(st.integers(-6, 6), min_size=1, max_size=12).map(
    lambda xs: np.array(xs, dtype=np.float32) / np.float32(2))  # small integers: ties are common


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.sampled_from([-np.inf, -1.0, 0.0, 0.5, 2.0, 3.0]), min_size=1, max_size=40),
       m=st.integers(1, 45))
def test_best_tokens_is_the_head_of_the_full_ranking(values, m):
    logits = np.array(values)
    assert best_tokens(logits, m).tolist() == rank_tokens(logits)[:m].tolist()


@settings(max_examples=150, deadline=None)
@given(logits=logit_vectors, k=st.integers(1, 14), t=st.sampled_from([None, 0.3, 1.0, 3.0]),
       seed=st.integers(0, 2**32 - 1))
def test_top_k_never_returns_a_token_outside_the_k_best(logits, k, t, seed):
    best = rank_tokens(logits)[:k]
    kth_value = logits[best[-1]]
    sampler = make_sampler(temperature=t, top_k=k, seed=seed)
    for _ in range(20):
        token = sampler(logits)
        assert token in best
        assert logits[token] >= kth_value
    assert sorted(kept_tokens(logits, temperature=t, top_k=k).tolist()) == sorted(best.tolist())


@settings(max_examples=200, deadline=None)
@given(logits=logit_vectors, p=st.floats(0.01, 1.0), t=st.sampled_from([None, 0.5, 1.0, 2.0]))
def test_top_p_keeps_the_smallest_set_with_mass_at_least_p(logits, p, t):
    probs = softmax_of([float(v) / (1.0 if t is None else t) for v in logits])
    kept = kept_tokens(logits, temperature=t, top_p=p)
    order = rank_tokens(logits)
    assert kept.tolist() == order[:len(kept)].tolist()  # a head of the ranking
    assert probs[kept].sum() >= p - 1e-9  # enough mass
    assert probs[kept[:-1]].sum() < p + 1e-9  # and one token fewer is not enough: the smallest such set
    dist = sampling_distribution(logits, temperature=t, top_p=p)
    np.testing.assert_allclose(dist[kept], probs[kept] / probs[kept].sum(), rtol=1e-9)
    assert dist.sum() == pytest.approx(1.0, abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(logits=logit_vectors, seed=st.integers(0, 2**63))
def test_same_seed_same_tokens(logits, seed):
    a, b = make_sampler(temperature=1.3, top_p=0.95, seed=seed), make_sampler(temperature=1.3, top_p=0.95, seed=seed)
    first = [a(logits) for _ in range(10)]
    assert first == [b(logits) for _ in range(10)]
    a.reset()
    assert first == [a(logits) for _ in range(10)]


def test_different_seeds_give_different_streams():
    flat = np.zeros(50, dtype=np.float32)  # 50 equally likely tokens
    first_draws = [make_sampler(temperature=1.0, seed=s)(flat) for s in range(20)]
    assert len(set(first_draws)) > 10
    s0 = make_sampler(temperature=1.0, seed=0)
    s1 = make_sampler(temperature=1.0, seed=1)
    assert [s0(flat) for _ in range(20)] != [s1(flat) for _ in range(20)]


def test_minus_inf_tokens_are_never_drawn():
    logits = np.full(8, -np.inf, dtype=np.float32)
    logits[[2, 5]] = [0.0, -50.0]
    sampler = make_sampler(temperature=5.0, seed=0)
    assert set(sampler(logits) for _ in range(500)) <= {2, 5}
    assert sampling_distribution(logits, temperature=5.0)[[0, 1, 3, 4, 6, 7]].tolist() == [0.0] * 6
    assert make_sampler(top_k=8, seed=1)(np.where(np.arange(8) == 7, 0.0, -np.inf)) == 7


def test_float32_logits_are_safe():
    big = np.array([3.0e38, 2.9e38, -3.0e38], dtype=np.float32)  # near float32's limit
    probs = sampling_distribution(big, temperature=1.0)
    assert np.isfinite(probs).all() and probs.tolist() == [1.0, 0.0, 0.0]
    tiny_t = sampling_distribution(LOGITS, temperature=1e-8)
    assert tiny_t[0] == 1.0 and np.isfinite(tiny_t).all()
    f32 = np.array([0.1, 0.2, 0.3], dtype=np.float32)
    np.testing.assert_array_equal(sampling_distribution(f32, temperature=0.7),
                                  sampling_distribution(f32.astype(np.float64), temperature=0.7))
    assert sampling_distribution(f32, temperature=np.float32(0.7)).dtype == np.float64
    assert make_sampler(temperature=np.float32(0.5), top_k=np.int64(2), top_p=np.float32(0.9), seed=0)(f32) in (1, 2)


def test_pure_pieces():
    x = np.array([1.0, -2.0, 4.0])
    np.testing.assert_array_equal(apply_temperature(x, 2.0), [0.5, -1.0, 2.0])
    np.testing.assert_allclose(probabilities(x), softmax_of(x.tolist()), rtol=1e-12)
    np.testing.assert_array_equal(top_k_filter(x, 1), [-np.inf, -np.inf, 4.0])
    np.testing.assert_array_equal(top_k_filter(x, 10), x)
    np.testing.assert_array_equal(top_p_filter(x, 1e-9), [-np.inf, -np.inf, 4.0])
    assert check_logits([[1.0, 2.0]]).tolist() == [1.0, 2.0]  # [1, V] from last_only


# --- bad settings --------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.1}, "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
    ({"temperature": float("inf")}, "temperature must be a finite number >= 0"),
    ({"top_k": 0}, "top_k must be an integer >= 1"),
    ({"top_k": -3}, "top_k must be an integer >= 1"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"top_p": float("nan")}, r"top_p must be in \(0, 1\]"),
    ({"seed": -1}, "seed must be an integer >= 0"),
])
def test_bad_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_sampler(**kwargs)
    if "seed" not in kwargs:
        with pytest.raises(ValueError, match=message):
            sampling_distribution(LOGITS, **kwargs)


@pytest.mark.parametrize("kwargs", [{"temperature": "hot"}, {"temperature": True}, {"top_k": 2.5},
                                    {"top_k": True}, {"top_p": "0.9"}])
def test_wrong_types_are_rejected(kwargs):
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        make_sampler(**kwargs)


@pytest.mark.parametrize("logits, message", [
    ([-np.inf, -np.inf], "every logit is -inf"),
    ([0.0, np.nan], "logit of token 1 is nan"),
    ([np.inf, 0.0], "logit of token 0 is inf"),
    (np.zeros((2, 3)), r"shape \(2, 3\)"),
    ([], r"shape \(0,\)"),
])
def test_bad_logits_are_rejected(logits, message):
    with pytest.raises(ValueError, match=message):
        make_sampler(temperature=1.0, seed=0)(logits)


def test_apply_temperature_refuses_zero():
    with pytest.raises(ValueError, match="temperature 0 means greedy"):
        apply_temperature(LOGITS, 0)


# --- in the generation loop -----------------------------------------------------------------

def test_generate_accepts_samplers():
    model = toy_model()
    assert generate(model, SEED_PROMPT, 4, sampler=make_sampler()).new_tokens == SEED_CONTINUATION
    assert generate(model, SEED_PROMPT, 4, sampler=make_sampler(temperature=0)).new_tokens == SEED_CONTINUATION
    runs = [generate(model, SEED_PROMPT, 12, sampler=make_sampler(temperature=1.5, seed=s)).new_tokens
            for s in (0, 0, 1)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    top1 = generate(model, SEED_PROMPT, 4, sampler=make_sampler(top_k=1, seed=3)).new_tokens
    assert top1 == SEED_CONTINUATION  # top-1 sampling is greedy
    tokens = generate(model, SEED_PROMPT, 30, sampler=make_sampler(temperature=2.0, top_k=2, seed=9))
    for event in tokens.events:
        assert event.next_token in rank_tokens(event.logits)[:2]


def test_sampler_repr_names_its_settings():
    assert repr(make_sampler(temperature=0.7, top_k=40, seed=1)) == "Sampler(temperature=0.7, top_k=40, seed=1)"
    assert isinstance(make_sampler(top_p=0.5), Sampler)


# --- the notebook's widget ------------------------------------------------------------------

def test_distribution_view_and_widget():
    import matplotlib.pyplot as plt

    from tinydecoder.decoding.sampling import distribution_view
    from tinydecoder.widgets import sampling_figure, sampling_widget

    view = distribution_view(LOGITS, temperature=1.0, top_k=2, n_show=4)
    assert view["ids"].tolist() == [0, 1, 6, 2]
    assert view["kept"].tolist() == [True, True, False, False] and view["n_kept"] == 2
    base = softmax_of([float(v) for v in LOGITS])
    assert view["kept_base_mass"] == pytest.approx(base[0] + base[1])
    np.testing.assert_allclose(view["base"], base[[0, 1, 6, 2]])
    np.testing.assert_allclose(view["probs"][:2], base[[0, 1]] / (base[0] + base[1]))
    labels = [f"t{i}" for i in range(7)]
    fig = sampling_figure(view, labels)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["'t0'", "'t1'", "'t6'", "'t2'"]
    plt.close(fig)

    box = sampling_widget(LOGITS, labels, n_show=5)
    assert box.data["n_kept"] == 6  # T = 1, no filters: every finite token
    box.controls["top_k"].value = 3
    assert box.data["n_kept"] == 3 and box.data["settings"]["top_k"] == 3
    box.controls["top_k"].value = 0  # 0 = off
    box.controls["top_p"].value = 0.4
    assert box.data["settings"]["top_p"] == 0.4 and box.data["n_kept"] == 1  # token 0 alone holds ~0.42
    box.controls["top_p"].value = 1.0  # 1 = off
    box.controls["temperature"].value = 0.0
    assert box.data["greedy"] and box.data["probs"].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert box.controls["temperature"].description == "temperature"
    plt.close("all")
