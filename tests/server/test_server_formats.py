"""OpenAI's response_format on the server: {"type": "text"}, {"type": "json_object"} and
{"type": "json_schema", ...}, through the official `openai` client. The checks of the field and
of the schema run on the toy model (fast); the constrained replies need a real tokenizer, so they
run on SmolLM2 with schemas and prompts written for this test, a few tokens each, the requests
sent together so that the engine batches them."""
import asyncio
import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
jsonschema = pytest.importorskip("jsonschema")

from tinydecoder.server import start_server  # noqa: E402

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def toy_client():
    with start_server("toy", max_batch=4, kv_blocks=32) as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_text_format_changes_nothing(toy_client):
    kw = dict(model="toy", messages=[{"role": "user", "content": "0 1 2"}], max_tokens=5, temperature=0)
    plain = toy_client.chat.completions.create(**kw)
    text = toy_client.chat.completions.create(response_format={"type": "text"}, **kw)
    assert text.choices[0].message.content == plain.choices[0].message.content
    assert text.choices[0].finish_reason == "length"


@pytest.mark.parametrize("response_format, match", [
    ({"type": "xml"}, "response_format: must be an object whose type is 'text', 'json_object', 'json_schema'"),
    ({"type": "json_schema"}, r"response_format.json_schema: is required"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, r"response_format.json_schema.schema: is required"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strng"}}},
     r"invalid or unsupported JSON schema: .*strng"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 2}}},
     r"invalid or unsupported JSON schema"),
    ({"type": "json_object"}, r"needs a model with a tokenizer; 'toy' has none"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True}},
     r"needs a model with a tokenizer"),
])
def test_bad_or_unsupported_formats_are_400_with_the_reason(toy_client, response_format, match):
    with pytest.raises(openai.BadRequestError, match=match) as e:
        toy_client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "0 1"}], max_tokens=3,
                                           response_format=response_format)
    assert e.value.status_code == 400 and e.value.body["type"] == "invalid_request_error"
    assert e.value.body["param"].startswith("response_format")


def test_completions_read_response_format_too(toy_client):
    plain = toy_client.completions.create(model="toy", prompt="0 1 2", max_tokens=4, temperature=0)
    text = toy_client.completions.create(model="toy", prompt="0 1 2", max_tokens=4, temperature=0,
                                         extra_body={"response_format": {"type": "text"}})
    assert text.choices[0].text == plain.choices[0].text
    with pytest.raises(openai.BadRequestError, match="needs a model with a tokenizer"):
        toy_client.completions.create(model="toy", prompt="0 1 2", max_tokens=4,
                                      extra_body={"response_format": {"type": "json_object"}})


def test_an_end_token_on_the_last_allowed_step_is_stop_not_length():
    """The toy's greedy reply to 0 1 2 3 is 3 2 0 4: served with 4 as its end token and
    max_tokens 4, the reply ends by itself exactly at the limit."""
    import tinydecoder as td
    from tinydecoder.server import create_app
    from tinydecoder.server.background import BackgroundServer
    from tinydecoder.server.models import ServedModel, ToyTokenizer

    assert td.SEED_CONTINUATION == [3, 2, 0, 4]
    model = td.toy_model()
    served = ServedModel("toy", model, ToyTokenizer(model.config.vocab_size), 4, 4)
    with BackgroundServer(create_app(served, max_batch=2, kv_blocks=16)).start() as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        ends = [client.completions.create(model="toy", prompt="0 1 2 3", max_tokens=n, temperature=0).choices[0]
                for n in (3, 4, 5)]
    assert [c.finish_reason for c in ends] == ["length", "stop", "stop"]
    assert ends[1].text == ends[2].text == " 3 2 0 4"  # (the toy writes every id, its end token too)


PLANET = {"type": "object", "properties": {"planet": {"type": "string", "maxLength": 12},
                                           "moons": {"type": "integer", "minimum": 0, "maximum": 200}},
          "required": ["planet", "moons"], "additionalProperties": False}
YES_NO = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}


@pytest.mark.smollm2
def test_smollm2_replies_are_schema_valid_json_or_cut_by_length():
    with start_server("smollm2", max_batch=4, kv_blocks=48) as s:
        client = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=600)

        async def chat(question, response_format, max_tokens, stream=False):
            kw = dict(model="smollm2", messages=[{"role": "user", "content": question}], max_tokens=max_tokens,
                      temperature=0, response_format=response_format)
            if not stream:
                r = await client.chat.completions.create(**kw)
                return r.choices[0].message.content, r.choices[0].finish_reason
            chunks = [c async for c in await client.chat.completions.create(stream=True, **kw)]
            return "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason

        async def together():
            schema = {"type": "json_schema", "json_schema": {"name": "planet", "schema": PLANET, "strict": True}}
            return await asyncio.gather(
                chat("Name the planet with the most famous rings and how many moons it has.", schema, 40),
                chat("Is the sea salty? Answer in JSON.", {"type": "json_schema",
                                                            "json_schema": {"name": "yn", "schema": YES_NO}},
                     24, stream=True),
                chat("Give a cat a name, as a JSON object with one key.", {"type": "json_object"}, 24, stream=True),
                chat("Which planet is the largest?", schema, 4))
        (planet, planet_end), (yes_no, yes_no_end), (obj, obj_end), (cut, cut_end) = asyncio.run(together())
        assert planet_end == "stop" and yes_no_end == "stop", (planet, yes_no)
        jsonschema.validate(json.loads(planet), PLANET)
        jsonschema.validate(json.loads(yes_no), YES_NO)
        assert obj_end == "length" or isinstance(json.loads(obj), dict), obj  # JSON mode: any object
        assert cut_end == "length" and cut.lstrip().startswith("{")  # four tokens cannot hold both fields
        with pytest.raises(json.JSONDecodeError):
            json.loads(cut)
        assert s.engine.pool_stats().blocks_used == 0


@pytest.mark.smollm2
def test_the_grammar_masks_before_min_p_so_an_allowed_token_always_remains():
    """min_p after the mask keeps tokens near the best allowed one; before it, a grammar whose
    allowed tokens are all unlikely would be left with none (and the request would fail)."""
    from types import SimpleNamespace

    import numpy as np

    from tinydecoder import smollm2_tokenizer
    from tinydecoder.decoding.grammar import JsonSchema
    from tinydecoder.decoding.processors import MinP, apply_processors
    from tinydecoder.server.protocol import parse_request

    tok = smollm2_tokenizer()
    served = SimpleNamespace(name="smollm2", tokenizer=tok, eos_id=tok.eos_id, max_context=8192,
                             model=SimpleNamespace(config=SimpleNamespace(vocab_size=tok.vocab_size)))
    gen = parse_request({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                         "min_p": 0.5, "response_format": {"type": "json_object"}}, served, chat=True)
    grammar, rest = gen.request.processors[0], gen.request.processors[1:]
    assert isinstance(grammar, JsonSchema) and [type(p) for p in rest] == [MinP]
    context = list(gen.prompt_ids)
    allowed = grammar.mask(context)
    logits = np.where(allowed, -10.0, 10.0)  # every token the grammar allows is unlikely
    out = apply_processors(gen.request.processors, context, logits)
    assert np.isfinite(out).any() and not np.isfinite(out[~allowed]).any()
