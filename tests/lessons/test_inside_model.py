"""The library functions the new exercises are judged against, and the helpers that run a
learner's function inside a model (lessons/inside_model.py): each equals the library's own path."""
import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

import tinydecoder as td
from tinydecoder.algorithms.moe import Expert, MoELayer, moe_forward
from tinydecoder.algorithms.paged_attention import paged_attention, paged_decode_attention
from tinydecoder.algorithms.tensor_parallel import all_reduce_sum, tensor_parallel_swiglu, unit_slices
from tinydecoder.core import ops, reference
from tinydecoder.core.residual import pre_norm_block
from tinydecoder.core.toy import random_model, toy_model
from tinydecoder.decoding.cached_loop import cached_greedy, model_step
from tinydecoder.decoding.grammar import Regex, apply_token_bitmask, bitmask_words
from tinydecoder.lessons import inside_model
from tinydecoder.lessons.moefication import MoEfied
from tinydecoder.serving.chunked import chunk_mask


@pytest.fixture(scope="module")
def rope_model():
    cfg = td.Config(vocab_size=32, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, n_layers=2, d_ff=24,
                    max_context=64, position="rope", rope_base=100.0)
    return random_model(cfg, seed=3, dtype=np.float64)


IDS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]


def test_pre_norm_block_drives_the_model_to_the_library_logits(rope_model):
    for model, ids in ((rope_model, IDS), (toy_model(), [0, 1, 2, 3, 5, 4])):
        got = inside_model.logits_with_block(model, ids, pre_norm_block)
        np.testing.assert_allclose(got, reference.forward(model, ids), rtol=1e-12, atol=1e-12)
    post = lambda x, n1, a, n2, m: n2(n1(x + a(x)) + m(n1(x + a(x))))  # noqa: E731
    assert not np.allclose(inside_model.logits_with_block(rope_model, IDS[:6], post), reference.forward(rope_model, IDS[:6]))


def test_cached_greedy_equals_generate_and_rejects_bad_input(rope_model):
    for model, prompt in ((rope_model, IDS[:5]), (toy_model(), [0, 1, 2, 3])):
        step = model_step(model)
        assert cached_greedy(step, prompt, 6) == td.generate(model, prompt, 6).new_tokens
        assert len(step.cache) == len(prompt) + 5  # the last token is not fed
    with pytest.raises(ValueError, match="max_new_tokens"):
        cached_greedy(model_step(rope_model), [1], 0)
    with pytest.raises(ValueError, match="at least one token"):
        cached_greedy(model_step(rope_model), [], 2)


def test_paged_decode_attention_is_the_last_row_of_paged_attention():
    rng = np.random.default_rng(0)
    pool_k, pool_v = rng.standard_normal((2, 7, 4, 2, 8))
    q, table = rng.standard_normal((4, 8)), [5, 0, 3]
    np.testing.assert_array_equal(paged_decode_attention(q, pool_k, pool_v, table, 10),
                                  paged_attention(q[None], pool_k, pool_v, table, 10)[0])
    with pytest.raises(ValueError, match="one query"):
        paged_decode_attention(q[None], pool_k, pool_v, table, 10)


def test_paged_kernels_give_the_library_logits(rope_model):
    kernels = inside_model.paged_kernels(paged_decode_attention, block_size=3)
    np.testing.assert_allclose(reference.forward(rope_model, IDS, kernels=kernels), reference.forward(rope_model, IDS),
                               rtol=1e-10, atol=1e-12)
    assert td.generate(rope_model, IDS[:4], 5, kernels=kernels).new_tokens == td.generate(rope_model, IDS[:4], 5).new_tokens


def test_chunk_mask_is_the_causal_mask_of_the_chunk():
    np.testing.assert_array_equal(chunk_mask(4, 3), ops.causal_mask(3, 7))
    assert (chunk_mask(4, 3)[:, :4] == 0).all() and chunk_mask(4, 3)[0, 5] == -np.inf
    with pytest.raises(ValueError, match="n_tokens must be an integer >= 1"):
        chunk_mask(2, 0)


def test_chunked_prefill_with_a_mask_function_equals_one_shot(rope_model):
    one_shot = reference.forward(rope_model, IDS)
    for size in (1, 3, 4, 11):
        got = inside_model.prefill_in_chunks(rope_model, IDS, size, inside_model.masked_kernels(chunk_mask))
        np.testing.assert_allclose(got, one_shot, rtol=1e-10, atol=1e-12)
    def relative(start, n):  # query i of the chunk compared with key j as if it sat at position i
        return np.where(np.arange(start + n)[None, :] <= np.arange(n)[:, None], 0.0, -np.inf)

    wrong = inside_model.prefill_in_chunks(rope_model, IDS, 4, inside_model.masked_kernels(relative))
    assert np.allclose(wrong[:4], one_shot[:4]) and not np.allclose(wrong[4:], one_shot[4:])


def test_tensor_parallel_swiglu_equals_the_dense_ffn(rope_model):
    rng = np.random.default_rng(1)
    x, wg, wu = rng.standard_normal((3, 6)), rng.standard_normal((6, 12)), rng.standard_normal((6, 12))
    wd, b = rng.standard_normal((12, 6)), rng.standard_normal(6)
    for n in (1, 2, 3, 4, 6, 12):
        np.testing.assert_allclose(tensor_parallel_swiglu(x, wg, wu, wd, b, n), ops.swiglu(x, wg, wu) @ wd + b, rtol=1e-12)
    assert [s.start for s in unit_slices(12, 3)] == [0, 4, 8]
    with pytest.raises(ValueError, match="divides the 12 hidden units"):
        tensor_parallel_swiglu(x, wg, wu, wd, b, 5)
    with pytest.raises(ValueError, match="one shape"):
        all_reduce_sum([np.zeros(2), np.zeros(3)])
    ffn = inside_model.tensor_parallel_ffn(tensor_parallel_swiglu, 3)
    np.testing.assert_allclose(reference.forward(rope_model, IDS, ffn=ffn), reference.forward(rope_model, IDS), rtol=1e-10)


def test_moe_forward_equals_the_layer_and_moe_ffn_uses_it(rope_model):
    rng = np.random.default_rng(2)
    experts = [Expert(*(rng.standard_normal(s) * 0.3 for s in ((16, 6), (16, 6), (6, 16)))) for _ in range(4)]
    W, x = rng.standard_normal((16, 4)), rng.standard_normal((5, 16))
    np.testing.assert_allclose(moe_forward(x, x @ W, experts, 2), MoELayer(W, experts, k=2)(x).y, rtol=1e-12)
    moefied = MoEfied(4, [None] * 2, [experts, experts], [(W, np.zeros(4)), (W, np.ones(4))])
    lib = reference.forward(rope_model, IDS, ffn=inside_model.moe_ffn(moe_forward, moefied, 2))

    def by_layer(l, layer, z):
        Wl, bl = moefied.routers[l]
        return MoELayer(Wl, experts, k=2, b_router=bl)(z).y

    np.testing.assert_allclose(lib, reference.forward(rope_model, IDS, ffn=by_layer), rtol=1e-12)


@pytest.fixture(scope="module")
def tiny():
    vocab = {"<eos>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "ba": 5}
    hf = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("b", "a")], fuse_unk=False, byte_fallback=False))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken("<eos>", special=True, normalized=False)])
    return hf


def test_apply_token_bitmask_by_hand():
    logits = np.arange(40.0)
    words = np.array([np.uint32(1 | 1 << 31).view(np.int32), 1 << 3], dtype=np.int32)
    out = apply_token_bitmask(logits, words, eos_id=39, accepting=False)
    assert np.flatnonzero(np.isfinite(out)).tolist() == [0, 31, 35] and out[31] == 31.0
    assert np.isfinite(apply_token_bitmask(logits, words, 39, True)[39])
    with pytest.raises(ValueError, match="bitmask words"):
        apply_token_bitmask(np.zeros(70), np.zeros(2, np.int32), 0, True)


def test_bitmask_processor_equals_the_grammar_processor(tiny):
    grammar = Regex("(ab)+c", tiny, end_tokens=[0])
    mine = inside_model.BitmaskGrammar(Regex("(ab)+c", tiny, end_tokens=[0]), apply_token_bitmask)
    logits = np.random.default_rng(3).standard_normal(6)
    for tokens in ([1], [1, 4], [1, 4, 4], [1, 4, 4, 3]):
        grammar.start(tokens[:1]), mine.start(tokens[:1])
        np.testing.assert_array_equal(mine(tokens, logits), grammar(tokens, logits))
        state = grammar.state(tokens)
        assert bool(np.isfinite(mine(tokens, logits))[0]) == bool(state.is_accepting())
        assert len(bitmask_words(state)) == 1
