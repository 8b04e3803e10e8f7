"""The speed-ups inside forward change no result: block-by-block attention for long prefills,
fused QKV / gate-up weights, the in-place softmax."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinydecoder as td
from tinydecoder import ops
from tinydecoder.model import fuse_projections
from tinydecoder.toy import random_model

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
@given(S=st.integers(ops.ATTENTION_BLOCK + 1, 3 * ops.ATTENTION_BLOCK + 5), past=st.integers(0, 40),
       seed=st.integers(0, 999))
def test_blocked_attention_equals_the_definition(S, past, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((S, 6, 8))
    k, v = rng.standard_normal((2, past + S, 2, 8))
    blocked = td.attention(q, k, v)  # S > ATTENTION_BLOCK: block by block
    whole, _ = td.attention(q, k, v, return_weights=True)  # one pass over the full S x T scores
    np.testing.assert_allclose(blocked, whole, rtol=0, atol=1e-12)
    np.testing.assert_allclose(blocked, attention_by_definition(q, k, v), rtol=0, atol=1e-12)


def test_long_prefill_equals_token_by_token_decode():
    model = random_model(CFG, seed=5, dtype=np.float64)
    ids = np.random.default_rng(1).integers(0, 50, 2 * ops.ATTENTION_BLOCK + 9)
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


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fused_weights_give_the_same_logits(dtype):
    plain = random_model(CFG, seed=2, dtype=dtype)
    fused = td.Model(CFG, plain.embed, [fuse_projections(l) for l in plain.layers], final_norm=plain.final_norm)
    assert fused.layers[0].w_qkv.shape == (24, 6 * 8 + 2 * 2 * 8) and fused.layers[0].w_gate_up.shape == (24, 80)
    assert np.shares_memory(fused.layers[0].wk, fused.layers[0].w_qkv)
    assert fused.n_params == plain.n_params and fused.nbytes == plain.nbytes
    tol = 1e-12 if dtype == np.float64 else 1e-5
    ids = [3, 14, 15, 9, 26]
    a, b = plain.new_cache(), fused.new_cache()
    np.testing.assert_allclose(td.forward(fused, ids, b), td.forward(plain, ids, a), rtol=0, atol=tol)
    np.testing.assert_allclose(td.forward(fused, [7], b, last_only=True), td.forward(plain, [7], a, last_only=True),
                               rtol=0, atol=tol)
    assert td.generate(fused, ids, 6).tokens == td.generate(plain, ids, 6).tokens


def test_a_fused_array_must_hold_its_parts():
    plain = random_model(CFG, seed=2)
    layer = fuse_projections(plain.layers[0])
    layer.wq = np.array(layer.wq)  # a copy, no longer a view of w_qkv: the two could disagree
    with pytest.raises(ValueError, match=r"layers\[0\].wq must be a view of layers\[0\].w_qkv"):
        td.Model(CFG, plain.embed, [layer, plain.layers[1]], final_norm=plain.final_norm)
