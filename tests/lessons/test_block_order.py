"""Lesson helpers of the course's first notebooks: the walk-through's post-norm block (notebook 03)."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.lessons.block_order import walkthrough_block, walkthrough_logits


@pytest.fixture(scope="module")
def toy():
    model = td.toy_model()
    x = model.embed[td.SEED_PROMPT] + model.pos_table[:len(td.SEED_PROMPT)]  # [S, D]
    return model, x


def test_seed_block_is_layernorm_of_attention_plus_ffn(toy):
    model, x = toy
    cfg, lw = model.config, model.layers[0]
    S, d = x.shape[0], cfg.head_dim
    attn = td.attention((x @ lw.wq).reshape(S, cfg.n_heads, d), (x @ lw.wk).reshape(S, cfg.n_kv_heads, d),
                        (x @ lw.wv).reshape(S, cfg.n_kv_heads, d))
    ffn = td.silu(attn @ lw.w_gate) * (attn @ lw.w_up) @ lw.w_down
    expected = td.rmsnorm(attn + ffn, None, cfg.norm_eps)
    out = walkthrough_block(lw, x, cfg)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.sqrt((out ** 2).mean(axis=1)), 1.0, atol=2e-3)  # normalised after (eps: not exactly 1)


def test_seed_block_differs_from_pre_norm_block(toy):
    model, x = toy
    S = x.shape[0]
    pre = td.decoder_block(model.layers[0], x, np.arange(S), model.new_cache(S).layer(0))
    seed = walkthrough_block(model.layers[0], x, model.config)
    assert np.abs(pre - seed).max() > 0.1
    seed_logits = walkthrough_logits(model, td.SEED_PROMPT)
    assert seed_logits.shape == (S, model.config.vocab_size)
    assert np.abs(seed_logits - td.forward(model, td.SEED_PROMPT)).max() > 0.1


def test_seed_block_errors_name_the_problem(toy):
    model, x = toy
    with pytest.raises(ValueError, match=r"shape \[S, 8\]"):
        walkthrough_block(model.layers[0], x[:, :4], model.config)
    rope_cfg = td.Config(vocab_size=13, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, n_layers=1, d_ff=24,
                         max_context=16, position="rope", rope_base=100.0)
    rope_model = td.random_model(rope_cfg, seed=0)
    with pytest.raises(ValueError, match="position table"):
        walkthrough_logits(rope_model, [1, 2])
    narrow = td.Config(vocab_size=13, d_model=16, n_heads=2, n_kv_heads=1, head_dim=4, n_layers=1, d_ff=24,
                       max_context=16)
    with pytest.raises(ValueError, match="n_heads \\* head_dim == d_model"):
        walkthrough_logits(td.random_model(narrow, seed=0), [1, 2])
