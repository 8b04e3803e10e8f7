"""Helpers of notebooks 08 (a real model) and 09 (sampling): a typed prompt traced through a model
for the attention explorer, where last_only's FLOPs are saved, and the log-scale sampling bars."""
import matplotlib.pyplot as plt
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder import widgets
from tinydecoder.lessons.real_model import MAX_PROMPT_TOKENS, last_only_savings, token_piece_labels, trace_prompt
from tinydecoder.lessons.sampling_view import distribution_view

GQA = td.Config(vocab_size=11, d_model=12, n_heads=6, n_kv_heads=2, head_dim=4, n_layers=3, d_ff=16,
                max_context=64, position="rope", name="gqa-6-2")


class LetterTokenizer:
    """One token per character: a space is id 10, a letter (code - 97) mod 10; a piece is "a".."j" or " "."""

    def encode(self, text):
        return [10 if c == " " else (ord(c) - 97) % 10 for c in text]

    def pieces(self, ids):
        return [" " if i == 10 else chr(ord("a") + i) for i in ids]


@pytest.fixture(scope="module")
def gqa():
    return td.random_model(GQA, seed=3, dtype=np.float64)


# ------------------------------------------------------------------ trace_prompt

def test_trace_prompt_traces_every_layer_of_the_typed_text(gqa):
    tok = LetterTokenizer()
    out = trace_prompt(gqa, tok, "abc de")
    assert out["ids"] == tok.encode("abc de")
    assert sorted(out["trace"].attention_weights) == [(layer, 0) for layer in range(GQA.n_layers)]
    assert out["trace"].attention_weights[(2, 0)].shape == (GQA.n_heads, 6, 6)
    reference = td.forward(gqa, out["ids"])
    np.testing.assert_allclose(out["trace"].attention_weights[(1, 0)].sum(axis=-1), 1.0)
    assert out["next_token"] == int(reference[-1].argmax())
    assert out["labels"][:3] == ["0:a", "1:b", "2:c"]
    assert out["labels"][3] == "3:' '"  # a whitespace-only piece is shown as its repr


def test_token_piece_labels_strip_the_leading_space():
    class Pieces:
        def pieces(self, ids):
            return {0: [" Paris"], 1: ["\n"], 2: ["The"]}[ids[0]] if len(ids) == 1 else [" Paris", "\n", "The"]

    assert token_piece_labels(Pieces(), [0, 1, 2]) == ["0:Paris", "1:'\\n'", "2:The"]
    assert token_piece_labels(Pieces(), [0, 1, 2], start=5)[0] == "5:Paris"


def test_trace_prompt_refuses_empty_long_and_non_text_prompts(gqa):
    tok = LetterTokenizer()
    with pytest.raises(ValueError, match="the prompt is empty"):
        trace_prompt(gqa, tok, "   ")
    with pytest.raises(ValueError, match=r"is 33 tokens long; the explorer takes at most 32"):
        trace_prompt(gqa, tok, "a" * (MAX_PROMPT_TOKENS + 1))
    with pytest.raises(ValueError, match="at most 4"):
        trace_prompt(gqa, tok, "abcde", max_tokens=4)
    with pytest.raises(ValueError, match="must be text"):
        trace_prompt(gqa, tok, [1, 2, 3])
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        trace_prompt(gqa, tok, "ab", max_tokens=0)


# ------------------------------------------------------------------ the explorer with a prompt box

def test_explorer_prompt_box_traces_a_new_prompt_and_reports_bad_ones(gqa):
    tok = LetterTokenizer()
    start = trace_prompt(gqa, tok, "abcd")
    box = widgets.attention_explorer_widget(start["trace"], GQA, start["labels"], layer=1, model=gqa,
                                            tokenizer=tok, prompt="abcd")
    assert box.controls["prompt"].description == "prompt" and box.controls["prompt"].value == "abcd"
    assert box.data["prompt"] == "abcd" and box.data["weights"].shape == (GQA.n_heads, 4, 4)
    np.testing.assert_array_equal(box.data["weights"], start["trace"].attention_weights[(1, 0)])
    box.controls["prompt"].value = "hello world"
    assert box.data["weights"].shape == (GQA.n_heads, 11, 11) and box.data["labels"][0].startswith("0:")
    expected = trace_prompt(gqa, tok, "hello world")["trace"].attention_weights[(1, 0)]
    np.testing.assert_allclose(box.data["weights"], expected)
    box.controls["head"].value = 4  # the other controls act on the new prompt's trace
    assert box.data["heads"] == [4] and box.data["weights"].shape == (1, 11, 11)
    box.controls["prompt"].value = ""
    assert "empty" in box.data["error"]
    assert widgets.explorer_figure(box.data).startswith("Cannot trace this prompt: the prompt is empty")
    box.controls["prompt"].value = "x" * 40
    assert "40 tokens long" in box.data["error"]
    box.controls["prompt"].value = "abcd"  # back to the start: the stored trace, not a new one
    np.testing.assert_array_equal(box.data["weights"][0], start["trace"].attention_weights[(1, 0)][4])
    plt.close("all")


def test_explorer_without_a_model_has_no_prompt_box_and_keeps_only_recent_prompts(gqa):
    tok = LetterTokenizer()
    start = trace_prompt(gqa, tok, "ab")
    box = widgets.attention_explorer_widget(start["trace"], GQA, start["labels"])
    assert sorted(box.controls) == ["head", "layer", "log_scale"]
    with pytest.raises(ValueError, match="needs the tokenizer and the prompt text"):
        widgets.attention_explorer_widget(start["trace"], GQA, model=gqa)
    traces = {}
    for text in ["a", "ab", "abc", "abcd"]:
        widgets.explorer_view(traces, GQA, 0, prompt=text, model=gqa, tokenizer=tok, keep=2)
    assert list(traces) == ["abc", "abcd"]
    with pytest.raises(ValueError, match="no trace and no model"):
        widgets.explorer_view({}, GQA, 0, prompt="zz")
    plt.close("all")


# ------------------------------------------------------------------ last_only savings

def test_last_only_savings_split_into_lm_head_and_last_layer(gqa):
    ids = [1, 5, 2, 7, 3]
    full, lean = td.Trace(), td.Trace()
    td.forward(gqa, ids, trace=full)
    td.forward(gqa, ids, last_only=True, trace=lean)
    s = last_only_savings(full, lean)
    S, D, V = len(ids), GQA.d_model, GQA.vocab_size
    assert s["lm_head_saved"] == 2 * (S - 1) * D * V  # the LM head runs on 1 row instead of S
    assert s["saved"] == full.total_flops() - lean.total_flops() > 0
    assert s["other_saved"] == 0 and s["last_layer"] == GQA.n_layers - 1
    assert s["lm_head_saved"] + s["last_layer_saved"] == s["saved"]
    assert s["lm_head_share"] == pytest.approx(s["lm_head_saved"] / s["saved"])
    with pytest.raises(ValueError, match="saves nothing"):
        last_only_savings(full, full)
    with pytest.raises(ValueError, match="both traces"):
        last_only_savings(td.Trace(), lean)


@pytest.mark.smollm2
def test_real_model_last_only_saving_is_mostly_the_lm_head():
    import contextlib
    import io

    from tinydecoder.checkpoint.smollm2 import load_smollm2, smollm2_tokenizer

    with contextlib.redirect_stderr(io.StringIO()):
        model, tok = load_smollm2(), smollm2_tokenizer()
    ids = tok.encode("The capital of France is")
    full, lean = td.Trace(), td.Trace()
    td.forward(model, ids, trace=full)
    td.forward(model, ids, last_only=True, trace=lean)
    s = last_only_savings(full, lean)
    assert s["saved"] == 253_080_576 and s["lm_head_saved"] == 226_492_416  # notebook 08's numbers
    assert s["lm_head_share"] > 0.85


# ------------------------------------------------------------------ sampling bars, log scale

LOGITS = np.array([4.0, 3.0, 0.0, -3.0, -8.0, -np.inf], dtype=np.float32)


def test_sampling_bars_linear_is_the_view_itself():
    view = distribution_view(LOGITS, temperature=1.0, top_k=3, n_show=5)
    bars = widgets.sampling_bars(view)
    np.testing.assert_array_equal(bars["probs"], view["probs"])
    assert bars["yscale"] == "linear" and bars["ylim"] == (0.0, 1.02) and bars["below_floor"] == 0


def test_sampling_bars_log_scale_shows_the_tail_and_floors_zeros():
    view = distribution_view(LOGITS, temperature=1.0, top_k=4, n_show=5)
    bars = widgets.sampling_bars(view, log_scale=True, floor=1e-6)
    assert bars["yscale"] == "log" and bars["ylim"] == (1e-6, 1.5)
    # token 3 (logit -3) has p ~ 6e-4: on the log axis it is above the floor, visible
    assert view["probs"][3] == pytest.approx(np.exp(-3) / np.exp([4, 3, 0, -3]).sum(), rel=1e-6)
    assert bars["probs"][3] == view["probs"][3] > 1e-6
    # token 4 is filtered out by top-k 4: probability 0, drawn on the floor
    assert view["probs"][4] == 0 and bars["probs"][4] == 1e-6 and bars["below_floor"] == 1
    assert bars["base"][4] == pytest.approx(np.exp(-8) / np.exp([4, 3, 0, -3, -8]).sum(), rel=1e-6)
    with pytest.raises(ValueError, match=r"floor must be in \(0, 1\)"):
        widgets.sampling_bars(view, log_scale=True, floor=0)


def test_sampling_widget_log_scale_checkbox_switches_the_axis():
    labels = [f"t{i}" for i in range(6)]
    box = widgets.sampling_widget(LOGITS, labels, n_show=5)
    assert box.controls["log_scale"].description == "log scale" and box.data["log_scale"] is False
    box.controls["log_scale"].value = True
    assert box.data["log_scale"] is True
    fig = widgets.sampling_figure(box.data, labels, box.data["log_scale"])
    assert fig.axes[0].get_yscale() == "log" and fig.axes[0].get_ylim() == pytest.approx((1e-6, 1.5))
    plt.close("all")
