"""Lesson helpers of notebooks 12, 13 and 15: flash_lab's FLOP count, kv_lab's paired noise
estimate, speculative_lab's sentences and its rounding-versus-margin measurement."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.decoding.speculative import speculative_generate
from tinydecoder.lessons import flash_lab, kv_lab, speculative_lab


def test_flash_matmul_flops_counts_the_tiles_it_computes():
    # no causal skip when the queries come after every key: all S x T scores, 4 FLOPs x d each
    assert flash_lab.flash_matmul_flops(1, 100, 9, 64, block_size=16) == 4 * 100 * 9 * 64
    # prefill S = T = 4, blocks of 2: block 1 sees keys 0..1, block 2 keys 0..3 -> 2*2 + 2*4 scores
    assert flash_lab.flash_matmul_flops(4, 4, 1, 1, block_size=2) == 4 * (2 * 2 + 2 * 4)
    # compute stays quadratic: doubling a prefill quadruples the count (up to the diagonal tiles)
    a, b = (flash_lab.flash_matmul_flops(n, n, 9, 64) for n in (1024, 2048))
    assert 3.8 < b / a < 4.0
    with pytest.raises(ValueError, match="last S of only T"):
        flash_lab.flash_matmul_flops(5, 4, 1, 1)


def test_chunked_log_probs_and_paired_difference():
    cfg = td.Config(vocab_size=40, d_model=32, n_heads=4, n_kv_heads=2, head_dim=16, n_layers=2, d_ff=48,
                    max_context=64, position="rope")
    model = td.random_model(cfg, seed=7, scale=0.5)
    ids = np.random.default_rng(3).integers(0, 40, size=30)
    lp = kv_lab.chunked_log_probs(model, ids, prefix=10, chunk=7)
    assert lp.shape == (20,) and lp.dtype == np.float64 and np.all(lp < 0)
    assert kv_lab.chunked_perplexity(model, ids, prefix=10, chunk=7) == pytest.approx(np.exp(-lp.mean()))
    change, se = kv_lab.paired_difference(lp - 0.1, lp)  # 0.1 nats worse at every token: no spread
    assert change == pytest.approx(0.1) and se == pytest.approx(0.0, abs=1e-12)
    noisy = lp + np.random.default_rng(0).normal(0, 1, 20)
    change, se = kv_lab.paired_difference(noisy, lp)
    assert se == pytest.approx(np.std(noisy - lp, ddof=1) / np.sqrt(20))
    with pytest.raises(ValueError, match="same length"):
        kv_lab.paired_difference(lp, lp[:5])
    with pytest.raises(ValueError, match="chunk must be"):
        kv_lab.chunked_log_probs(model, ids, prefix=10, chunk=0)


def test_verdict_bands():
    assert kv_lab.verdict(0.01, 0.01) == "noise"
    assert kv_lab.verdict(0.03, 0.01) == "unclear"
    assert kv_lab.verdict(0.05, 0.01) == "worse" and kv_lab.verdict(-0.05, 0.01) == "better"
    with pytest.raises(ValueError):
        kv_lab.verdict(0.1, -1)


def test_explain_pass_cost_follows_the_measurement():
    slow = speculative_lab.explain_pass_cost({1: 0.02, 3: 0.054, 17: 0.06})
    assert "3 rows 2.70x" in slow and "17 rows 3.00x" in slow and "above the roofline" in slow
    assert "a pass over 17 rows cost 3.0 steps, less than 17 separate steps" in slow
    fast = speculative_lab.explain_pass_cost({1: 0.02, 3: 0.022, 4: 0.025, 16: 0.07})
    assert "up to 4 rows at most 1.25 steps, close to the roofline" in fast and "16 rows cost 3.5 steps" in fast
    with pytest.raises(ValueError, match="pass_s must be"):
        speculative_lab.explain_pass_cost({3: 0.1})


def test_explain_speedup_words():
    assert "slower than" in speculative_lab.explain_speedup("free", 0.89, 0.67, 1.0)
    line = speculative_lab.explain_speedup("code", 0.73, 0.87, 2.64)
    assert "1.19x, faster than" in line and "less than its 2.64 tokens per pass" in line
    assert "took 2.22x a plain decode step" in line  # 2.64 / (0.87 / 0.73): the reason follows the numbers
    same = speculative_lab.explain_speedup("x", 1.0, 1.0, 1.0)
    assert "as fast as" in same and "about one plain decode step" in same and "took" in same
    cheap = speculative_lab.explain_speedup("y", 0.5, 1.0, 1.6)  # 2.0x from 1.6 tokens per pass
    assert "more than its 1.60 tokens per pass" in cheap and "only 0.80x" in cheap


@pytest.fixture(scope="module")
def rope_model():
    cfg = td.Config(vocab_size=11, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, n_layers=3, d_ff=32,
                    max_context=128, position="rope", tied_embeddings=True)
    return td.random_model(cfg, seed=1, dtype=np.float32, scale=0.5)


def test_greedy_rounding_and_identity(rope_model):
    """Greedy speculative output equals generate's where the best two logits are further apart
    than the rounding difference of a many-row pass; the difference is small but need not be 0."""
    prompt = [1, 2, 3, 1, 2]
    plain = td.generate(rope_model, prompt, 30)
    r = speculative_lab.greedy_rounding(rope_model, plain.tokens, len(prompt), rows=5)
    assert r["positions"] == 30 and r["max_difference"] < 1e-4
    assert r["same_argmax"] and r["min_margin"] > 2 * r["max_difference"]
    spec = speculative_generate(rope_model, prompt, 30, "prompt-lookup", draft_tokens=4)
    assert spec.tokens == plain.tokens
    rows = speculative_lab.dots_vs_curve({"lookup": spec})
    assert rows and rows[0][2] == 4 and rows[0][5] in ("above", "below", "on")
    with pytest.raises(ValueError, match="rows must be"):
        speculative_lab.greedy_rounding(rope_model, plain.tokens, 5, rows=1)
