"""tinydecoder.widgets: the pure data functions give the right numbers for given slider values,
and the builders return widgets whose controls drive those functions."""
import ipywidgets as W
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinydecoder as td
from tinydecoder import widgets
from tinydecoder.lessons import phases


@pytest.fixture(scope="module")
def toy():
    return td.toy_model()


# ------------------------------------------------------------------ the generic panel

def test_panel_recomputes_on_every_change():
    calls = []
    slider = W.IntSlider(value=2, min=0, max=10, description="n")
    box = widgets.panel({"n": slider}, lambda n: n * n, lambda d: calls.append(d) or f"{d}", title="squares")
    assert isinstance(box, W.VBox) and box.data == 4 and calls == [4]
    slider.value = 7
    assert box.data == 49 and calls == [4, 49]
    assert isinstance(box.output, W.Output) and box.output in box.children
    assert isinstance(box.children[0], W.HTML) and "squares" in box.children[0].value
    assert slider in box.children[1].children


# ------------------------------------------------------------------ 01 embeddings

def test_embedding_parts_is_the_two_table_rows_and_their_sum(toy):
    p = widgets.embedding_parts(toy, 2, 5)
    np.testing.assert_array_equal(p["token"], toy.embed[2])
    np.testing.assert_array_equal(p["position"], toy.pos_table[5])
    np.testing.assert_array_equal(p["sum"], toy.embed[2] + toy.pos_table[5])


def test_embedding_parts_match_the_forward_pass_input(toy):
    x = widgets.layer_input(toy, td.SEED_PROMPT, 0)  # [4, 8]: what block 0 receives
    for pos, tok in enumerate(td.SEED_PROMPT):
        np.testing.assert_array_equal(widgets.embedding_parts(toy, tok, pos)["sum"], x[pos])


def test_embedding_parts_clear_errors(toy):
    with pytest.raises(ValueError, match="token id 6 .* out of range"):
        widgets.embedding_parts(toy, 6, 0)
    with pytest.raises(ValueError, match="position 64 is out of range"):
        widgets.embedding_parts(toy, 0, 64)


def test_embedding_widget_controls_drive_the_data(toy):
    box = widgets.embedding_widget(toy)
    token, position = box.controls["token_id"], box.controls["position"]
    assert isinstance(token, W.Dropdown) and token.description == "token id"
    assert isinstance(position, W.IntSlider) and position.description == "position"
    assert [v for _, v in token.options] == list(range(6))
    token.value, position.value = 4, 9
    np.testing.assert_array_equal(box.data["sum"], toy.embed[4] + toy.pos_table[9])


def test_embedding_figure_has_bars_and_a_labelled_heatmap(toy):
    fig = widgets.embedding_figure(widgets.embedding_parts(toy, 1, 2), 1, 2)
    bars_ax, map_ax = fig.axes[:2]
    assert len(bars_ax.containers) == 3
    assert map_ax.images[0].colorbar is not None
    assert [t.get_text() for t in map_ax.get_yticklabels()] == ["token", "position", "sum"]
    assert map_ax.get_xlabel() == "dimension"


# ------------------------------------------------------------------ 02 one query

def test_query_attention_reproduces_the_seed_example():
    d = widgets.query_attention(angle=0, length=1)
    np.testing.assert_allclose(d["scores"], [1 / np.sqrt(2), 0.0])
    assert np.round(d["weights"], 6).tolist() == [0.669762, 0.330238]
    assert np.round(d["output"], 5).tolist() == [6.69762, 6.60477]


def test_query_at_the_first_position_sees_only_the_first_key():
    d = widgets.query_attention(angle=0, length=1, n_visible=1)
    assert d["weights"].tolist() == [1.0, 0.0]
    np.testing.assert_allclose(d["output"], [10.0, 0.0])
    assert d["scores"][1] == -np.inf


def test_query_rotated_to_the_second_key_swaps_the_weights():
    d = widgets.query_attention(angle=90, length=1)
    np.testing.assert_allclose(d["weights"], [0.330238, 0.669762], atol=1e-6)


def test_zero_length_query_averages_the_values():
    d = widgets.query_attention(angle=33, length=0)
    np.testing.assert_allclose(d["weights"], [0.5, 0.5])
    np.testing.assert_allclose(d["output"], [5.0, 10.0])


def test_longer_query_sharpens_the_weights():
    w = [widgets.query_attention(0, length)["weights"][0] for length in (0.5, 1.0, 2.0, 3.0)]
    assert all(a < b for a, b in zip(w, w[1:]))


@settings(max_examples=50, deadline=None)
@given(angle=st.floats(-180, 180), length=st.floats(0, 3))
def test_query_weights_are_a_distribution_and_the_output_a_mix_of_values(angle, length):
    d = widgets.query_attention(angle, length)
    assert np.all(d["weights"] >= 0) and abs(d["weights"].sum() - 1) < 1e-12
    np.testing.assert_allclose(d["output"], d["weights"] @ widgets.SEED_VALUES)


def test_query_attention_errors():
    with pytest.raises(ValueError, match="n_visible must be in 1..2"):
        widgets.query_attention(0, 1, n_visible=3)
    with pytest.raises(ValueError, match="length must be >= 0"):
        widgets.query_attention(0, -1)


def test_query_widget_sliders_drive_the_data():
    box = widgets.query_widget()
    angle, length, at = box.controls["angle"], box.controls["length"], box.controls["n_visible"]
    assert isinstance(angle, W.FloatSlider) and "angle" in angle.description
    assert isinstance(length, W.FloatSlider) and "length" in length.description
    assert isinstance(at, W.Dropdown)
    np.testing.assert_allclose(box.data["output"], [6.69762, 6.60477], atol=1e-5)
    angle.value = 90.0
    np.testing.assert_allclose(box.data["weights"], widgets.query_attention(90, 1)["weights"])
    at.value = 1
    np.testing.assert_allclose(box.data["output"], [10.0, 0.0])


def test_query_figure_shows_the_weights_with_a_colorbar():
    fig = widgets.query_figure(widgets.query_attention(0, 1, n_visible=1))
    weights_ax = fig.axes[1]
    assert weights_ax.images[0].colorbar is not None
    assert [t.get_text() for t in weights_ax.get_xticklabels()] == ["k0", "k1"]
    assert any(p.get_hatch() for p in weights_ax.patches)  # the unseen key is drawn masked


# ------------------------------------------------------------------ 03 one layer

@pytest.mark.parametrize("layer", [0, 1])
def test_layer_steps_end_where_decoder_block_ends(toy, layer):
    steps = widgets.layer_steps(toy, td.SEED_PROMPT, layer)
    assert list(steps)[:-1] == list(widgets.LAYER_STEPS)
    x = widgets.layer_input(toy, td.SEED_PROMPT, layer)
    cfg, w = toy.config, toy.layers[layer]  # the block again, op by op, independently of decoder_block
    h = td.rmsnorm(x, w.attn_norm, cfg.norm_eps)
    q, k, v = (h @ w.wq).reshape(4, 2, 4), (h @ w.wk).reshape(4, 1, 4), (h @ w.wv).reshape(4, 1, 4)
    y = x + td.attention(q, k, v) @ w.wo
    z = td.rmsnorm(y, w.ffn_norm, cfg.norm_eps)
    out = y + (td.silu(z @ w.w_gate) * (z @ w.w_up)) @ w.w_down
    np.testing.assert_allclose(steps["residual 2"], out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(steps["q_proj"], h @ w.wq, rtol=0, atol=1e-14)
    np.testing.assert_allclose(steps["ffn_gate"], z @ w.w_gate, rtol=0, atol=1e-12)
    np.testing.assert_allclose(steps["residual 1"], steps["input x"] + steps["o_proj"])


def test_layer_steps_agree_with_the_forward_pass(toy):
    trace = td.Trace()
    logits = td.forward(toy, td.SEED_PROMPT, trace=trace)
    last = widgets.layer_steps(toy, td.SEED_PROMPT, toy.config.n_layers - 1)["residual 2"]
    np.testing.assert_allclose(td.rmsnorm(last) @ toy.lm_head, logits, atol=1e-14)
    for layer in range(toy.config.n_layers):
        np.testing.assert_allclose(widgets.layer_steps(toy, td.SEED_PROMPT, layer)["weights"],
                                   trace.attention_weights[(layer, 0)], atol=1e-14)


def test_layer_steps_shapes_are_the_seed_table(toy):
    shapes = {k: v.shape for k, v in widgets.layer_steps(toy, td.SEED_PROMPT, 0).items()}
    assert shapes["q_proj"] == (4, 8) and shapes["k_proj"] == (4, 4) and shapes["v_proj"] == (4, 4)
    assert shapes["attention"] == (4, 8) and shapes["ffn_gate"] == (4, 16) and shapes["residual 2"] == (4, 8)
    assert shapes["weights"] == (2, 4, 4)


def test_layer_input_errors(toy):
    with pytest.raises(ValueError, match="layer 2 is out of range"):
        widgets.layer_input(toy, td.SEED_PROMPT, 2)


def test_layer_widget_dropdowns_drive_the_data(toy):
    box = widgets.layer_widget(toy, td.SEED_PROMPT)
    layer, name = box.controls["layer"], box.controls["name"]
    assert isinstance(layer, W.Dropdown) and layer.description == "layer"
    assert isinstance(name, W.Dropdown) and name.description == "tensor"
    assert box.data["tensor"].shape == (4, 8)  # q_proj
    name.value = "ffn_gate"
    assert box.data["tensor"].shape == (4, 16)
    layer.value = 1
    np.testing.assert_array_equal(box.data["tensor"], widgets.layer_steps(toy, td.SEED_PROMPT, 1)["ffn_gate"])


def test_layer_tensor_figure_is_labelled(toy):
    t = widgets.layer_steps(toy, td.SEED_PROMPT, 0)["k_proj"]
    fig = widgets.layer_tensor_figure("k_proj", t, 0, td.SEED_PROMPT)
    ax = fig.axes[0]
    assert ax.get_title() == "layer 0: k_proj  [4,4]"
    assert ax.images[0].colorbar is not None
    assert [x.get_text() for x in ax.get_yticklabels()] == ["0:0", "1:1", "2:2", "3:3"]


# ================================================================== notebooks 04-06: data functions, builders driven by sliders
SMOLLM2 = td.Config(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, n_layers=30,
                    d_ff=1536, max_context=8192, position="rope", rope_base=100000.0, tied_embeddings=True,
                    name="SmolLM2-135M")




# ------------------------------------------------------------------ 04
def test_kv_heads_view_smollm2():
    v = widgets.kv_heads_view(SMOLLM2, 3)
    assert v["bytes_per_token"] == 46080 and v["mha_bytes_per_token"] == 138240
    assert v["saved_bytes_per_token"] == 92160 and v["saved_fraction"] == pytest.approx(2 / 3)
    assert v["mapping"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and v["kind"] == "GQA" and v["group"] == 3
    mqa = widgets.kv_heads_view(SMOLLM2, 1)
    assert mqa["kind"] == "MQA" and mqa["bytes_per_token"] == 15360 and set(mqa["mapping"].tolist()) == {0}
    assert widgets.kv_heads_view(SMOLLM2, 9)["saved_bytes_per_token"] == 0
    with pytest.raises(ValueError, match="allowed: \\[1, 3, 9\\]"):
        widgets.kv_heads_view(SMOLLM2, 2)


def test_kv_heads_widget_slider_redraws():
    box = widgets.kv_heads_widget(SMOLLM2)
    slider = box.controls["n_kv_heads"]
    assert list(slider.options) == [1, 3, 9] and slider.description == "KV heads"
    assert box.data["bytes_per_token"] == 46080
    slider.value = 9
    assert box.data["kind"] == "MHA" and box.data["bytes_per_token"] == 138240
    slider.value = 1
    assert box.data["mapping"].tolist() == [0] * 9


# ------------------------------------------------------------------ 05
@pytest.mark.parametrize("S", [1, 3, 6])
def test_phase_view_shapes_and_flops(toy, S):
    tokens = td.SEED_PROMPT + td.SEED_CONTINUATION
    v = widgets.phase_view(toy, tokens, S, layer=1)
    assert v["prompt"] == tokens[:S]
    assert v["prefill_weights"].shape == (2, S, S) and v["decode_weights"].shape == (2, 1, S + 1)
    assert v["prefill_shapes"]["scores"] == (1, 2, S, S) and v["decode_shapes"]["scores"] == (1, 2, 1, S + 1)
    assert v["prefill_flops"] == 4 * 2 * S * S * 4 and v["decode_flops"] == 4 * 2 * (S + 1) * 4
    assert v["next_token"] == td.greedy(td.forward(toy, tokens[:S])[-1])
    np.testing.assert_allclose(np.triu(v["prefill_weights"][0], 1), 0)  # the causal triangle
    np.testing.assert_allclose(v["decode_weights"].sum(-1), 1.0, atol=1e-12)


def test_phase_view_errors(toy):
    with pytest.raises(ValueError, match=r"prompt_length must be in 1\.\.4"):
        widgets.phase_view(toy, [0, 1, 2, 3], 5)
    with pytest.raises(ValueError, match=r"layer must be in 0\.\.1"):
        widgets.phase_view(toy, [0, 1], 2, layer=2)


def test_phase_widget_slider_redraws(toy):
    box = widgets.phase_widget(toy, td.SEED_PROMPT + td.SEED_CONTINUATION)
    slider = box.controls["prompt_length"]
    assert slider.description == "prompt length S" and (slider.min, slider.max, slider.value) == (1, 8, 4)
    assert box.data["decode_weights"].shape == (2, 1, 5)
    slider.value = 7
    assert box.data["prefill_weights"].shape == (2, 7, 7) and box.data["decode_shapes"]["scores"] == (1, 2, 1, 8)


# ------------------------------------------------------------------ 06
def test_cache_step_view(toy):
    steps = phases.cached_steps(toy, td.SEED_PROMPT, 4)
    first, third = widgets.cache_step_view(steps, 1), widgets.cache_step_view(steps, 3)
    assert (first["phase"], first["cache_before"], first["cache_after"]) == ("prefill", 0, 4)
    assert first["new_query_weights"].shape == (2, 4) and first["capacity"] == 7
    assert (third["phase"], third["input_tokens"], third["positions"], third["next_token"]) == ("decode", [2], [5], 0)
    assert third["cache_lengths"] == [4, 5, 6] and third["new_query_weights"].shape == (2, 6)
    np.testing.assert_allclose(third["new_query_weights"], steps[2].weights[:, 0])
    with pytest.raises(ValueError, match=r"step must be in 1\.\.4"):
        widgets.cache_step_view(steps, 5)


def test_cache_scrubber_widget_slider_redraws(toy):
    box = widgets.cache_scrubber_widget(toy, td.SEED_PROMPT, 4, layer=1)
    slider = box.controls["step"]
    assert (slider.min, slider.max, slider.value) == (1, 4, 2) and "round" in slider.description
    assert box.data["cache_after"] == 5
    slider.value = 4
    assert box.data["cache_after"] == 7 and box.data["input_tokens"] == [0] and box.data["next_token"] == 4
    # layer 1's weights of the last round equal the last row of a full recompute of layer 1
    trace = td.Trace()
    td.forward(toy, box.data["context"], trace=trace)
    np.testing.assert_allclose(box.data["new_query_weights"], trace.attention_weights[(1, 0)][:, -1], atol=1e-13)


def test_prefix_reuse_widget_slider_drives_the_view():
    from tinydecoder.widgets import prefix_reuse_figure, prefix_reuse_widget

    prompts = [list(range(40)), list(range(33)) + [99] * 5, list(range(10)) + [98] * 30]
    box = prefix_reuse_widget(prompts)
    assert box.data["block_size"] == 16 and box.data["shared"] == [33, 10] and box.data["reused"] == [32, 0]
    box.controls["block_size"].value = 8
    assert box.data["reused"] == [32, 8]
    box.controls["block_size"].value = 64
    assert box.data["reused"] == [0, 0]
    fig = prefix_reuse_figure(box.data)
    assert len(fig.axes[0].patches) == 4 and "block size 64" in fig.axes[0].get_title()
