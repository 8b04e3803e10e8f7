"""algorithms.paged_attention reads K/V through the block table and equals attention on the
gathered copy (prefill and decode, MHA and GQA, float32 and float64)."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.algorithms.paged_attention import paged_attention
from tinydecoder.core import ops
from tinydecoder.serving.paged import PagedKVPool


def gathered(pool_k, table, length):
    n_blocks, B, Hkv, d = pool_k.shape
    return pool_k[table].reshape(len(table) * B, Hkv, d)[:length]


@pytest.mark.parametrize("Hq, Hkv", [(2, 2), (9, 3), (4, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_equals_attention_on_the_gathered_copy(Hq, Hkv, dtype):
    rng = np.random.default_rng(0)
    B, d, n_blocks = 4, 8, 9
    pool_k = rng.standard_normal((n_blocks, B, Hkv, d)).astype(dtype)
    pool_v = rng.standard_normal((n_blocks, B, Hkv, d)).astype(dtype)
    table = [7, 2, 5, 0]  # scattered physical blocks
    for length in (1, 4, 5, 13, 16):
        for S in {1, min(3, length), length}:
            q = rng.standard_normal((S, Hq, d)).astype(dtype)
            k, v = gathered(pool_k, table, length), gathered(pool_v, table, length)
            expected = ops.attention(q, k, v).reshape(S, Hq, d)
            out = paged_attention(q, pool_k, pool_v, table, length)
            assert out.shape == (S, Hq, d) and out.dtype == dtype
            tol = 1e-5 if dtype == np.float32 else 1e-12
            assert np.max(np.abs(out - expected)) < tol


def test_on_a_real_pool_of_the_toy_model():
    model = td.toy_model()
    pool = PagedKVPool.for_model(model, n_blocks=8, block_size=4)
    a, b = pool.new_sequence(), pool.new_sequence()
    for chunk in ([0, 1, 2, 3], [4, 5, 0, 1], [2, 3]):  # a and b take blocks in turn: a's are 0, 2, 4
        td.forward(model, chunk, a), td.forward(model, chunk[::-1], b)
    assert a.block_table == [0, 2, 4]
    cfg = model.config
    q = np.random.default_rng(1).standard_normal((1, cfg.n_heads, cfg.head_dim))
    for layer in range(cfg.n_layers):
        k = gathered(pool.k[layer], a.block_table, len(a))
        v = gathered(pool.v[layer], a.block_table, len(a))
        expected = ops.attention(q, k, v).reshape(q.shape)
        assert np.max(np.abs(paged_attention(q, pool.k[layer], pool.v[layer], a.block_table, len(a)) - expected)) < 1e-12


def test_bad_arguments():
    pool = np.zeros((4, 2, 1, 3))
    q = np.zeros((1, 2, 3))
    with pytest.raises(ValueError, match="need 3 blocks"):
        paged_attention(q, pool, pool, [0, 1], 5)
    with pytest.raises(ValueError, match="each in 0..3"):
        paged_attention(q, pool, pool, [0, 9], 3)
    with pytest.raises(ValueError, match="length must be"):
        paged_attention(np.zeros((3, 2, 3)), pool, pool, [0], 2)
    with pytest.raises(ValueError, match="q \\[S, Hq, d\\]"):
        paged_attention(np.zeros((1, 2, 4)), pool, pool, [0], 1)
