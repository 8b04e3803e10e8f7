"""The bug clinic (tinydecoder.lessons.bugs): every deliberately broken loop is caught by its check."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.lessons import bugs


@pytest.fixture(scope="module")
def toy():
    return td.toy_model()


@pytest.fixture(scope="module")
def gqa_model():
    """Hkv > 1, so that a wrong head mapping reads the wrong KV head."""
    cfg = td.Config(vocab_size=16, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, n_layers=2, d_ff=32,
                    max_context=32, position="rope", rope_base=100.0)
    return td.random_model(cfg, seed=3, dtype=np.float64)


def test_forward_with_defaults_is_the_library_forward(toy, gqa_model):
    for model, prompt in ((toy, [0, 1, 2, 3]), (gqa_model, [3, 9, 1, 4, 4])):
        cache = model.new_cache()
        got = bugs.forward_with(model, prompt[:3], cache)
        np.testing.assert_allclose(got, td.forward(model, prompt[:3]), atol=1e-14)
        got = bugs.forward_with(model, prompt[3:], cache)
        np.testing.assert_allclose(got, td.forward(model, prompt)[3:], atol=1e-14)


def test_attention_variants():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 4, 2))
    k, v = rng.standard_normal((2, 3, 2, 2))
    # without mask, query 0 attends to all 3 keys: same as the last query alone over all keys
    unmasked = bugs.attention_without_mask(q, k, v)
    np.testing.assert_allclose(unmasked[2], td.attention(q, k, v)[2], atol=1e-15)  # the last row sees all anyway
    assert np.max(np.abs(unmasked[0] - td.attention(q, k, v)[0])) > 1e-3
    # the mod mapping swaps heads 1 and 2 of 4 (0 0 1 1 -> 0 1 0 1)
    wrong = bugs.attention_mod_head_map(q, k, v).reshape(3, 4, 2)
    right = td.attention(q, k, v).reshape(3, 4, 2)
    np.testing.assert_allclose(wrong[:, [0, 3]], right[:, [0, 3]], atol=1e-15)
    assert np.max(np.abs(wrong[:, 1:3] - right[:, 1:3])) > 1e-3


def test_the_correct_loop_passes(toy, gqa_model):
    for model in (toy, gqa_model):
        result = bugs.diagnose(model, [0, 1, 2, 3], 4, "none")
        assert not result["caught"] and result["max_diff"] < 1e-12 and result["caught_by"] == []
        assert result["tokens"] == td.generate(model, [0, 1, 2, 3], 4).new_tokens
    assert bugs.diagnose(toy, td.SEED_PROMPT, 4, "none")["tokens"] == td.SEED_CONTINUATION


@pytest.mark.parametrize("bug", ["position_offset", "no_causal_mask", "whole_sequence_every_step",
                                 "last_prompt_token"])
def test_each_bug_changes_the_logits(toy, gqa_model, bug):
    for model in (toy, gqa_model):
        result = bugs.diagnose(model, td.SEED_PROMPT, 4, bug)
        assert result["caught"] and result["error"] is None
        assert result["max_diff"] > 1e-3


def test_gqa_mapping_bug_hides_on_the_toy_and_shows_with_two_kv_heads(toy, gqa_model):
    hidden = bugs.diagnose(toy, td.SEED_PROMPT, 4, "gqa_head_mapping")  # Hkv = 1: h % 1 == h // 2
    assert not hidden["caught"] and hidden["max_diff"] < 1e-12
    shown = bugs.diagnose(gqa_model, td.SEED_PROMPT, 4, "gqa_head_mapping")
    assert shown["caught"] and shown["max_diff"] > 1e-3


def test_truncated_layer_cache_raises_the_library_error(toy):
    result = bugs.diagnose(toy, td.SEED_PROMPT, 4, "truncated_layer_cache")
    assert result["caught"] and result["tokens"] == [3]
    assert "per-layer lengths [4, 3] differ" in result["error"]
    assert result["caught_by"] == ["error"]


def test_whole_sequence_every_step_grows_the_cache_too_fast(toy):
    result = bugs.diagnose(toy, td.SEED_PROMPT, 3, "whole_sequence_every_step")
    assert result["cache_lengths"] == [4, 9, 15] and result["expected_lengths"] == [4, 5, 6]
    assert result["caught_by"] == ["logits", "cache length"]


def test_last_prompt_token_bug_hides_while_the_chosen_token_equals_it(toy):
    """On the seed prompt the first chosen token is 3, the last prompt token: round 2 is right
    by luck, round 3 is wrong."""
    result = bugs.diagnose(toy, td.SEED_PROMPT, 4, "last_prompt_token")
    assert result["diffs"][0] < 1e-12 and result["diffs"][1] < 1e-12 and result["diffs"][2] > 1e-3


def test_bad_arguments(toy):
    with pytest.raises(ValueError, match="unknown bug 'typo'; choose one of"):
        bugs.run_with_bug(toy, [0], 1, "typo")
    with pytest.raises(ValueError, match="max_new_tokens"):
        bugs.run_with_bug(toy, [0], 0)


def test_seed003_decode_fed_the_last_hidden_state():
    """the walk-through starts the decode step from the prefill's last hidden state: the logits differ
    from a full recompute, while the right step (the chosen token's embedding) matches it."""
    model = td.toy_model()
    step = bugs.decode_fed_hidden_state(model, td.SEED_PROMPT)
    assert step["chosen"] == td.generate(model, td.SEED_PROMPT, 1).new_tokens[0]
    np.testing.assert_allclose(step["right"], step["full"], rtol=0, atol=1e-12)
    assert np.max(np.abs(step["seed"] - step["full"])) > 1e-2
    assert step["right_input"].shape == step["seed_input"].shape == (1, model.config.d_model)
