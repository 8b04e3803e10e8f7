"""flash_attention equals attention, block by block; merge_partials; the traffic counter."""
import math

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.algorithms.flash import flash_attention, merge_partials, online_softmax_steps
from tinydecoder.core.ops import attention
from tinydecoder.lessons.flash_lab import attention_traffic, peak_memory

TOL = {np.float64: 1e-12, np.float32: 1e-5}


def random_qkv(S, T, Hq, Hkv, d=8, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((S, Hq, d)).astype(dtype)
    k = rng.standard_normal((T, Hkv, d)).astype(dtype)
    v = rng.standard_normal((T, Hkv, d)).astype(dtype)
    return q, k, v


def exact_lse(q, k, query_start=None):
    """[Hq, S] log-sum-exp of each query's visible scaled scores, one query at a time, in float64."""
    S, Hq, d = q.shape
    T, Hkv, _ = k.shape
    start = T - S if query_start is None else query_start
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    lse = np.full((Hq, S), -np.inf)
    for h in range(Hq):
        for i in range(S):
            visible = min(T, start + i + 1)
            if visible <= 0:
                continue
            s = k64[:visible, h // (Hq // Hkv)] @ q64[i, h] / math.sqrt(d)  # [visible]
            lse[h, i] = s.max() + math.log(math.fsum(np.exp(s - s.max())))
    return lse


SHAPES = {  # name: (S, T, Hq, Hkv)
    "prefill GQA": (11, 11, 6, 2), "decode GQA": (1, 11, 6, 2), "chunk GQA": (4, 11, 6, 2),
    "prefill MHA": (11, 11, 3, 3), "decode MHA": (1, 11, 3, 3), "chunk MHA": (4, 11, 3, 3),
    "chunk MQA": (5, 11, 4, 1),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_equals_attention_for_every_block_size(shape, dtype):
    S, T, Hq, Hkv = shape
    q, k, v = random_qkv(S, T, Hq, Hkv, dtype=dtype)
    want_out, want_lse = attention(q, k, v), exact_lse(q, k)
    for block_size in range(1, T + 2):  # 1, divisors and non-divisors of T, T, and more than T
        out, lse = flash_attention(q, k, v, block_size=block_size)
        assert out.dtype == lse.dtype == dtype
        assert out.shape == (S, Hq * q.shape[2]) and lse.shape == (Hq, S)
        assert np.max(np.abs(out - want_out)) <= TOL[dtype], block_size
        assert np.max(np.abs(lse - want_lse)) <= TOL[dtype], block_size


def test_long_prefill_float32_matches_and_default_block():
    q, k, v = random_qkv(200, 200, 9, 3, d=64, dtype=np.float32, seed=1)
    out, lse = td.flash_attention(q, k, v)  # block_size 64: 200 is not a multiple
    assert np.max(np.abs(out - attention(q, k, v))) <= 1e-5
    assert np.max(np.abs(lse - exact_lse(q, k))) <= 1e-5


def test_query_start_places_queries():
    q, k, v = random_qkv(3, 7, 4, 2)
    # queries after every key: the same as a cache of 7 keys all visible (no mask)
    out, lse = flash_attention(q, k, v, block_size=3, query_start=7)
    for i in range(3):
        np.testing.assert_allclose(out[i:i + 1], attention(q[i:i + 1], k, v), atol=1e-12)
    np.testing.assert_allclose(lse, exact_lse(q, k, query_start=7), atol=1e-12)
    # queries before some keys: query 0 at position -1 sees nothing -> out 0, lse -inf
    out, lse = flash_attention(q, k, v, block_size=2, query_start=-1)
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[:, 0]))
    np.testing.assert_allclose(lse, exact_lse(q, k, query_start=-1), atol=1e-12)
    np.testing.assert_allclose(out[2:3], attention(q[2:3], k[:2], v[:2]), atol=1e-12)


def parts_over(q, k, v, cuts, block_size=3):
    """flash_attention over the keys between consecutive cuts, queries kept at their positions."""
    S, T = q.shape[0], k.shape[0]
    return [flash_attention(q, k[a:b], v[a:b], block_size, query_start=T - S - a)
            for a, b in zip(cuts[:-1], cuts[1:])]


@pytest.mark.parametrize("S", [1, 5, 16], ids=["decode", "chunk", "prefill"])
def test_merging_any_split_in_any_order_equals_one_pass(S):
    T = 16
    q, k, v = random_qkv(S, T, 6, 3, seed=S)
    one_out, one_lse = flash_attention(q, k, v, block_size=4)
    rng = np.random.default_rng(S)
    for _ in range(20):
        n_cuts = rng.integers(1, 6)
        cuts = [0, *sorted(rng.choice(np.arange(1, T), size=n_cuts, replace=False)), T]
        parts = parts_over(q, k, v, cuts)
        order = rng.permutation(len(parts))
        merged = parts[order[0]]
        for i in order[1:]:  # a left fold in a random order
            merged = merge_partials(merged, parts[i]) if rng.random() < 0.5 else merge_partials(parts[i], merged)
        assert np.max(np.abs(merged[0] - one_out)) <= 1e-12, cuts
        assert np.max(np.abs(merged[1] - one_lse)) <= 1e-12, cuts


def test_merge_is_associative_and_handles_a_part_that_saw_nothing():
    q, k, v = random_qkv(4, 12, 4, 2)
    a, b, c = parts_over(q, k, v, [0, 5, 9, 12])  # c: keys 9..11, unseen by queries at 8 (and 9, 10)
    assert np.isneginf(c[1][:, 0]).all() and np.all(c[0][0] == 0)
    left, right = merge_partials(merge_partials(a, b), c), merge_partials(a, merge_partials(b, c))
    np.testing.assert_allclose(left[0], right[0], atol=1e-12)
    np.testing.assert_allclose(left[1], right[1], atol=1e-12)
    nothing = (np.zeros_like(a[0]), np.full_like(a[1], -np.inf))
    out, lse = merge_partials(a, nothing)
    np.testing.assert_array_equal(out, a[0])
    np.testing.assert_array_equal(lse, a[1])
    out, lse = merge_partials(nothing, nothing)  # no key anywhere: still no NaN
    assert np.all(out == 0) and np.isneginf(lse).all()


def test_merge_float32_stays_float32():
    q, k, v = random_qkv(1, 30, 9, 3, dtype=np.float32)
    one = flash_attention(q, k, v)
    merged = merge_partials(*parts_over(q, k, v, [0, 17, 30]))
    assert merged[0].dtype == merged[1].dtype == np.float32
    assert np.max(np.abs(merged[0] - one[0])) <= 1e-5


def test_online_softmax_steps_one_row():
    rng = np.random.default_rng(3)
    scores = rng.standard_normal(10) * 3
    values = rng.standard_normal((10, 2))
    steps = online_softmax_steps(scores, values, block_size=4)
    assert [s["keys_seen"] for s in steps] == [4, 8, 10]
    for step, prev in zip(steps, [None, *steps[:-1]]):
        seen = scores[:step["keys_seen"]]
        assert step["m"] == seen.max()
        assert np.isclose(step["row_sum"], np.exp(seen - seen.max()).sum(), rtol=1e-14)
        w = np.exp(seen - seen.max()) / np.exp(seen - seen.max()).sum()
        np.testing.assert_allclose(step["out"], w @ values[:len(seen)], atol=1e-14)
        assert step["alpha"] == (0.0 if prev is None else math.exp(prev["m"] - step["m"]))


def test_attention_traffic_hand_checked():
    # n=4, d=2, 16 elements on chip. Key block Bc = min(n, d, 16 // (4d)) = 2.
    # standard: Br = (16 - Bc*d) // (d + Bc) = 3, so query blocks of 3 and 1 rows.
    #   S = QK^T: reads Q 8 + K twice 16, writes S 16; softmax (a row of 4 fits): reads 16, writes 16;
    #   O = PV: reads P 16 + V twice 16, writes O 8  ->  reads 72, writes 40 elements
    # flash: Br = (16 - 2*Bc*d) // (2d + 2 + Bc) = 1: four query blocks of 1 row;
    #   reads Q 8 + K and V four times 64, writes O 8 + lse 4  ->  reads 72, writes 12
    t = attention_traffic(4, 2, 16)
    assert t["standard_blocks"] == (3, 2) and t["flash_blocks"] == (1, 2)
    assert (t["standard_reads"], t["standard_writes"], t["standard_bytes"]) == (288, 160, 448)
    assert (t["flash_reads"], t["flash_writes"], t["flash_bytes"]) == (288, 48, 336)
    # n=8, d=1, 7 elements: a row of S (8) does not fit -> softmax reads S three times.
    # standard: Bc 1, Br = (7 - 1) // 2 = 3 (blocks 3, 3, 2); reads 8 + 24 | 192 | 64 + 24, writes 64 | 64 | 8
    # flash: Bc 1, Br = (7 - 2) // 5 = 1; reads 8 * (1 + 16) = 136, writes 8 * 2 = 16
    t = attention_traffic(8, 1, 7, itemsize=2)
    assert (t["standard_reads"], t["standard_writes"]) == (312 * 2, 136 * 2)
    assert (t["flash_reads"], t["flash_writes"]) == (136 * 2, 16 * 2)


def test_attention_traffic_trend():
    n, d = 1024, 64
    sizes = [2 ** p for p in range(9, 21)]  # 512 .. 1M elements on chip
    rows = [attention_traffic(n, d, m) for m in sizes]
    flash = [r["flash_bytes"] for r in rows]
    standard = [r["standard_bytes"] for r in rows]
    assert all(a >= b for a, b in zip(flash, flash[1:])) and flash[0] > 100 * flash[-1]
    assert all(a >= b for a, b in zip(standard, standard[1:]))
    assert all(s >= 4 * n * n * 4 for s in standard)  # S written, read, P written, read: >= 4 n^2
    assert flash[-1] == (4 * n * d + n) * 4  # all fits: Q, K, V read once, O and lse written once
    small = attention_traffic(n, d, d * d // 2)  # on-chip memory below d^2: flash re-reads K, V too often
    assert small["flash_bytes"] > small["standard_bytes"]
    large = attention_traffic(n, d, 4 * d * d)  # 64 KiB of float32
    assert large["flash_bytes"] < large["standard_bytes"] / 1.5


@pytest.mark.parametrize("bad, match", [
    (0, "block_size must be >= 1"), (-3, "block_size must be >= 1"),
    (2.5, "block_size must be an integer"), (True, "block_size must be an integer"),
])
def test_bad_block_size(bad, match):
    q, k, v = random_qkv(2, 4, 2, 1)
    with pytest.raises(ValueError, match=match):
        flash_attention(q, k, v, block_size=bad)


def test_bad_shapes():
    q, k, v = random_qkv(2, 4, 6, 2)
    with pytest.raises(ValueError, match="q must be a 3-D float numpy array"):
        flash_attention(q[0], k, v)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        flash_attention(q, k, v[:3])
    with pytest.raises(ValueError, match="same head_dim"):
        flash_attention(q[..., :4], k, v)
    with pytest.raises(ValueError, match=r"query heads \(6\) must be a multiple of .*KV heads \(4\)"):
        flash_attention(q, *random_qkv(2, 4, 4, 4)[1:])
    with pytest.raises(ValueError, match="S=5 queries cannot be the last S of only T=4"):
        flash_attention(random_qkv(5, 4, 6, 2)[0], k, v)
    with pytest.raises(ValueError, match="share one dtype"):
        flash_attention(q.astype(np.float32), k, v)
    with pytest.raises(ValueError, match="query_start must be an integer"):
        flash_attention(q, k, v, query_start=1.0)


def test_bad_merge_and_steps_and_traffic():
    q, k, v = random_qkv(2, 4, 4, 2)
    a = flash_attention(q, k, v)
    with pytest.raises(ValueError, match="part2 must be a pair"):
        merge_partials(a, a[0])
    with pytest.raises(ValueError, match="part1: out .* does not fit lse"):
        merge_partials((a[0], a[1].T), a)
    with pytest.raises(ValueError, match="same shapes"):
        merge_partials(a, flash_attention(q[:1], k, v))
    with pytest.raises(ValueError, match="scores must be a non-empty 1-D float array"):
        online_softmax_steps(np.zeros((2, 2)), np.zeros((2, 1)), 1)
    with pytest.raises(ValueError, match="values must be"):
        online_softmax_steps(np.zeros(3), np.zeros((2, 1)), 1)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        online_softmax_steps(np.zeros(3), np.zeros((3, 1)), 0)
    with pytest.raises(ValueError, match="sram_elements=100 cannot hold .* at least 129"):
        attention_traffic(1024, 64, 100)  # standard: a Q row, a K row and one score
    with pytest.raises(ValueError, match="sram_elements=200 cannot hold .* at least 259"):
        attention_traffic(1024, 64, 200)  # flash: a Q row, its accumulator, m, l, a score, K and V rows
    with pytest.raises(ValueError, match="n must be >= 1"):
        attention_traffic(0, 64, 4096)


def test_peak_memory_sees_numpy_buffers_and_flash_stays_small():
    result, peak = peak_memory(np.ones, 1 << 18)  # 2 MiB of float64
    assert result.shape == (1 << 18,) and 2 ** 21 <= peak < 2 ** 21 + 65536
    q, k, v = random_qkv(512, 512, 4, 2, d=16, dtype=np.float32)
    _, naive = peak_memory(attention, q, k, v, return_weights=True)  # holds [Hq, S, T] weights
    (out, lse), flash = peak_memory(flash_attention, q, k, v, block_size=32)
    assert naive >= 4 * 512 * 512 * 4  # the weights alone: 4 MiB
    assert flash < out.nbytes + lse.nbytes + 2 ** 20  # the result plus less than 1 MiB of tiles
