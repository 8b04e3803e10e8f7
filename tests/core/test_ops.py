"""The reference ops against their definitions, and the fast path's attention (blocks of
queries, stacked query groups, in-place softmax) against the reference's. (The whole fast
forward pass against the reference: core/test_fast.py.)"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinydecoder as td
from tinydecoder import fast
from tinydecoder.core.toy import random_model

CFG = td.Config(vocab_size=50, d_model=24, n_heads=6, n_kv_heads=2, head_dim=8, n_layers=2, d_ff=40,
                max_context=512, position="rope", rope_base=10000.0, norm_eps=1e-5, tied_embeddings=True)


def attention_by_definition(q, k, v):
    """softmax(q k^T / sqrt(d) + causal mask) v with K/V repeated per query head, in float64."""
    S, Hq, d = q.shape
    T, Hkv, _ = k.shape
    k, v = td.repeat_kv(k, Hq // Hkv), td.repeat_kv(v, Hq // Hkv)
    out = np.empty((S, Hq, d))
    for h in range(Hq):
        scores = q[:, h] @ k[:, h].T / np.sqrt(d)
        for i in range(S):
            scores[i, T - S + i + 1:] = -np.inf
        w = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, h] = (w / w.sum(axis=1, keepdims=True)) @ v[:, h]
    return out.reshape(S, Hq * d)


@settings(max_examples=15, deadline=None)
@given(S=st.integers(1, 3 * fast.QUERY_BLOCK + 5), past=st.integers(0, 40), seed=st.integers(0, 999))
def test_attention_and_the_fast_blocked_attention_equal_the_definition(S, past, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((S, 6, 8))
    k, v = rng.standard_normal((2, past + S, 2, 8))
    want = attention_by_definition(q, k, v)
    np.testing.assert_allclose(td.attention(q, k, v), want, rtol=0, atol=1e-12)
    blocked = fast.attend(q[None], k.transpose(1, 0, 2)[None], v.transpose(1, 0, 2)[None])  # S > QUERY_BLOCK: blocks
    np.testing.assert_allclose(blocked, want, rtol=0, atol=1e-12)
    if S == 1:
        np.testing.assert_allclose(fast.attend_one_query(q[0], k, v), want, rtol=0, atol=1e-12)


def test_attention_refuses_heads_that_do_not_group():
    q, k = np.zeros((2, 6, 8)), np.zeros((2, 4, 8))
    with pytest.raises(ValueError, match="6 query heads cannot share 4 KV heads"):
        td.attention(q, k, k)


def test_rope_refuses_an_odd_head_width_and_positions_of_the_wrong_length():
    with pytest.raises(ValueError, match="head_dim must be an even integer"):
        td.apply_rope(np.zeros((2, 1, 5)), [0, 1])
    with pytest.raises(ValueError, match="3 positions for 2 rows"):
        td.apply_rope(np.zeros((2, 1, 4)), [0, 1, 2])


def test_long_prefill_equals_token_by_token_decode():
    model = random_model(CFG, seed=5, dtype=np.float64)
    ids = np.random.default_rng(1).integers(0, 50, 2 * fast.QUERY_BLOCK + 9)
    prefill = td.forward(model, ids)
    cache = model.new_cache()
    stepwise = np.concatenate([td.forward(model, [t], cache) for t in ids])
    np.testing.assert_allclose(prefill, stepwise, rtol=0, atol=1e-10)


def test_softmax_leaves_its_input_alone():
    x = np.array([[1.0, 2.0, -np.inf], [0.5, 0.5, 0.5]], dtype=np.float32)
    before = x.copy()
    w = td.softmax(x)
    np.testing.assert_array_equal(x, before)
    assert w.dtype == np.float32 and w[0, 2] == 0.0
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(w[0, :2], np.exp([1.0, 2.0]) / np.exp([1.0, 2.0]).sum(), rtol=1e-6)
