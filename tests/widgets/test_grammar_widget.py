"""Notebook 25's step view of a constrained generation, on the toy model with a six-token
tokenizer (ids read as <eos> a b c ab ba): the data per step, the slider, the figure."""
import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

import tinydecoder as td
from tinydecoder.widgets.grammar import draw_mask_sizes, grammar_steps, grammar_widget, step_html

PIECES = ["<eos>", "a", "b", "c", "ab", "ba"]


@pytest.fixture(scope="module")
def grammar():
    vocab = {p: i for i, p in enumerate(PIECES)}
    hf = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("b", "a")], fuse_unk=False, byte_fallback=False))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken("<eos>", special=True, normalized=False)])
    return td.Regex("(ab|b)c", hf, end_tokens=[0])


def test_steps_of_a_constrained_toy_generation(grammar):
    gen = td.generate(td.toy_model(), td.SEED_PROMPT, 8, processors=[grammar])
    steps = grammar_steps(gen, grammar, PIECES.__getitem__, top=6)
    assert [s["chosen"] for s in steps] == [PIECES[t] for t in gen.new_tokens]
    assert steps[0]["allowed"] == 3 and steps[0]["text"] == "" and not steps[0]["accepting"]  # a, b, ab
    assert steps[-1]["accepting"] == (gen.new_tokens[-1] == 0)
    for s in steps:
        probs = [p for _, p, _ in s["candidates"]]
        assert probs == sorted(probs, reverse=True) and len(probs) == 6
        assert np.isclose(sum(probs), 1.0)  # all six tokens of the toy vocabulary
        allowed = [piece for piece, _, ok in s["candidates"] if ok]
        assert s["chosen"] == allowed[0]  # greedy under the mask: the most likely allowed token
        assert len(allowed) == s["allowed"]
    assert "step 1" in step_html(steps[0], 6) and "masked" in step_html(steps[0], 6)


def test_widget_and_figure(grammar):
    gen = td.generate(td.toy_model(), td.SEED_PROMPT, 8, processors=[grammar])
    steps = grammar_steps(gen, grammar, PIECES.__getitem__)
    box = grammar_widget(steps, 6)
    box.controls["step"].value = len(steps)
    assert box.data is steps[-1]
    fig = draw_mask_sizes(steps, 6)
    assert [p.get_height() for p in fig.axes[0].patches] == [s["allowed"] for s in steps]


def test_errors(grammar):
    gen = td.generate(td.toy_model(), td.SEED_PROMPT, 2, processors=[grammar], keep_logits=False)
    with pytest.raises(ValueError, match="keep_logits=True"):
        grammar_steps(gen, grammar, PIECES.__getitem__)
    with pytest.raises(ValueError, match="top must be an integer >= 1"):
        grammar_steps(gen, grammar, PIECES.__getitem__, top=0)
    with pytest.raises(ValueError, match="no steps"):
        grammar_widget([], 6)
