"""SinkCache (attention sinks + sliding window, StreamingLLM) and the long-context helpers."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.algorithms.sink_cache import (
    SinkCache,
    kept_positions,
    next_token_nll,
    rolling_buffer_slots,
    stream_forward,
)

ROPE = td.Config(vocab_size=23, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, n_layers=3,
                 d_ff=20, max_context=64, position="rope", rope_base=100.0)
SMOLLM2 = td.Config(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, n_layers=30,
                    d_ff=1536, max_context=8192, position="rope", rope_base=100000.0, tied_embeddings=True)
IDS = np.random.default_rng(0).integers(0, 23, size=40)


@pytest.fixture(scope="module")
def model():
    return td.random_model(ROPE, seed=1, dtype=np.float64)


def test_memory_stays_bounded_token_after_token(model):
    cache = SinkCache(ROPE, sinks=2, window=5, dtype=np.float64)
    arrays, allocated = [id(a) for a in cache.k + cache.v], cache.allocated_nbytes
    for t, token in enumerate(IDS, start=1):
        td.forward(model, [token], cache)
        assert len(cache) == min(t, 7) and cache.tokens_seen == t
        assert all(a.shape[0] == 7 for a in cache.k + cache.v)
        assert cache.nbytes == len(cache) * ROPE.kv_bytes_per_token(8)
    assert [id(a) for a in cache.k + cache.v] == arrays and cache.allocated_nbytes == allocated
    assert cache.kept_positions.tolist() == [0, 1, 35, 36, 37, 38, 39]


def test_kept_positions():
    assert kept_positions(5, 2, 4).tolist() == [0, 1, 2, 3, 4]
    assert kept_positions(10, 2, 4).tolist() == [0, 1, 6, 7, 8, 9]
    assert kept_positions(10, 0, 4).tolist() == [6, 7, 8, 9]


def test_state_after_eviction_equals_a_fresh_prefill_of_the_kept_tokens(model):
    """Layer 0's K and V depend only on the token and its position: after eviction they equal a
    dense prefill of the kept tokens at positions 0..len-1 (their slots)."""
    cache = SinkCache(ROPE, sinks=3, window=6, dtype=np.float64)
    stream_forward(model, IDS[:25], cache)
    fresh = td.KVCache(ROPE, np.float64)
    td.forward(model, IDS[:25][cache.kept_positions], fresh)
    np.testing.assert_allclose(cache.keys(0), fresh.k[0][:9], atol=1e-12)
    np.testing.assert_allclose(cache.v[0][:9], fresh.v[0][:9], atol=1e-12)
    assert not np.allclose(cache.keys(1), fresh.k[1][:9])  # deeper layers remember evicted context


@pytest.mark.parametrize("sinks", [0, 2])
def test_an_evicting_step_sees_streamingllm_positions(model, sinks):
    """The step that evicts equals a plain KVCache holding the kept keys at slot positions
    0..C-2 and the new token at slot C-1: every layer, every distance, to float rounding."""
    window = 5
    cache = SinkCache(ROPE, sinks=sinks, window=window, dtype=np.float64)
    stream_forward(model, IDS[:20], cache)
    reference = td.KVCache(ROPE, np.float64)
    keep = [i for i in range(len(cache)) if i != sinks]  # drop the oldest window row (this step evicts it)
    for layer in range(ROPE.n_layers):  # the stored keys are unrotated: rotate them at their new slots
        keys = td.apply_rope(cache.k[layer][keep], np.arange(len(keep)), ROPE.rope_base)
        reference.append(layer, keys, cache.v[layer][keep])
    expected = td.forward(model, [IDS[20]], reference)
    got = td.forward(model, [IDS[20]], cache)
    np.testing.assert_allclose(got, expected, atol=1e-10)
    for layer in range(ROPE.n_layers):  # and the state afterwards is that reference's
        np.testing.assert_allclose(cache.keys(layer), reference.k[layer][:len(cache)], atol=1e-10)


def test_no_eviction_means_dense_attention(model):
    cache = SinkCache(ROPE, sinks=4, window=60, dtype=np.float64)
    got = stream_forward(model, IDS, cache, piece=3)
    np.testing.assert_allclose(got, td.forward(model, IDS), atol=1e-10)


def test_stream_forward_equals_the_reference_forward_through_evictions(model):
    """stream_forward runs on the fast path; fed token by token through the reference forward,
    a second sink cache gives the same logits, evictions included."""
    got = stream_forward(model, IDS, SinkCache(ROPE, sinks=2, window=6, dtype=np.float64))
    cache = SinkCache(ROPE, sinks=2, window=6, dtype=np.float64)
    want = [td.forward(model, IDS[:8], cache)] + [td.forward(model, [t], cache) for t in IDS[8:]]
    np.testing.assert_allclose(got, np.concatenate(want), rtol=0, atol=1e-10)


def test_pieces_after_eviction_and_float32_dtype():
    model32 = td.random_model(ROPE, seed=1, dtype=np.float32)
    cache = SinkCache(ROPE, sinks=2, window=6)
    logits = stream_forward(model32, IDS, cache, piece=4)
    assert logits.shape == (40, 23) and logits.dtype == np.float32
    assert len(cache) == 8 and cache.tokens_seen == 40 and cache.keys(0).dtype == np.float32


def test_generate_with_a_sink_cache_equals_a_manual_decode(model):
    gen = td.generate(model, IDS[:6], 20, cache=SinkCache(ROPE, sinks=2, window=5, dtype=np.float64))
    assert len(gen.cache) == 7 and gen.cache.tokens_seen == 25
    cache, tokens = SinkCache(ROPE, sinks=2, window=5, dtype=np.float64), list(IDS[:6])
    logits = td.forward(model, tokens, cache)[-1]
    for _ in range(20):
        tokens.append(int(np.argmax(logits)))
        logits = td.forward(model, [tokens[-1]], cache)[-1]
    assert gen.tokens == tokens[:26]


def test_position_table_model_works_too():
    table = td.Config(vocab_size=23, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, n_layers=2,
                      d_ff=20, max_context=64)
    model = td.random_model(table, seed=2, dtype=np.float64)
    cache = SinkCache(table, sinks=1, window=4, dtype=np.float64)
    logits = stream_forward(model, IDS[:12], cache)
    assert logits.shape == (12, 23) and len(cache) == 5
    np.testing.assert_allclose(logits[:5], td.forward(model, IDS[:5]), rtol=0, atol=1e-12)  # nothing evicted yet
    assert not np.allclose(logits[5:], td.forward(model, IDS[:12])[5:])  # and it did evict


def test_bad_arguments_get_clear_errors(model):
    with pytest.raises(ValueError, match="sinks must be an integer >= 0, got -1"):
        SinkCache(ROPE, sinks=-1, window=4)
    with pytest.raises(ValueError, match="window must be an integer >= 1, got 0"):
        SinkCache(ROPE, sinks=4, window=0)
    with pytest.raises(ValueError, match="window must be an integer >= 1, got True"):
        SinkCache(ROPE, window=True)
    with pytest.raises(ValueError, match="sinks \\+ window = 65 exceeds the model's context limit 64"):
        SinkCache(ROPE, sinks=4, window=61)
    with pytest.raises(TypeError, match="must be a tinydecoder Config"):
        SinkCache({"n_layers": 2})
    cache = SinkCache(ROPE, sinks=2, window=4, dtype=np.float64)
    td.forward(model, IDS[:5], cache)
    with pytest.raises(ValueError, match=r"5 new tokens do not fit .* at most 4 per step.*stream_forward"):
        td.forward(model, IDS[5:10], cache)
    assert len(cache) == 5 and cache.tokens_seen == 5  # refused before anything changed
    with pytest.raises(ValueError, match="piece=5 must be <= the window"):
        stream_forward(model, IDS, cache, piece=5)
    with pytest.raises(ValueError, match="holds float64 but the model computes in float32"):
        td.forward(td.random_model(ROPE, seed=1), [1], cache)
    cache.truncate(3)
    assert len(cache) == 3
    stream_forward(model, IDS[:10], cache)
    with pytest.raises(ValueError, match="cannot truncate a sink cache that has evicted"):
        cache.truncate(2)


def test_rolling_buffer_slots():
    assert rolling_buffer_slots(3, 4).tolist() == [0, 1, 2, -1]
    assert rolling_buffer_slots(10, 4).tolist() == [8, 9, 6, 7]


def test_next_token_nll():
    rng = np.random.default_rng(3)
    logits, ids = rng.normal(size=(6, 9)), rng.integers(0, 9, size=6)
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(next_token_nll(logits, ids), -np.log(p[np.arange(5), ids[1:]]), atol=1e-12)
    with pytest.raises(ValueError, match="N >= 2"):
        next_token_nll(logits[:1], ids[:1])
