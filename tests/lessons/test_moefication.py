"""MoEfication's parts on the seed's toy model (F = 16 hidden units, 2 layers), each against a case
worked by hand and a wrong version it must tell apart; and the published MoE shapes."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.core.ops import swiglu
from tinydecoder.lessons import moe_models
from tinydecoder.lessons import moefication as mf

TEXTS = [[0, 1, 2, 3, 4, 5, 0, 2], [3, 3, 1, 0, 5, 4], [5, 4, 3, 2, 1, 0, 1]]


@pytest.fixture(scope="module")
def toy():
    model = td.toy_model()
    Z = mf.calibration_inputs(model, TEXTS)
    return model, Z, mf.moefy(model, Z, n_experts=4, seed=0, ridge=1e-3)


def test_the_ffn_parameter_replaces_the_feed_forward(toy):
    model, Z, _ = toy
    ids = TEXTS[0]
    dense = lambda l, layer, z: swiglu(z, layer.w_gate, layer.w_up) @ layer.w_down
    np.testing.assert_array_equal(td.forward(model, ids, ffn=dense), td.forward(model, ids))
    assert not np.allclose(td.forward(model, ids, ffn=lambda l, layer, z: 0 * z), td.forward(model, ids))
    assert [z.shape for z in Z] == [(21, 8), (21, 8)]  # every token of the three texts, per layer
    with pytest.raises(TypeError, match="list of token-id lists"):
        mf.calibration_inputs(model, [0, 1, 2])


def test_balanced_assignment_by_hand():
    dist = np.array([[0.0, 5.0], [1.0, 5.0], [0.5, 0.1], [0.2, 3.0]])
    # most certain first: unit 0 (0.0) -> c0, unit 2 (0.1) -> c1, unit 3 (0.2) -> c0 (full now),
    # unit 1 (1.0) wants c0 but must take c1. Nearest-centre alone would put 3 units in c0.
    assert mf.balanced_assign(dist).tolist() == [0, 1, 1, 0]
    assert np.argmin(dist, axis=1).tolist() == [0, 0, 1, 0]


def test_balanced_kmeans_finds_planted_groups():
    rng = np.random.default_rng(0)
    centres = np.eye(4) * 10
    truth = np.repeat(np.arange(4), 6)
    points = centres[truth] + rng.standard_normal((24, 4)) * 0.1
    perm = rng.permutation(24)
    labels = mf.balanced_kmeans(points[perm], 4, seed=1)
    assert np.bincount(labels).tolist() == [6] * 4
    for group in range(4):  # every planted group ends up in one cluster
        assert len(set(labels[truth[perm] == group])) == 1
    with pytest.raises(ValueError, match="do not split into 5 clusters"):
        mf.balanced_kmeans(points, 5)


def test_expert_norms_are_the_carved_experts_norms(toy):
    model, Z, m = toy
    layer, z, labels = model.layers[1], Z[1], m.labels[1]
    norms = mf.expert_norms(mf.hidden_units(layer, z), labels, layer.w_down, 4)
    by_hand = np.stack([np.linalg.norm(e(z), axis=1) for e in m.experts[1]], axis=1)
    np.testing.assert_allclose(norms, by_hand, rtol=1e-12)
    # wrong: the units of expert e taken in checkpoint order instead of by the partition
    wrong = mf.expert_norms(mf.hidden_units(layer, z), np.arange(16) // 4, layer.w_down, 4)
    assert not np.allclose(wrong, by_hand)
    assert sorted(np.bincount(labels).tolist()) == [4] * 4


def test_router_least_squares_recovers_a_linear_rule():
    rng = np.random.default_rng(2)
    z = rng.standard_normal((200, 5))
    W, b = rng.standard_normal((5, 3)), np.array([0.5, -1.0, 0.0])
    W_fit, b_fit = mf.fit_router(z, np.exp(z @ W + b), ridge=1e-9)
    logits = z @ W_fit + b_fit
    # softmax ignores a constant per token: compare centred logits
    centred = lambda a: a - a.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(centred(logits), centred(z @ W + b), atol=1e-4)
    assert mf.top_k_overlap(logits, z @ W + b, 1) == 1.0
    assert mf.top_k_overlap(-logits, z @ W + b, 1) < 0.5  # a router ranking backwards is caught


def test_every_expert_is_the_dense_model_for_both_routers(toy):
    model, _, m = toy
    ids = TEXTS[2]
    dense = td.forward(model, ids)
    for router in mf.ROUTERS:
        np.testing.assert_allclose(td.forward(model, ids, ffn=m.ffn(4, router)), dense, atol=1e-12)
    assert not np.allclose(td.forward(model, ids, ffn=m.ffn(1)), dense)


def test_oracle_keeps_the_largest_experts(toy):
    model, Z, m = toy
    z, layer = Z[0][:5], model.layers[0]
    outs = np.stack([e(z) for e in m.experts[0]])  # [E, T, D]
    norms = np.linalg.norm(outs, axis=2)  # [E, T]
    top2 = np.argsort(-norms, axis=0)[:2]  # [2, T]
    by_hand = np.stack([outs[top2[0, t], t] + outs[top2[1, t], t] for t in range(5)])
    got = m.ffn(2, "oracle")(0, layer, z)
    np.testing.assert_allclose(got, by_hand, atol=1e-12)
    bottom2 = np.argsort(norms, axis=0)[:2]  # the failure: keeping the smallest
    assert not np.allclose(got, np.stack([outs[bottom2[0, t], t] + outs[bottom2[1, t], t] for t in range(5)]))


def test_learned_router_is_the_moe_layer(toy):
    model, Z, m = toy
    z = Z[1][:6]
    out = m.layer(1, 2)(z)
    np.testing.assert_allclose(m.ffn(2, "learned", record=True)(1, model.layers[1], z), out.y, atol=1e-12)
    np.testing.assert_array_equal(m.routing[1], out.experts)
    assert (out.gates == 1).all()


def test_perplexity_by_hand():
    model = td.toy_model()
    ids = [0, 1, 2, 3]
    logits = td.forward(model, ids[:-1])
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    nll = -np.mean(np.log(probs[[0, 1, 2], [1, 2, 3]]))
    assert mf.perplexity(model, ids) == pytest.approx(np.exp(nll), rel=1e-12)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        mf.perplexity(model, [1])


def test_bytes_follow_k_over_e(toy):
    model, _, m = toy
    dense = mf.dense_ffn_bytes(model)
    assert dense == 2 * 3 * 8 * 16 * 8  # layers x (gate, up, down) x D x F x float64
    routers = sum(W.nbytes + b.nbytes for W, b in m.routers)  # stored float32
    for k in (1, 2, 4):
        assert mf.moe_ffn_bytes(m, k) == k * dense // 4 + routers


def test_bad_arguments_are_named(toy):
    model, Z, m = toy
    with pytest.raises(ValueError, match="router must be one of"):
        m.ffn(2, "random")
    with pytest.raises(ValueError, match=r"k \(experts per token\) must be in 1..4"):
        m.ffn(5)
    with pytest.raises(ValueError, match="one calibration array per layer"):
        mf.moefy(model, Z[:1], n_experts=4)
    with pytest.raises(ValueError, match="one \\[1, D\\] input per layer"):
        mf.decode_ffn_seconds(model, m, Z[:1], 2)
    assert mf.decode_ffn_seconds(model, m, [z[:1] for z in Z], 2, repeats=1) > 0


def test_published_moe_shapes_match_the_papers_totals():
    for shape in (moe_models.MIXTRAL_8X7B, moe_models.DEEPSEEKMOE_16B):
        counts = moe_models.param_counts(shape)
        total, active = moe_models.PUBLISHED[shape.name]
        assert counts["total"] == pytest.approx(total, rel=0.01)
        assert counts["active"] == pytest.approx(active, rel=0.02)
    mixtral = moe_models.param_counts(moe_models.MIXTRAL_8X7B)
    # top-2 of 8 experts: a quarter of the expert weights, plus the small router
    assert mixtral["ffn_active"] - 32 * 4096 * 8 == (mixtral["ffn_total"] - 32 * 4096 * 8) // 4
    assert moe_models.param_counts(moe_models.DEEPSEEKMOE_16B)["experts_per_token"] == "2 shared + 6 of 64"
