"""The mixture-of-experts layer: gating, carving, capacity and the balance loss, each against a
case worked by hand, and each with a wrong version it must tell apart."""
import math

import numpy as np
import pytest

from tinydecoder.algorithms import moe
from tinydecoder.core.ops import swiglu


def dense_ffn(seed=0, D=6, F=12, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) * 0.5 for s in ((D, F), (D, F), (F, D))]


# ----------------------------------------------------------------------------- gating

def test_top_k_gating_by_hand():
    logits = np.log([[1.0, 2.0, 3.0, 4.0], [4.0, 1.0, 1.0, 2.0]])  # softmax: [.1 .2 .3 .4], [4 1 1 2]/8
    experts, gates = moe.top_k_gating(logits, 2)
    assert experts.tolist() == [[3, 2], [0, 3]]
    np.testing.assert_allclose(gates, [[4 / 7, 3 / 7], [4 / 6, 2 / 6]], rtol=1e-6)
    # the failure it must catch: probabilities kept without renormalising ([.4, .3] sums to .7)
    assert not np.allclose(gates[0], [0.4, 0.3])
    np.testing.assert_allclose(gates.sum(axis=1), 1.0, rtol=1e-6)


def test_top_k_gating_ties_go_to_the_lower_id_and_unit_gates_are_ones():
    experts, gates = moe.top_k_gating(np.zeros((2, 4)), 3, gating="unit")
    assert experts.tolist() == [[0, 1, 2]] * 2
    assert gates.tolist() == [[1.0] * 3] * 2


@pytest.mark.parametrize("k, error", [(0, ValueError), (5, ValueError), (1.5, TypeError), (True, TypeError)])
def test_top_k_gating_rejects_bad_k(k, error):
    with pytest.raises(error, match="k"):
        moe.top_k_gating(np.zeros((2, 4)), k)


def test_top_k_gating_rejects_bad_shapes_and_gating():
    with pytest.raises(ValueError, match=r"\[T, E\]"):
        moe.top_k_gating(np.zeros(4), 1)
    with pytest.raises(ValueError, match="gating"):
        moe.top_k_gating(np.zeros((1, 4)), 1, gating="sigmoid")


# ----------------------------------------------------------------------------- carving

@pytest.mark.parametrize("E", [1, 2, 3, 4, 6, 12])
def test_every_expert_with_unit_gates_is_the_dense_ffn(E):
    wg, wu, wd = dense_ffn()
    x = np.random.default_rng(1).standard_normal((5, 6))
    experts = moe.carve_experts(wg, wu, wd, moe.contiguous_partition(12, E), E)
    assert [e.n_units for e in experts] == [12 // E] * E
    chosen, gates = np.tile(np.arange(E), (5, 1)), np.ones((5, E))
    np.testing.assert_allclose(moe.moe_grouped(x, experts, chosen, gates), swiglu(x, wg, wu) @ wd, atol=1e-12)


def test_any_partition_carves_exactly_and_a_wrong_carving_is_caught():
    wg, wu, wd = dense_ffn()
    x = np.random.default_rng(2).standard_normal((4, 6))
    labels = np.array([2, 0, 1, 2, 0, 1, 1, 0, 2, 2, 0, 1])
    experts = moe.carve_experts(wg, wu, wd, labels, 3)
    np.testing.assert_array_equal(experts[0].w_gate, wg[:, [1, 4, 7, 10]])  # unit order kept
    np.testing.assert_array_equal(experts[0].w_down, wd[[1, 4, 7, 10]])
    dense = swiglu(x, wg, wu) @ wd
    full = moe.moe_grouped(x, experts, np.tile(np.arange(3), (4, 1)), np.ones((4, 3)))
    np.testing.assert_allclose(full, dense, atol=1e-12)
    # wrong: columns of gate/up taken by the partition but rows of down left in place
    bad = [moe.Expert(e.w_gate, e.w_up, wd[:e.n_units]) for e in experts]
    assert not np.allclose(moe.moe_grouped(x, bad, np.tile(np.arange(3), (4, 1)), np.ones((4, 3))), dense)


def test_sorted_partitions_carve_views_not_copies():
    wg, wu, wd = dense_ffn()
    experts = moe.carve_experts(wg, wu, wd, moe.contiguous_partition(12, 4), 4)
    assert all(np.shares_memory(e.w_gate, wg) and np.shares_memory(e.w_down, wd) for e in experts)


def test_bad_partitions_are_named():
    wg, wu, wd = dense_ffn()
    with pytest.raises(ValueError, match="do not split into 5 equal experts"):
        moe.contiguous_partition(12, 5)
    with pytest.raises(ValueError, match=r"experts \[1\] get no hidden units"):
        moe.carve_experts(wg, wu, wd, np.array([0] * 6 + [2] * 6), 3)
    with pytest.raises(ValueError, match="one expert id per hidden unit"):
        moe.carve_experts(wg, wu, wd, np.zeros(11, int), 1)
    with pytest.raises(ValueError, match=r"must be in 0..1"):
        moe.carve_experts(wg, wu, wd, np.array([0, 1, 2] * 4), 2)
    with pytest.raises(TypeError, match="integer expert id"):
        moe.carve_experts(wg, wu, wd, np.zeros(12), 1)
    with pytest.raises(ValueError, match="more than the 12 hidden units"):
        moe.contiguous_partition(12, 13)
    with pytest.raises(TypeError, match="n_experts must be an int"):
        moe.contiguous_partition(12, 4.0)


# ----------------------------------------------------------------------------- the sum, two ways

def test_grouped_equals_the_reference_with_routing_and_drops():
    wg, wu, wd = dense_ffn(3)
    experts = moe.carve_experts(wg, wu, wd, moe.contiguous_partition(12, 4), 4)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, 6))
    chosen, gates = moe.top_k_gating(rng.standard_normal((9, 4)), 2)
    chosen[[1, 5], [0, 1]] = -1  # two dropped assignments
    ref = moe.moe_reference(x, experts, chosen, gates)
    np.testing.assert_allclose(moe.moe_grouped(x, experts, chosen, gates), ref, atol=1e-12)
    # by hand for token 0: its two experts, weighted
    by_hand = sum(gates[0, j] * experts[chosen[0, j]](x[:1])[0] for j in range(2))
    np.testing.assert_allclose(ref[0], by_hand, atol=1e-12)
    # a dropped assignment contributes nothing: token 1 keeps only its second expert
    np.testing.assert_allclose(ref[1], gates[1, 1] * experts[chosen[1, 1]](x[1:2])[0], atol=1e-12)


# ----------------------------------------------------------------------------- capacity

def test_capacity_drops_in_token_order_by_hand():
    experts = np.array([[0, 1], [0, 2], [0, 1], [1, 0]])
    assert moe.expert_capacity(4, 2, 3, 0.75) == 2  # ceil(0.75 * 4 * 2 / 3)
    keep = moe.dispatch_mask(experts, 3, 2)
    # expert 0 is asked by tokens 0, 1, 2, 3: tokens 2 and 3 are past its 2 seats;
    # expert 1 by tokens 0, 2, 3: token 3 is dropped; expert 2 once.
    assert keep.tolist() == [[True, True], [True, True], [False, True], [False, False]]
    assert moe.tokens_per_expert(experts, 3, keep).tolist() == [2, 2, 1]
    assert moe.tokens_per_expert(experts, 3).tolist() == [4, 3, 1]
    assert moe.dispatch_mask(experts, 3, None).all()


def test_capacity_factor_is_checked():
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        moe.expert_capacity(4, 1, 2, 0.0)
    with pytest.raises(TypeError, match="capacity_factor must be a number"):
        moe.expert_capacity(4, 1, 2, "1.0")


def test_layer_counts_its_drops():
    wg, wu, wd = dense_ffn(5)
    experts = moe.carve_experts(wg, wu, wd, moe.contiguous_partition(12, 4), 4)
    router = np.zeros((6, 4))
    router[:, 0] = 10.0  # every token prefers expert 0 (positive inputs), then ties by id
    x = np.abs(np.random.default_rng(6).standard_normal((8, 6)))
    out = moe.MoELayer(router, experts, k=1, capacity_factor=1.0)(x)
    assert moe.expert_capacity(8, 1, 4, 1.0) == 2
    assert out.experts[:, 0].tolist() == [0] * 8 and out.n_dropped == 6
    np.testing.assert_allclose(out.y[2:], 0.0)  # dropped tokens get nothing from the FFN
    np.testing.assert_allclose(out.y[:2], experts[0](x[:2]), atol=1e-12)  # gate 1 when k = 1
    ref = moe.MoELayer(router, experts, k=1, capacity_factor=1.0)(x, reference=True)
    np.testing.assert_allclose(ref.y, out.y, atol=1e-12)


def test_layer_checks_and_bytes():
    wg, wu, wd = dense_ffn(dtype=np.float32)
    experts = moe.carve_experts(wg, wu, wd, moe.contiguous_partition(12, 4), 4)
    layer = moe.MoELayer(np.zeros((6, 4), np.float32), experts, k=2)
    assert layer.bytes_per_token() == 6 * 4 * 4 + 2 * (3 * 6 * 3 * 4)  # router + 2 experts of 3 units
    with pytest.raises(ValueError, match=r"w_router must be \[D, E=4\]"):
        moe.MoELayer(np.zeros((6, 3)), experts)
    with pytest.raises(ValueError, match="k"):
        moe.MoELayer(np.zeros((6, 4)), experts, k=5)


# ----------------------------------------------------------------------------- balance loss

def test_switch_balance_loss_by_hand():
    probs = np.array([[0.5, 0.5], [0.9, 0.1]])
    # both tokens go to expert 0: f = [1, 0], P = [0.7, 0.3], loss = 2 * (1 * 0.7 + 0 * 0.3)
    assert moe.load_balancing_loss(probs, [[0], [0]]) == pytest.approx(1.4)
    # balanced dispatch and uniform probabilities give exactly 1
    assert moe.load_balancing_loss(np.full((4, 4), 0.25), [[0], [1], [2], [3]]) == pytest.approx(1.0)
    # the failure it must catch: without the factor E the balanced value would be 1/E
    assert moe.load_balancing_loss(np.full((4, 4), 0.25), [[0], [1], [2], [3]]) != pytest.approx(0.25)
    with pytest.raises(ValueError, match=r"experts must be \[T=2, k\]"):
        moe.load_balancing_loss(probs, [[0]])
    assert math.isclose(moe.load_balancing_loss(probs, [[0, 1], [0, 1]]), 2 * (0.5 * 0.7 + 0.5 * 0.3))
