"""QuantizedKVCache: the min/max round-trip bound on both axes and all bit widths, honest nbytes,
the KVCache interface (forward, forward_batch, generate, truncate, copy), clear errors, and on
SmolLM2 int8 greedy decoding equal to float32's."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.algorithms.kv_quant import (
    AXES,
    QuantizedKVCache,
    attention_error,
    pack,
    quantize,
    quantized_bytes_per_token,
    round_trip,
    unpack,
)
from tinydecoder.checkpoint.smollm2 import load_smollm2, smollm2_tokenizer
from tinydecoder.lessons.kv_lab import chunked_perplexity

CFG = td.Config(vocab_size=40, d_model=32, n_heads=4, n_kv_heads=2, head_dim=16, n_layers=2, d_ff=48,
                max_context=128, position="rope", name="quant-test")


def outlier_rows(T=70, H=3, d=64, seed=0):
    """Rows [T, H, d] with a few large channels, like real keys."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, H, d)).astype(np.float32)
    x[:, :, [3, d * 5 // 8]] *= 25
    return x


# ---------------------------------------------------------------- the group rule
@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("axis", AXES)
def test_round_trip_error_is_at_most_half_a_step(bits, axis):
    x = outlier_rows()
    x_hat, scale = round_trip(x, bits, axis, group_size=32)
    assert x_hat.shape == x.shape and x_hat.dtype == np.float32
    err = np.abs(x - x_hat)
    assert np.all(err <= scale / 2 + 1e-6 * np.abs(x).max())
    assert err.max() > 0  # a real quantisation happened
    if axis == "channel":  # 70 = 2 groups of 32 + 6 float rows, returned exactly
        assert np.array_equal(x_hat[64:], x[64:]) and np.all(scale[64:] == 0)


def test_quantize_codes_span_the_levels_and_handle_constant_groups():
    x = np.stack([np.linspace(-3, 5, 16), np.full(16, 0.1)]).astype(np.float32)  # [2, 16]
    codes, scale, zero = quantize(x, bits=4, axis=1)
    assert codes.dtype == np.uint8 and scale.dtype == zero.dtype == np.float16
    assert codes[0].min() == 0 and codes[0].max() == 15
    assert np.all(zero.astype(np.float32) <= x.min(axis=1, keepdims=True))  # zero rounded down
    deq = codes * scale.astype(np.float32) + zero.astype(np.float32)
    assert np.allclose(deq[1], 0.1, atol=1e-6)  # a constant group: no division by zero


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_inverse_and_sizes(bits):
    codes = np.random.default_rng(1).integers(0, 2 ** bits, size=(5, 3, 64)).astype(np.uint8)
    packed = pack(codes, bits)
    assert packed.shape == (5, 3, 64 * bits // 8) and packed.dtype == np.uint8
    assert np.array_equal(unpack(packed, bits), codes)
    if bits == 4:
        assert packed[0, 0, 0] == codes[0, 0, 0] | (codes[0, 0, 1] << 4)


def test_attention_error_grows_as_bits_shrink():
    x = outlier_rows(T=64, H=2, d=16, seed=3)
    q = np.random.default_rng(4).standard_normal((64, 4, 16)).astype(np.float32)
    errors = [attention_error(q, x, x[::-1].copy(), bits=b, group_size=16) for b in (8, 4, 2)]
    assert 0 < errors[0] < errors[1] < errors[2]
    assert errors[0] < 0.02


# ---------------------------------------------------------------- the cache interface
def float_and_quantized_logits(model, ids, **kw):
    exact = td.forward(model, ids, model.new_cache())
    cache = QuantizedKVCache(model.config, dtype=model.dtype, **kw)
    approx = td.forward(model, ids[:5], cache)
    approx = np.concatenate([approx, td.forward(model, ids[5:], cache)])
    return exact, approx, cache


@pytest.mark.parametrize("bits,tol", [(8, 0.02), (4, 0.3)])
def test_forward_with_quantized_cache_is_close_to_float(bits, tol):
    model = td.random_model(CFG, seed=2, scale=0.3)
    ids = np.random.default_rng(0).integers(0, CFG.vocab_size, size=40)
    exact, approx, cache = float_and_quantized_logits(model, ids, bits=bits, group_size=8)
    assert len(cache) == 40 and approx.dtype == np.float32
    diff = np.abs(exact - approx).max()
    assert 0 < diff < tol * np.abs(exact).max()


def test_forward_batch_and_generate_accept_quantized_caches():
    model = td.random_model(CFG, seed=5)
    caches = [QuantizedKVCache(CFG, 8, group_size=4) for _ in range(2)]
    out = td.forward_batch(model, [[1, 2, 3], [4, 5]], caches)
    assert [o.shape for o in out] == [(3, 40), (2, 40)] and [len(c) for c in caches] == [3, 2]
    gen = td.generate(model, [1, 2, 3], 6, cache=QuantizedKVCache(CFG, 8, group_size=4))
    ref = td.generate(model, [1, 2, 3], 6)
    assert gen.new_tokens == ref.new_tokens and len(gen.cache) == 8


def test_nbytes_counts_codes_scales_and_residual():
    cache = QuantizedKVCache(CFG, bits=4, key_axis="channel", value_axis="token", group_size=8)
    rows = outlier_rows(T=20, H=2, d=16)
    for layer in range(CFG.n_layers):
        k_all, v_all = cache.append(layer, rows, rows)
        assert k_all.shape == v_all.shape == (20, 2, 16)
    H, d, L = 2, 16, CFG.n_layers
    keys = 16 * H * d // 2 + 2 * 2 * (16 // 8) * H * d + 4 * H * d * 4  # codes, f16 scale+zero, 4 float rows
    values = 20 * H * d // 2 + 2 * 2 * 20 * H * (d // 8)
    assert cache.nbytes == L * (keys + values)


def test_int8_nbytes_is_under_30_percent_of_float32():
    cfg = td.Config(vocab_size=10, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, n_layers=3,
                    d_ff=8, max_context=512, position="rope")  # SmolLM2's KV shape, 3 layers
    rows = outlier_rows(T=100, H=3, d=64)
    ref, cache = td.KVCache(cfg), QuantizedKVCache(cfg, bits=8)
    for layer in range(cfg.n_layers):
        ref.append(layer, rows, rows)
        cache.append(layer, rows, rows)
    assert len(cache) == len(ref) == 100
    assert cache.nbytes <= 0.30 * ref.nbytes
    assert cache.nbytes > 0.25 * ref.nbytes  # codes alone are a quarter: scales are counted


@pytest.mark.parametrize("key_axis", AXES)
def test_truncate_and_copy(key_axis):
    cache = QuantizedKVCache(CFG, 4, key_axis=key_axis, value_axis="token", group_size=8)
    rows = outlier_rows(T=21, H=2, d=16)
    for layer in range(CFG.n_layers):
        cache.append(layer, rows, rows)
    before = cache.k[0].values()
    twin = cache.copy()
    with pytest.raises(ValueError, match="cannot truncate a cache of 21 positions to 30"):
        cache.truncate(30)
    cache.truncate(11)  # through a quantised per-channel group
    assert len(cache) == 11 and len(twin) == 21
    assert np.allclose(cache.k[0].values(), before[:11], atol=1e-6)
    k_all, _ = cache.append(0, rows[:3], rows[:3])
    assert k_all.shape == (14, 2, 16)
    assert np.array_equal(twin.k[0].values(), before)  # the copy did not move


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs,match", [
    (dict(bits=3), "bits must be one of"), (dict(bits=16), "bits must be one of"),
    (dict(bits=True), "bits must be one of"), (dict(bits="8"), "bits must be one of"),
    (dict(group_size=0), "group_size must be a positive integer"),
    (dict(group_size=2.5), "group_size must be a positive integer"),
    (dict(group_size=12), "must divide the head dim 16"),
    (dict(key_axis="row"), "key_axis must be 'channel'.*got 'row'"),
    (dict(value_axis=None), "value_axis must be 'channel'"),
    (dict(dtype=np.int32), "dtype must be a float type"),
])
def test_bad_arguments_get_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QuantizedKVCache(CFG, **{"group_size": 8, **kwargs})


def test_group_size_need_not_divide_head_dim_for_channel_axes():
    cache = QuantizedKVCache(CFG, 8, key_axis="channel", value_axis="channel", group_size=12)
    assert cache.group_size == 12


def test_cache_refuses_another_model():
    cache = QuantizedKVCache(CFG, 8, group_size=8)
    other = td.random_model(td.Config(**{**CFG.to_dict(), "n_layers": 3}))
    with pytest.raises(ValueError, match="made for another model"):
        td.forward(other, [1, 2], cache)
    with pytest.raises(ValueError, match="float32 but the model computes in float64"):
        td.forward(td.random_model(CFG, dtype=np.float64), [1, 2], cache)


def test_chunked_perplexity_equals_one_full_pass():
    model = td.random_model(CFG, seed=7, scale=0.5)
    ids = np.random.default_rng(3).integers(0, CFG.vocab_size, size=30)
    logits = td.forward(model, ids).astype(np.float64)
    log_p = logits - logits.max(1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
    expected = float(np.exp(-np.mean(log_p[9:-1][np.arange(20), ids[10:]])))
    assert chunked_perplexity(model, ids, prefix=10, chunk=7) == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="prefix must be in 1..29"):
        chunked_perplexity(model, ids, prefix=30)
    cache = model.new_cache()
    td.forward(model, [1], cache)
    with pytest.raises(ValueError, match="must be empty"):
        chunked_perplexity(model, ids, cache, prefix=10)


# ---------------------------------------------------------------- SmolLM2
@pytest.mark.smollm2
def test_int8_greedy_continuation_equals_float32_on_smollm2():
    model, tok = load_smollm2(), smollm2_tokenizer()
    ids = tok.encode("The capital of France is")
    ref = td.generate(model, ids, 16)
    cache = td.QuantizedKVCache(model.config, bits=8)
    gen = td.generate(model, ids, 16, cache=cache)
    assert gen.new_tokens == ref.new_tokens
    assert tok.decode(gen.new_tokens).startswith(" Paris")
    assert len(cache) == len(ref.cache) == 20
    more = tok.encode(" The capital of Italy is Rome, of Spain Madrid, of Germany Berlin.") * 8
    td.forward(model, more[:80], ref.cache)  # both caches at 100 positions
    td.forward(model, more[:80], cache)
    assert len(cache) == len(ref.cache) == 100
    assert cache.nbytes <= 0.30 * ref.cache.nbytes  # 4 key rows still in the float residual


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_bytes_per_token_formula_matches_a_full_cache(bits):
    cache = QuantizedKVCache(CFG, bits, group_size=8)
    rows = outlier_rows(T=24, H=2, d=16)  # three full groups of 8 positions
    for layer in range(CFG.n_layers):
        cache.append(layer, rows, rows)
    assert cache.nbytes / 24 == quantized_bytes_per_token(CFG, bits, group_size=8)
    assert quantized_bytes_per_token(td.Config(vocab_size=10, d_model=576, n_heads=9, n_kv_heads=3,
                                               head_dim=64, n_layers=30, d_ff=8, max_context=64,
                                               position="rope"), 8) == 12960  # SmolLM2, int8
