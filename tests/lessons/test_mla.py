"""Toy multi-head latent attention (tinydecoder.lessons.mla)."""
import numpy as np
import pytest

from tinydecoder.lessons.mla import (
    DEEPSEEK_V2,
    absorbed_weights,
    cache_elements_per_token,
    cache_table,
    mla_attention,
    mla_attention_absorbed,
    random_mla,
)

X = np.random.default_rng(5).standard_normal((9, 32))


@pytest.fixture(scope="module")
def layer():
    return random_mla(d_model=32, n_heads=4, head_dim=8, d_latent=16, d_rope=4, seed=0)


def test_absorbed_equals_unabsorbed(layer):
    out, cache = mla_attention(layer, X)
    out_abs, cache_abs = mla_attention_absorbed(layer, X)
    assert out.shape == (9, 32) and np.abs(out).max() > 0.1
    assert np.abs(out - out_abs).max() <= 1e-10
    assert np.array_equal(cache.latent, cache_abs.latent) and cache.latent.shape == (9, 16)
    assert cache.k_rope.shape == (9, 4) and cache.elements_per_token == 20


def test_absorbed_float32_close(layer):
    w32 = random_mla(seed=0, dtype=np.float32)
    out, _ = mla_attention_absorbed(w32, X.astype(np.float32))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, mla_attention(layer, X)[0], atol=1e-5)


def test_absorbed_weight_shapes(layer):
    w_uk, w_uvo = absorbed_weights(layer)
    assert w_uk.shape == (4, 8, 16) and w_uvo.shape == (4, 16, 32)


@pytest.mark.parametrize("attend", [mla_attention, mla_attention_absorbed])
def test_causal_and_cached_decode(layer, attend):
    full, _ = attend(layer, X)
    changed = X.copy()
    changed[6:] += 1.0  # the future must not change earlier outputs
    np.testing.assert_allclose(attend(layer, changed)[0][:6], full[:6], atol=1e-12)
    assert np.abs(attend(layer, changed)[0][6:] - full[6:]).max() > 1e-3
    out, cache = attend(layer, X[:5])  # prefill 5, then decode one row at a time from the cache
    rows = [out]
    for i in range(5, 9):
        out, cache = attend(layer, X[i:i + 1], cache)
        rows.append(out)
    np.testing.assert_allclose(np.concatenate(rows), full, atol=1e-12)
    assert len(cache) == 9


def test_the_rope_dims_take_part(layer):
    """Zeroing the decoupled RoPE queries changes the output: position reaches the scores."""
    no_rope = random_mla(seed=0)
    no_rope.w_q_rope = np.zeros_like(no_rope.w_q_rope)
    assert np.abs(mla_attention(no_rope, X)[0] - mla_attention(layer, X)[0]).max() > 1e-3


def test_cache_sizes_match_deepseek_v2_table_1():
    n_h, d_h, l = DEEPSEEK_V2["n_heads"], DEEPSEEK_V2["head_dim"], DEEPSEEK_V2["n_layers"]
    d_c, d_r = DEEPSEEK_V2["d_latent"], DEEPSEEK_V2["d_rope"]
    assert d_c == 4 * d_h and d_r == d_h // 2
    assert cache_elements_per_token("MHA", n_h, d_h, l) == 2 * 128 * 128 * 60 == 1_966_080
    assert cache_elements_per_token("GQA", n_h, d_h, l, n_groups=8) == 2 * 8 * 128 * 60
    assert cache_elements_per_token("MQA", n_h, d_h, l) == 2 * 128 * 60
    mla = cache_elements_per_token("MLA", n_h, d_h, l, d_latent=d_c, d_rope=d_r)
    assert mla == 576 * 60 == 9 / 2 * d_h * l  # the paper's (9/2) d_h l
    rows = {r["kind"]: r for r in cache_table(n_h, d_h, l, 8, d_c, d_r)}
    assert rows["MLA"]["equivalent_groups"] == 2.25  # "equivalent to GQA with 2.25 groups"
    assert rows["MQA"]["equivalent_groups"] == 1 and rows["MHA"]["fraction_of_mha"] == 1
    assert rows["MLA"]["fraction_of_mha"] == pytest.approx(576 / 32768)


def test_cache_sizes_smollm2_shapes():
    rows = {r["kind"]: r["elements_per_token"] for r in cache_table(9, 64, 30, 3, 256, 32)}
    assert rows == {"MHA": 34560, "GQA": 11520, "MQA": 3840, "MLA": 8640}


def test_bad_arguments():
    with pytest.raises(ValueError, match="kind must be one of"):
        cache_elements_per_token("MoE", 8, 64, 2)
    with pytest.raises(ValueError, match="GQA needs n_groups"):
        cache_elements_per_token("GQA", 9, 64, 2, n_groups=2)
    with pytest.raises(ValueError, match="MLA needs d_latent"):
        cache_elements_per_token("MLA", 9, 64, 2)
    with pytest.raises(ValueError, match="d_rope must be even"):
        random_mla(d_rope=3)
    with pytest.raises(ValueError, match="head_dim must be a positive integer"):
        random_mla(head_dim=0)


def test_cache_figure_and_widget():
    import matplotlib.pyplot as plt

    from tinydecoder.widgets import mla as mla_viz

    fig = mla_viz.cache_bars_figure(cache_table(9, 64, 30, 3, 256, 32), "SmolLM2")
    assert isinstance(fig, plt.Figure) and [b.get_height() for b in fig.axes[0].patches] == [34560, 11520, 3840, 8640]
    box = mla_viz.mla_cache_widget(9, 64, 30, 3, "SmolLM2")
    assert box.data["rows"][3]["elements_per_token"] == 8640
    box.controls["d_latent"].value = 128
    assert box.data["rows"][3]["elements_per_token"] == (128 + 32) * 30
