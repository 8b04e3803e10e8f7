"""Kernels: a learner's softmax, attention or RoPE runs inside the reference forward pass, as an
argument (not a patch), and gives the library's numbers when it is right, other numbers when not."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.core.toy import random_model

CFG = td.Config(vocab_size=40, d_model=24, n_heads=6, n_kv_heads=2, head_dim=8, n_layers=2, d_ff=32,
                max_context=64, position="rope", rope_base=10000.0, norm_eps=1e-5, tied_embeddings=True)


def gqa_attention(q, k, v):
    """A learner's grouped-query attention, written from the definition, head by head."""
    Tq, Hq, d = q.shape
    Tk, Hkv, _ = k.shape
    out = np.empty_like(q)
    for h in range(Hq):
        kv = h // (Hq // Hkv)
        scores = q[:, h] @ k[:, kv].T / np.sqrt(d)  # [Tq, Tk]
        scores[np.arange(Tk)[None, :] > np.arange(Tk - Tq, Tk)[:, None]] = -np.inf
        w = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, h] = w / w.sum(axis=1, keepdims=True) @ v[:, kv]
    return out


def rope_rotate_half(x, positions, base=10000.0):
    d = x.shape[-1]
    angles = np.asarray(positions, dtype=np.float64)[:, None] * base ** (-np.arange(0, d, 2) / d)  # [T, d/2]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, seed=3, dtype=np.float64)


def test_right_kernels_give_the_library_numbers(model):
    ids = [1, 5, 7, 2, 9, 11]
    want = td.forward(model, ids)
    for kernels in (td.Kernels(attention=gqa_attention), td.Kernels(rope=rope_rotate_half),
                    td.Kernels(softmax=lambda x: np.exp(x - x.max(-1, keepdims=True)) /
                               np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))):
        np.testing.assert_allclose(td.forward(model, ids, kernels=kernels), want, rtol=0, atol=1e-12)
    mine = td.generate(model, ids, 6, kernels=td.Kernels(attention=gqa_attention, rope=rope_rotate_half))
    assert mine.tokens == td.generate(model, ids, 6).tokens


def test_a_kernel_with_a_classic_mistake_changes_the_output(model):
    ids = [1, 5, 7, 2, 9, 11]
    want = td.forward(model, ids)

    def no_mask(q, k, v):  # every query sees the future
        Tq, Hq, d = q.shape
        g = Hq // k.shape[1]
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
        w = np.exp(s - s.max(-1, keepdims=True))
        return np.einsum("hqk,khd->qhd", w / w.sum(-1, keepdims=True), v)

    assert np.abs(td.forward(model, ids, kernels=td.Kernels(attention=no_mask)) - want).max() > 1e-3
    # decode steps are one query: no future to hide, so a missing mask is invisible there
    cache, mine = model.new_cache(), model.new_cache()
    td.forward(model, ids, cache)
    td.forward(model, ids, mine)
    np.testing.assert_allclose(td.forward(model, [3], mine, kernels=td.Kernels(attention=no_mask)),
                               td.forward(model, [3], cache), rtol=0, atol=1e-12)


def test_kernels_refuse_an_interleaved_model():
    cfg = td.Config(**{**CFG.to_dict(), "rope_layout": "interleaved"})
    with pytest.raises(ValueError, match="Kernels.rope implements the 'halves'"):
        td.forward(random_model(cfg, seed=1, dtype=np.float64), [1, 2], kernels=td.Kernels(rope=rope_rotate_half))


@pytest.mark.smollm2
def test_smollm2_runs_a_learners_attention(smollm2):
    from tinydecoder.checkpoint.smollm2 import smollm2_tokenizer

    ids = smollm2_tokenizer().encode("The capital of France is")
    mine = td.generate(smollm2, ids, 2, kernels=td.Kernels(attention=gqa_attention, rope=rope_rotate_half))
    assert mine.tokens == td.generate(smollm2, ids, 2).tokens
    assert smollm2_tokenizer().decode(mine.new_tokens[:1]) == " Paris"
