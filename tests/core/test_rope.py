"""RoPE: rotations of pairs, scores that depend only on distance, the two layouts, and the cache."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinydecoder import Config, apply_rope, forward, random_model, rmsnorm, rope_angles
from tinydecoder.lessons.rope_lab import (
    ROPE_BUGS,
    RotateAgainCache,
    cached_decode,
    decode_differences,
    forward_at_positions,
    layout_permutation,
    pair_view,
    permute_head_columns,
    recompute_logits,
    rope_pairs,
    rope_score,
    rotate_vector,
    score_grid,
    with_layout,
)

LAYOUTS = ("halves", "interleaved")


def rope_config(layout="halves", **kw):
    base = dict(vocab_size=13, d_model=16, n_heads=4, n_kv_heads=2, head_dim=8, n_layers=2, d_ff=24,
                max_context=64, position="rope", rope_base=100.0, rope_layout=layout, norm_scale=True,
                tied_embeddings=False, name="rope-test")
    base.update(kw)
    return Config(**base)


vectors = st.integers(0, 2**32 - 1).map(lambda s: np.random.default_rng(s))
head_dims = st.sampled_from([2, 4, 8, 16, 64])


@settings(max_examples=200, deadline=None)
@given(rng=vectors, d=head_dims, layout=st.sampled_from(LAYOUTS), base=st.sampled_from([10.0, 1e4, 1e5]),
       m=st.integers(0, 4000), n=st.integers(0, 4000), shift=st.integers(-4000, 4000))
def test_score_depends_only_on_distance(rng, d, layout, base, m, n, shift):
    shift = max(shift, -min(m, n))  # keep positions >= 0
    q, k = rng.standard_normal(d), rng.standard_normal(d)
    here = rope_score(q, k, m, n, base, layout)
    there = rope_score(q, k, m + shift, n + shift, base, layout)
    assert there == pytest.approx(here, abs=1e-9 * (1 + np.abs(q) @ np.abs(k)))


def test_score_is_not_shift_invariant_without_equal_shifts():
    """The property is not vacuous: moving only the key changes the score."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal(8), rng.standard_normal(8)
    assert abs(rope_score(q, k, 5, 3, 100.0) - rope_score(q, k, 5, 4, 100.0)) > 1e-3


@settings(max_examples=100, deadline=None)
@given(rng=vectors, d=head_dims, layout=st.sampled_from(LAYOUTS),
       positions=st.lists(st.integers(0, 10**5), min_size=1, max_size=6))
def test_rotation_preserves_norms(rng, d, layout, positions):
    x = rng.standard_normal((len(positions), 3, d))  # [S, H, d]
    y = apply_rope(x, np.array(positions), 10000.0, layout)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)
    pairs = rope_pairs(d, layout)  # every pair keeps its own length: a rotation in its own plane
    np.testing.assert_allclose(np.hypot(y[..., pairs[:, 0]], y[..., pairs[:, 1]]),
                               np.hypot(x[..., pairs[:, 0]], x[..., pairs[:, 1]]), rtol=1e-12, atol=1e-12)


def test_position_zero_is_identity_and_rotations_compose():
    x = np.random.default_rng(1).standard_normal((1, 2, 8))
    for layout in LAYOUTS:
        np.testing.assert_array_equal(apply_rope(x, [0], 100.0, layout), x)
        twice = apply_rope(apply_rope(x, [3], 100.0, layout), [5], 100.0, layout)
        np.testing.assert_allclose(twice, apply_rope(x, [8], 100.0, layout), atol=1e-12)


def test_pair_zero_turns_by_the_position_in_radians():
    """theta_0 = base^0 = 1: pair 0 turns by exactly `pos` radians; the last pair the slowest."""
    cos, sin = rope_angles([2], 8, 100.0)
    assert cos[0, 0] == pytest.approx(np.cos(2.0)) and sin[0, 0] == pytest.approx(np.sin(2.0))
    assert np.arctan2(sin[0, -1], cos[0, -1]) == pytest.approx(2 * 100.0 ** (-6 / 8))
    v = np.zeros(8)
    v[0] = 1.0  # the first coordinate of pair 0 in both layouts
    assert rotate_vector(v, 2, 100.0, "halves")[[0, 4]] == pytest.approx([np.cos(2), np.sin(2)])
    assert rotate_vector(v, 2, 100.0, "interleaved")[[0, 1]] == pytest.approx([np.cos(2), np.sin(2)])


@settings(max_examples=60, deadline=None)
@given(rng=vectors, d=head_dims, positions=st.lists(st.integers(0, 3000), min_size=1, max_size=5))
def test_layouts_are_one_rotation_up_to_a_permutation(rng, d, positions):
    perm = layout_permutation(d)
    x = rng.standard_normal((len(positions), 2, d))  # laid out for "halves"
    halves = apply_rope(x, np.array(positions), 1e4, "halves")
    interleaved = apply_rope(x[..., perm], np.array(positions), 1e4, "interleaved")
    np.testing.assert_allclose(interleaved, halves[..., perm], atol=1e-12)
    assert sorted(perm.tolist()) == list(range(d))
    if d > 2 and any(positions):  # and mixing the layouts is not the same rotation
        assert not np.allclose(apply_rope(x, np.array(positions), 1e4, "interleaved"), halves)


def test_layout_permutation_is_the_gguf_one():
    """SMOLLM2.md: undoing llama.cpp's Q/K row permutation per head is
    w.reshape(h, d/2, 2, in).swapaxes(1, 2).reshape(w.shape); it must invert our permutation."""
    h, d, n_in = 3, 8, 5
    w_hf = np.random.default_rng(2).standard_normal((h * d, n_in))  # rows = outputs (GGUF/HF orientation)
    w_gguf = permute_head_columns(w_hf.T, h, d, layout_permutation(d)).T  # our permutation, on rows
    undone = w_gguf.reshape(h, d // 2, 2, n_in).swapaxes(1, 2).reshape(w_gguf.shape)
    np.testing.assert_array_equal(undone, w_hf)
    assert layout_permutation(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert rope_pairs(8, "interleaved").tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_checkpoint_picks_its_layout_through_its_qk_weights(layout):
    model = random_model(rope_config(layout), seed=3, dtype=np.float64)
    other = "interleaved" if layout == "halves" else "halves"
    converted = with_layout(model, other)
    assert converted.config.rope_layout == other
    ids = [1, 5, 2, 9, 0, 12, 3]
    np.testing.assert_allclose(forward(converted, ids), forward(model, ids), atol=1e-12)
    np.testing.assert_allclose(forward(with_layout(converted, layout), ids), forward(model, ids), atol=0)
    assert with_layout(model, layout) is model
    # the same weights run with the other layout: a different network
    mixed = dataclasses.replace(model, config=dataclasses.replace(model.config, rope_layout=other))
    assert np.max(np.abs(forward(mixed, ids) - forward(model, ids))) > 1e-3  # ... wrong layout: other logits


def test_scores_grid_is_constant_along_diagonals():
    rng = np.random.default_rng(4)
    grid = score_grid(rng.standard_normal(16), rng.standard_normal(16), 12, 100.0, "interleaved")
    for offset in range(-11, 12):
        diag = np.diagonal(grid, offset)
        np.testing.assert_allclose(diag, diag[0], atol=1e-12)
    assert np.ptp(grid[0]) > 0.1  # but varies with distance


def test_pair_view_data():
    q, k = np.arange(1.0, 9.0), np.linspace(-1, 1, 8)
    a = pair_view(q, k, 7, 3, 100.0, "halves")
    b = pair_view(q, k, 17, 13, 100.0, "halves")
    assert a["distance"] == b["distance"] == 4
    assert a["score"] == pytest.approx(b["score"], abs=1e-12)
    assert a["score"] == pytest.approx(a["score_shifted_to_zero"], abs=1e-12)
    assert a["pair_scores"].sum() == pytest.approx(a["score"], abs=1e-12)
    assert a["q"].tolist() == [[1, 5], [2, 6], [3, 7], [4, 8]]
    np.testing.assert_allclose(np.linalg.norm(a["q_rot"], axis=1), np.linalg.norm(a["q"], axis=1))
    assert a["angle_q"][0] == pytest.approx(7 - 2 * np.pi)  # pair 0 turns 7 rad, shown wrapped
    assert not np.allclose(a["q_rot"], b["q_rot"])  # the vectors moved, the score did not
    with pytest.raises(ValueError, match="pos_q must be an integer position >= 0"):
        pair_view(q, k, -1, 0)
    with pytest.raises(ValueError, match="one length"):
        pair_view(q, k[:4], 0, 0)


def test_bad_layout_and_head_dim():
    with pytest.raises(ValueError, match="layout must be one of"):
        rope_pairs(8, "pairs")
    with pytest.raises(ValueError, match="head_dim must be an even integer"):
        layout_permutation(7)
    with pytest.raises(ValueError, match="only RoPE models"):
        with_layout(random_model(rope_config(position="table")), "halves")


# --- the cache -----------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_cache_stores_k_after_rotation_at_absolute_positions(layout):
    """Layer 0's K of a token depends only on that token and its position:
    k = rope(rmsnorm(embed[t]) @ Wk, pos). The cache must hold exactly that, for the prompt
    (positions 0..4), a decode step (position 5) and a chunk of two (positions 6, 7)."""
    cfg = rope_config(layout)
    model = random_model(cfg, seed=5, dtype=np.float64)
    layer = model.layers[0]
    cache = model.new_cache()
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    forward(model, tokens[:5], cache)
    forward(model, tokens[5:6], cache)
    forward(model, tokens[6:], cache)
    h = rmsnorm(model.embed[tokens], layer.attn_norm, cfg.norm_eps)  # [8, D]
    k = (h @ layer.wk).reshape(8, cfg.n_kv_heads, cfg.head_dim)
    want = apply_rope(k, np.arange(8), cfg.rope_base, layout)
    np.testing.assert_allclose(cache.k[0][:8], want, atol=1e-12)
    assert not np.allclose(cache.k[0][1:8], k[1:8])  # not the unrotated K
    np.testing.assert_allclose(cache.v[0][:8], (h @ layer.wv).reshape(8, cfg.n_kv_heads, cfg.head_dim), atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 2e-5)])
def test_cached_decode_equals_full_recompute(layout, dtype, tol):
    model = random_model(rope_config(layout), seed=6, dtype=dtype)
    prompt, continuation = [1, 7, 3, 3, 0], [12, 4, 4, 8, 2, 11]
    diffs = decode_differences(model, prompt, continuation)
    assert len(diffs) == 1 + len(continuation)
    assert max(diffs) < tol


def test_forward_at_positions_matches_forward_when_positions_are_right():
    model = random_model(rope_config(), seed=7, dtype=np.float64)
    a, b = model.new_cache(), model.new_cache()
    np.testing.assert_allclose(forward_at_positions(model, [1, 2, 3], a, [0, 1, 2]), forward(model, [1, 2, 3], b), atol=0)
    np.testing.assert_allclose(forward_at_positions(model, [4], a, [3]), forward(model, [4], b), atol=0)
    with pytest.raises(ValueError, match="1 tokens but 2 positions"):
        forward_at_positions(model, [4], a, [4, 5])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bug", ["new_token_at_zero", "rotate_cached_twice"])
def test_rope_bugs_are_caught(layout, bug):
    model = random_model(rope_config(layout), seed=8, dtype=np.float64)
    prompt, continuation = [1, 7, 3, 3, 0], [12, 4, 4]
    diffs = decode_differences(model, prompt, continuation, bug)
    assert diffs[0] < 1e-10  # prefill is right in both bugs: they only show when decoding
    assert min(diffs[1:]) > 1e-3  # every decode step is wrong


def test_rotate_again_cache_rotates_only_the_past_rows():
    cfg = rope_config()
    model = random_model(cfg, seed=9, dtype=np.float64)
    inner = model.new_cache()
    cache = RotateAgainCache(inner, cfg.rope_base, cfg.rope_layout)
    forward(model, [1, 2, 3], cache)
    k_new, v_new = np.ones((1, 2, 8)), np.zeros((1, 2, 8))
    k_read, _ = cache.append(0, k_new, v_new)
    stored = inner.k[0][:4]
    np.testing.assert_allclose(k_read[:3], apply_rope(stored[:3], np.arange(3), cfg.rope_base, "halves"))
    np.testing.assert_array_equal(k_read[3], stored[3])
    assert inner.lengths == [4, 3]  # layer 1 not yet appended


def test_unknown_bug_and_non_rope_model():
    model = random_model(rope_config(), seed=0, dtype=np.float64)
    with pytest.raises(ValueError, match="unknown RoPE bug"):
        cached_decode(model, [1], [2], "rotate_thrice")
    with pytest.raises(ValueError, match="need a RoPE model"):
        cached_decode(random_model(rope_config(position="table")), [1], [2])
    assert set(ROPE_BUGS) == {"none", "new_token_at_zero", "rotate_cached_twice"}
    assert len(recompute_logits(model, [1, 2], [3, 4])) == 3


@pytest.mark.parametrize("layout", ["halves", "interleaved"])
@pytest.mark.parametrize("d", [8, 12, 64])
def test_the_fast_paths_two_rotations_equal_apply_rope(layout, d):
    """core.rope's `rotate` (numpy, on a view) and `rotate_heads` (numba, in place, the first
    `heads` heads of each row only) against ops.apply_rope in float64."""
    from tinydecoder.fast import rope_tables as rope
    from tinydecoder.fast.compiled import jit

    cfg = Config(vocab_size=11, d_model=16, n_heads=3, n_kv_heads=1, head_dim=d, n_layers=1, d_ff=8,
                 max_context=4096, rope_layout=layout)
    positions = np.array([0, 5, 2047, 3000])
    rng = np.random.default_rng(d)
    qkv = rng.standard_normal((4, 5 * d)).astype(np.float32)  # 3 query heads, 1 key head, 1 value head
    want = qkv.astype(np.float64)
    want[:, :4 * d] = apply_rope(want[:, :4 * d].reshape(4, 4, d), positions, cfg.rope_base, layout).reshape(4, -1)
    tables = rope.rope_tables(cfg, positions, np.float32)
    got = rope.rotate_with_tables(qkv[:, :4 * d].reshape(4, 4, d), tables, layout).reshape(4, -1)
    np.testing.assert_allclose(got, want[:, :4 * d], rtol=0, atol=2e-6 * np.abs(want).max())
    if jit.available():
        assert rope.rotates_heads(qkv, tables) and not rope.rotates_heads(qkv[:, 1:], tables)
        before = qkv.copy()
        assert rope.rotate_heads(qkv, 4, tables, layout) is qkv
        np.testing.assert_allclose(qkv, want, rtol=0, atol=2e-6 * np.abs(want).max())
        assert np.array_equal(qkv[:, 4 * d:], before[:, 4 * d:])  # the value head is left as it was
