"""The fast path (fast/forward_pass.py: fast.forward, fast.forward_batch) computes the reference path's
numbers (core/reference.py: reference.forward, reference.forward_batch): checked in float64 to
1e-10 on models whose weights are NOT shared between the two sides (the fast side runs on a deep
copy, so a bug that reads the wrong slice of a fused array, or writes into a shared one, cannot
hide behind identical memory), for prefill, decode with a cache, unequal batches, last_only, the
batched cache, a paged cache, long-context decode, generation, GQA / MHA / MQA, table and RoPE
positions (both RoPE layouts). A deliberately broken fast path fails. Speed is never asserted."""
import copy

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.core import reference
from tinydecoder.core.toy import random_model
from tinydecoder.fast import forward_pass as fast
from tinydecoder.serving.paged import PagedKVPool

TOL = 1e-10


def config(n_kv_heads=2, position="rope", layout="halves", norm_scale=True, tied=True):
    return td.Config(vocab_size=53, d_model=24, n_heads=6, n_kv_heads=n_kv_heads, head_dim=8, n_layers=3,
                     d_ff=40, max_context=400, position=position, rope_layout=layout, norm_eps=1e-5,
                     norm_scale=norm_scale, tied_embeddings=tied, name="fast-test")


CONFIGS = {
    "gqa-rope-halves": config(2),
    "mha-rope-interleaved": config(6, layout="interleaved"),
    "mqa-rope-halves": config(1),
    "gqa-table": config(2, position="table"),
    "mha-table-no-norm-weight-untied": config(6, position="table", norm_scale=False, tied=False),
}


def two_models(name, seed=0):
    """(reference side, fast side): equal weights in distinct arrays."""
    ref = random_model(CONFIGS[name], seed=seed, dtype=np.float64)
    other = copy.deepcopy(ref)
    assert not np.shares_memory(ref.layers[0].w_qkv, other.layers[0].w_qkv)
    return ref, other


def tokens(n, seed=0, vocab=53):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def close(got, want):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_prefill_equals_reference(name):
    ref, mine = two_models(name)
    ids = tokens(150)  # > 2 query blocks: the blocked path
    close(fast.forward(mine, ids), reference.forward(ref, ids))
    close(fast.forward(mine, ids[:5], last_only=True), reference.forward(ref, ids[:5], last_only=True))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decode_steps_with_a_cache_equal_reference(name):
    ref, mine = two_models(name, seed=1)
    ids = tokens(90, seed=1)
    ref_cache, my_cache = ref.new_cache(), mine.new_cache()
    close(fast.forward(mine, ids[:70], my_cache, last_only=True),
          reference.forward(ref, ids[:70], ref_cache, last_only=True))
    for i, t in enumerate(ids[70:]):
        close(fast.forward(mine, [t], my_cache, last_only=i % 2 == 0), reference.forward(ref, [t], ref_cache))
    close(fast.forward(mine, ids[:9], my_cache), reference.forward(ref, ids[:9], ref_cache))  # a chunk after decode
    assert len(my_cache) == len(ref_cache) == 99
    np.testing.assert_allclose(my_cache.k[2][:99], ref_cache.k[2][:99], rtol=0, atol=TOL)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("last_only", [False, True])
def test_unequal_batch_equals_reference(name, last_only):
    ref, mine = two_models(name, seed=2)
    batch = [tokens(70, seed=3), [4], tokens(6, seed=4)]
    ref_caches = [ref.new_cache(), None, ref.new_cache()]
    my_caches = [mine.new_cache(), None, mine.new_cache()]
    for c_ref, c_mine, seed in ((ref_caches[0], my_caches[0], 5), (ref_caches[2], my_caches[2], 6)):
        prompt = tokens(11, seed=seed)
        reference.forward(ref, prompt, c_ref)
        fast.forward(mine, prompt, c_mine)
    got = fast.forward_batch(mine, batch, my_caches, last_only=last_only)
    want = reference.forward_batch(ref, batch, ref_caches, last_only=last_only)
    assert len(got) == 3
    for g, w in zip(got, want):
        close(g, w)


@pytest.mark.parametrize("name", ["gqa-rope-halves", "mha-rope-interleaved", "gqa-table"])
def test_batched_cache_equals_reference(name):
    ref, mine = two_models(name, seed=3)
    prompts = [tokens(20, seed=s) for s in (7, 8, 9, 10)]
    batched = fast.BatchKVCache(mine.config, np.float64, batch=4, capacity=4)  # grows on the way
    got = fast.forward_batch(mine, prompts, batched)  # prefill all four in one call
    ref_caches = [ref.new_cache() for _ in prompts]
    for g, p, c in zip(got, prompts, ref_caches):
        close(g, reference.forward(ref, p, c))
    for step in range(5):  # decode steps: one attention call per layer for the batch
        new = [[(7 * step + s) % 53] for s in range(4)]
        got = fast.forward_batch(mine, new, batched, last_only=True)
        for g, t, c in zip(got, new, ref_caches):
            close(g, reference.forward(ref, t, c))
    got = fast.forward_batch(mine, [tokens(3, seed=s) for s in range(4)], batched, last_only=True)
    for g, s, c in zip(got, range(4), ref_caches):
        close(g, reference.forward(ref, tokens(3, seed=s), c, last_only=True))
    np.testing.assert_allclose(batched.sequence(2).k[1][:28], ref_caches[2].k[1][:28], rtol=0, atol=TOL)


def test_stacking_per_sequence_caches():
    ref, mine = two_models("gqa-rope-halves", seed=4)
    cache = mine.new_cache()
    fast.forward(mine, tokens(30, seed=11), cache)
    batched = fast.BatchKVCache.stack([cache, cache.copy()], extra=1)
    assert len(batched) == 30 and batched.batch == 2
    ref_cache = ref.new_cache()
    reference.forward(ref, tokens(30, seed=11), ref_cache)
    want = reference.forward(ref, [3], ref_cache)
    for g in fast.forward_batch(mine, [[3], [3]], batched):
        close(g, want)
    assert len(cache) == 30  # stacking copied: the source caches are unchanged


def test_paged_cache_equals_reference():
    ref, mine = two_models("gqa-rope-halves", seed=5)
    pool = PagedKVPool.for_model(mine, n_blocks=40, block_size=4)
    seqs = [pool.new_sequence(), pool.new_sequence()]
    ref_caches = [ref.new_cache(), ref.new_cache()]
    batch = [tokens(13, seed=12), tokens(6, seed=13)]
    for g, w in zip(fast.forward_batch(mine, batch, seqs), reference.forward_batch(ref, batch, ref_caches)):
        close(g, w)
    for step in range(3):
        new = [[step + 1], [step + 2]]
        got = fast.forward_batch(mine, new, seqs, last_only=True)
        for g, w in zip(got, reference.forward_batch(ref, new, ref_caches, last_only=True)):
            close(g, w)


def test_float32_keeps_its_dtype():
    model = random_model(CONFIGS["gqa-rope-halves"], seed=6, dtype=np.float32)
    cache = model.new_cache()
    out = fast.forward(model, tokens(70), cache)
    assert out.dtype == np.float32 and cache.k[0].dtype == np.float32
    np.testing.assert_allclose(out, reference.forward(model, tokens(70)), rtol=1e-4, atol=1e-4)


def test_bad_input_gets_a_clear_error():
    model = random_model(CONFIGS["gqa-rope-halves"], seed=7, dtype=np.float64)
    with pytest.raises(ValueError, match="out of range"):
        fast.forward(model, [53])
    with pytest.raises(ValueError, match="2 sequences but 1 caches"):
        fast.forward_batch(model, [[1], [2]], [None])
    with pytest.raises(ValueError, match="context too long"):
        fast.forward(model, [1] * 401)
    with pytest.raises(ValueError, match="made for another model"):
        fast.forward(model, [1], random_model(CONFIGS["mqa-rope-halves"]).new_cache())
    with pytest.raises(TypeError, match="cache must be"):
        fast.forward(model, [1], cache=[1, 2])
    batched = fast.BatchKVCache(model.config, np.float64, batch=2)
    with pytest.raises(ValueError, match="same number of new tokens"):
        fast.forward_batch(model, [[1, 2], [3]], batched)
    with pytest.raises(ValueError, match="2 sequences but the BatchKVCache holds 3"):
        fast.forward_batch(model, [[1], [2]], fast.BatchKVCache(model.config, np.float64, batch=3))
    with pytest.raises(ValueError, match="equal length"):
        fast.BatchKVCache.stack([model.new_cache(), fast_cache_of(model, 2)])
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        fast.BatchKVCache(model.config, np.float64, batch=0)
    with pytest.raises(ValueError, match="at least one sequence"):
        fast.forward_batch(model, [])


def fast_cache_of(model, n):
    cache = model.new_cache()
    fast.forward(model, list(range(1, n + 1)), cache)
    return cache


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9])
def test_project_equals_matmul_for_every_row_count(rows):
    rng = np.random.default_rng(rows)
    x, w = rng.standard_normal((rows, 12)), rng.standard_normal((12, 7))
    out = np.full((rows, 7), np.nan)
    np.testing.assert_allclose(fast.project(x, w, out), x @ w, rtol=0, atol=1e-12)
    np.testing.assert_allclose(fast.project(x, w.T.copy().T, out), x @ w, rtol=0, atol=1e-12)  # F-order w


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_generation_is_the_same_either_way(name):
    ref, mine = two_models(name, seed=8)
    prompt = tokens(6, seed=4)
    cache, ids = ref.new_cache(), list(prompt)
    for _ in range(6):  # the reference forward, step by step, greedy
        ids.append(td.greedy(reference.forward(ref, ids[len(cache):], cache)[-1]))
    assert td.generate(mine, prompt, 6).tokens == ids


@pytest.mark.parametrize("name", ["gqa-rope-halves", "mha-rope-interleaved", "mqa-rope-halves"])
@pytest.mark.parametrize("threshold", [1, None])
def test_long_context_decode_with_one_query_gemms(name, monkeypatch, threshold):
    """A decode step over >= ONE_QUERY_GEMM_FROM keys attends with attend_one_query (two GEMMs
    over a zero-padded query matrix); its logits equal the reference's. threshold=1 sends every
    single-query step there; None keeps the real threshold and decodes past it."""
    ref, mine = two_models(name, seed=9)
    if threshold is not None:
        monkeypatch.setattr(fast, "ONE_QUERY_GEMM_FROM", threshold)
    calls = []
    real = fast.attend_one_query
    monkeypatch.setattr(fast, "attend_one_query", lambda q, k, v: calls.append(len(k)) or real(q, k, v))
    n = fast.ONE_QUERY_GEMM_FROM + 2 if threshold is None else 7
    assert n + 3 <= ref.config.max_context
    prompt = tokens(n, seed=5)
    ref_cache, my_cache = ref.new_cache(), mine.new_cache()
    reference.forward(ref, prompt, ref_cache)
    fast.forward(mine, prompt, my_cache)
    assert calls == []  # a prefill never takes this path
    for t in tokens(3, seed=6):
        close(fast.forward(mine, [t], my_cache), reference.forward(ref, [t], ref_cache))
    assert calls == [n + i for i in (1, 2, 3) for _ in range(ref.config.n_layers)]


def test_a_broken_fast_path_is_caught(monkeypatch):
    """The comparison can fail: let the fast path's attention read V where K belongs, and it does."""
    ref, mine = two_models("gqa-rope-halves", seed=10)
    real_attend = fast.attend
    monkeypatch.setattr(fast, "attend", lambda q, k, v: real_attend(q, v, k))
    prompt = tokens(5)
    assert np.max(np.abs(fast.forward(mine, prompt) - reference.forward(ref, prompt))) > 1e-3


@pytest.mark.smollm2
def test_smollm2_fast_equals_reference_to_float32_rounding(smollm2):
    ids = list(range(1000, 1040))
    cache_f, cache_r = smollm2.new_cache(), smollm2.new_cache()
    np.testing.assert_allclose(fast.forward(smollm2, ids, cache_f, last_only=True),
                               reference.forward(smollm2, ids, cache_r, last_only=True), rtol=0, atol=2e-3)
    np.testing.assert_allclose(fast.forward(smollm2, [7], cache_f), reference.forward(smollm2, [7], cache_r),
                               rtol=0, atol=2e-3)
