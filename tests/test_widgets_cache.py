"""Widgets of notebooks 05-06: their pure data functions, and the builders driven by setting
slider values (no browser)."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder import widgets
from tinydecoder.lessons import phases

SMOLLM2 = td.Config(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, n_layers=30,
                    d_ff=1536, max_context=8192, position="rope", rope_base=100000.0, tied_embeddings=True,
                    name="SmolLM2-135M")


@pytest.fixture(scope="module")
def toy():
    return td.toy_model()


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
