"""GQA helpers of notebook 05 (tinydecoder.lessons.heads)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinydecoder as td
from tinydecoder.lessons import heads

SMOLLM2 = td.Config(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, n_layers=30,
                    d_ff=1536, max_context=8192, position="rope", rope_base=100000.0, tied_embeddings=True)


def test_divisors_and_head_map():
    assert heads.divisors(12) == [1, 2, 3, 4, 6, 12]
    assert heads.kv_head_map(8, 2).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert heads.kv_head_map(9, 3).tolist() == [SMOLLM2.kv_head_of(h) for h in range(9)]
    assert heads.kv_head_map(4, 4).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"must divide n_heads=9.*allowed: \[1, 3, 9\], got 2"):
        heads.kv_head_map(9, 2)
    with pytest.raises(ValueError, match="positive integer"):
        heads.divisors(0)


def test_attention_kind():
    assert [heads.attention_kind(8, k) for k in (8, 4, 2, 1)] == ["MHA", "GQA", "GQA", "MQA"]
    assert heads.attention_kind(1, 1) == "MHA"


def test_kv_cache_table_smollm2():
    rows = heads.kv_cache_table(SMOLLM2)
    assert [(r["kind"], r["n_kv_heads"], r["group"], r["bytes_per_token"]) for r in rows] == [
        ("MHA", 9, 1, 138240), ("GQA", 3, 3, 46080), ("MQA", 1, 9, 15360)]
    assert rows[1]["fraction_of_mha"] == pytest.approx(1 / 3)
    assert heads.with_kv_heads(SMOLLM2, 1).n_kv_heads == 1 and SMOLLM2.n_kv_heads == 3


@pytest.mark.parametrize("layer", [0, 1])
def test_layer_qkv_reproduces_the_forward_attention(layer):
    """Attention of layer_qkv's q, k, v equals the weights the traced forward recorded."""
    model = td.toy_model()
    q, k, v = heads.layer_qkv(model, td.SEED_PROMPT, layer)
    assert q.shape == (4, 2, 4) and k.shape == v.shape == (4, 1, 4)
    trace = td.Trace()
    td.forward(model, td.SEED_PROMPT, trace=trace)
    _, weights = td.attention(q, k, v, return_weights=True)
    np.testing.assert_allclose(weights, trace.attention_weights[(layer, 0)], atol=1e-14)


def test_layer_qkv_rope_model_keys_match_the_cache():
    model = td.random_model(td.Config(vocab_size=11, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4,
                                      n_layers=2, d_ff=20, max_context=16, position="rope"),
                            seed=1, dtype=np.float64)
    cache = model.new_cache()
    td.forward(model, [1, 5, 7], cache)
    q, k, v = heads.layer_qkv(model, [1, 5, 7], layer=1)
    np.testing.assert_allclose(k, cache.k[1][:3], atol=1e-14)
    np.testing.assert_allclose(v, cache.v[1][:3], atol=1e-14)
    with pytest.raises(ValueError, match=r"layers are 0\.\.1"):
        heads.layer_qkv(model, [1], layer=2)


def test_heads_sharing_kv_still_differ():
    q, k, v = heads.layer_qkv(td.toy_model(), td.SEED_PROMPT, 0)
    per_head = heads.split_heads(td.attention(q, k, v), 2)  # [2, 4, 4]
    assert per_head.shape == (2, 4, 4)
    # position 0 sees only itself: both heads return v[0] of their shared KV head ...
    np.testing.assert_allclose(per_head[:, 0], np.stack([v[0, 0], v[0, 0]]), atol=1e-15)
    # ... later positions weigh the shared values with each head's own query: different outputs
    assert np.min(np.max(np.abs(per_head[0, 1:] - per_head[1, 1:]), axis=-1)) > 1e-3


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([(4, 1), (4, 2), (6, 3), (6, 2)]), st.integers(1, 5), st.integers(0, 99))
def test_gqa_is_mha_with_repeated_kv(heads_pair, S, seed):
    Hq, Hkv = heads_pair
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((S, Hq, 4))
    k, v = rng.standard_normal((2, S, Hkv, 4))
    gqa = td.attention(q, k, v)
    mha = td.attention(q, td.repeat_kv(k, Hq // Hkv), td.repeat_kv(v, Hq // Hkv))
    np.testing.assert_allclose(gqa, mha, atol=1e-12)
    idx = heads.kv_head_map(Hq, Hkv)
    np.testing.assert_array_equal(td.repeat_kv(k, Hq // Hkv), k[:, idx])
