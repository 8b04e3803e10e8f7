"""Chunked prefill: every chunk size gives the one-shot prefill's logits and cache; the chunk
masks are the rectangles-with-a-triangle-cut that attention actually applies."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinydecoder as td
from tinydecoder.serving.chunked import chunk_masks, chunk_spans, one_shot_mask_from_chunks, prefill_chunked

TOY = td.toy_model()  # float64
ROPE_CFG = td.Config(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, n_layers=2, d_ff=48,
                     max_context=96, position="rope", norm_scale=True, name="rope-gqa-test")
ROPE = td.random_model(ROPE_CFG, seed=3, dtype=np.float32)


def cache_rows(cache):
    n = len(cache)
    return [(k[:n], v[:n]) for k, v in zip(cache.k, cache.v)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.integers(1, 45))
def test_toy_chunked_equals_one_shot(prompt, chunk_size):
    one_shot_cache = TOY.new_cache()
    expected = td.forward(TOY, prompt, one_shot_cache)  # [S, V]
    run = prefill_chunked(TOY, prompt, chunk_size)
    assert run.logits.shape == expected.shape
    assert np.max(np.abs(run.logits - expected)) <= 1e-12
    assert len(run.cache) == len(prompt)
    for (k, v), (k1, v1) in zip(cache_rows(run.cache), cache_rows(one_shot_cache)):
        assert np.max(np.abs(k - k1)) <= 1e-12 and np.max(np.abs(v - v1)) <= 1e-12
    assert run.spans[0][0] == 0 and run.spans[-1][1] == len(prompt)
    assert all(b - a == chunk_size for a, b in run.spans[:-1]) and 1 <= run.spans[-1][1] - run.spans[-1][0] <= chunk_size
    # the same queries see the same keys: total work equals one shot's
    assert sum(run.score_pairs) == td.work_counts(TOY.config, 0, len(prompt))[1]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 49), min_size=1, max_size=60), st.integers(1, 64))
def test_rope_gqa_float32_chunked_equals_one_shot(prompt, chunk_size):
    expected = td.forward(ROPE, prompt)
    run = prefill_chunked(ROPE, prompt, chunk_size)
    assert run.logits.dtype == np.float32 and run.cache.dtype == np.float32
    np.testing.assert_allclose(run.logits, expected, rtol=1e-4, atol=2e-5)
    # greedy choice after the prompt is the same
    assert int(np.argmax(run.last_logits)) == int(np.argmax(expected[-1])) or \
        np.sort(expected[-1])[-1] - np.sort(expected[-1])[-2] < 1e-4


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=2, max_size=30), st.data())
def test_chunked_after_a_cached_prefix(prompt, data):
    past = data.draw(st.integers(1, len(prompt) - 1))
    chunk_size = data.draw(st.integers(1, 12))
    cache = TOY.new_cache()
    td.forward(TOY, prompt[:past], cache)
    run = prefill_chunked(TOY, prompt[past:], chunk_size, cache=cache)
    expected = td.forward(TOY, prompt)[past:]
    assert run.spans[0][0] == past and run.spans[-1][1] == len(prompt)
    assert np.max(np.abs(run.logits - expected)) <= 1e-12
    assert len(cache) == len(prompt)


def test_spans_examples():
    assert chunk_spans(5, 2) == [(0, 2), (2, 4), (4, 5)]
    assert chunk_spans(4, 4) == [(0, 4)]
    assert chunk_spans(3, 10) == [(0, 3)]
    assert chunk_spans(7, 3, start=2) == [(2, 5), (5, 7)]
    assert chunk_spans(0, 3) == []


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 45), st.integers(0, 10))
def test_masks_are_rows_of_the_full_causal_mask(n_tokens, chunk_size, past):
    masks = chunk_masks(n_tokens, chunk_size, past=past)
    full = td.causal_mask(past + n_tokens, past + n_tokens)
    spans = chunk_spans(past + n_tokens, chunk_size, start=past)
    assert len(masks) == len(spans)
    for (a, b), m in zip(spans, masks):
        assert m.shape == (b - a, b)  # rows: the chunk's queries; columns: past + chunk
        np.testing.assert_array_equal(m, full[a:b, :b])
        assert np.all(m[:, :a] == 0)  # every query of the chunk sees the whole past
        np.testing.assert_array_equal(m[:, a:], td.causal_mask(b - a, b - a))  # the triangle cut
        visible = int(np.sum(m == 0))
        assert visible == (b - a) * a + (b - a) * (b - a + 1) // 2  # rectangle + triangle
    if past == 0:
        np.testing.assert_array_equal(one_shot_mask_from_chunks(masks), full)


def test_mask_matches_the_attention_weights_of_a_chunk():
    """The zeros of a chunk's attention weights sit exactly where its mask is -inf."""
    prompt = [0, 1, 2, 3, 4, 5, 1, 2]
    cache = TOY.new_cache()
    td.forward(TOY, prompt[:3], cache)
    trace = td.Trace()
    td.forward(TOY, prompt[3:7], cache, trace=trace)  # a chunk of 4 after 3 cached positions
    weights = trace.attention_weights[(0, 0)]  # [Hq, 4, 7]
    mask = chunk_masks(4, 4, past=3)[0]
    assert weights.shape[1:] == mask.shape == (4, 7)
    for head in weights:
        np.testing.assert_array_equal(head == 0, np.isneginf(mask))
        np.testing.assert_allclose(head.sum(axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, None, "3"])
def test_bad_chunk_size_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):
        prefill_chunked(TOY, [0, 1, 2], bad)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_masks(3, bad)


def test_bad_prompt_and_context_errors():
    with pytest.raises(ValueError, match="out of range"):
        prefill_chunked(TOY, [0, 9], 2)
    with pytest.raises(ValueError, match="context too long"):
        prefill_chunked(TOY, [1] * 65, 16)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 49), min_size=2, max_size=50), st.sampled_from([1, 3, 16]), st.integers(1, 20))
def test_chunked_into_a_paged_sequence_after_a_prefix_hit(prompt, block_size, chunk_size):
    """Chunked prefill works on any cache: here a paged sequence that starts with reused blocks."""
    from tinydecoder.serving.paged import PagedKVPool

    model = td.random_model(ROPE_CFG, seed=5, dtype=np.float64)
    pool = PagedKVPool.for_model(model, n_blocks=2 * (len(prompt) // block_size + 2), block_size=block_size)
    first = pool.new_sequence(prompt)
    td.forward(model, first.pending_tokens, first)
    seq = pool.new_sequence(prompt)  # reuses every full block but leaves >= 1 token
    assert seq.n_cached == (len(prompt) - 1) // block_size * block_size
    run = prefill_chunked(model, seq.pending_tokens, chunk_size, cache=seq)
    expected = td.forward(model, prompt)[seq.n_cached:]
    assert np.max(np.abs(run.logits - expected)) <= 1e-12
    assert run.spans[0][0] == seq.n_cached and len(seq) == len(prompt)



def test_each_chunk_reads_every_weight_and_the_kv_before_it():
    """Bytes per chunk, by hand: weights once per call, plus K/V of b positions of every layer."""
    from tinydecoder.perf.bench import decode_step_bytes
    from tinydecoder.serving.chunked import chunk_bytes

    model = TOY
    per_token = model.config.kv_bytes_per_token(model.dtype.itemsize)  # 2 * L * Hkv * d * itemsize
    assert per_token == 2 * model.config.n_layers * model.config.n_kv_heads * model.config.head_dim * model.dtype.itemsize
    run = prefill_chunked(model, [0, 1, 2, 3, 4], 2)
    assert run.bytes_read == [model.nbytes + 2 * per_token, model.nbytes + 4 * per_token, model.nbytes + 5 * per_token]
    one_shot = prefill_chunked(model, [0, 1, 2, 3, 4], 5)
    assert sum(run.bytes_read) - sum(one_shot.bytes_read) == 2 * model.nbytes + 6 * per_token  # two more calls
    assert chunk_bytes(model, 7, 8) == decode_step_bytes(model, 7)  # a chunk of one token is a decode step
    with pytest.raises(ValueError, match="0 <= a < b"):
        chunk_bytes(model, 3, 3)
