"""OpenAI's `response_format`: the reply constrained to JSON by a grammar (decoding.grammar).

    {"type": "text"}                                       no constraint (the default)
    {"type": "json_object"}                                any JSON object
    {"type": "json_schema", "json_schema": {"name": "...", "schema": {...}, "strict": true}}
                                                           JSON valid under the schema

The grammar (llguidance) masks every token that would break the JSON and allows the model's end
token only once the JSON is complete, so a reply that ends by itself ("stop") is valid JSON; one
cut by max_tokens ("length") may not be. A schema llguidance cannot compile is a 400 carrying its
reason; so is a response format on a model without a tokenizer (the toy's text is token ids)."""
from __future__ import annotations

KINDS = ("text", "json_object", "json_schema")
PARAM = "response_format"


class FormatError(ValueError):
    """A bad response_format (protocol.parse_request answers it with a 400 naming `param`)."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


_bad = FormatError


def requested_schema(value) -> dict | None:
    """The JSON schema `response_format` asks for, or None for plain text; FormatError if malformed."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in KINDS:
        raise _bad(PARAM, "must be an object whose type is " + ", ".join(repr(k) for k in KINDS))
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return {"type": "object"}
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise _bad(f"{PARAM}.json_schema", "is required with type 'json_schema': an object {\"name\", \"schema\"}")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise _bad(f"{PARAM}.json_schema.name", f"must be a string, got {type(name).__name__}")
    if not isinstance(spec.get("strict", False), (bool, type(None))):
        raise _bad(f"{PARAM}.json_schema.strict", "must be true or false")
    schema = spec.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, dict):
        raise _bad(f"{PARAM}.json_schema.schema", "is required: a JSON schema object")
    return schema


def check_schema(schema: dict) -> None:
    """FormatError with llguidance's reason unless it compiles `schema` into a grammar."""
    import llguidance

    param = f"{PARAM}.json_schema.schema"
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    except (ValueError, TypeError) as exc:
        raise _bad(param, f"invalid JSON schema: {exc}") from None
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise _bad(param, f"invalid or unsupported JSON schema: {' '.join(error.split())}")


def format_processor(body: dict, served):
    """The grammar processor the request's `response_format` asks for, or None.  FormatError
    if it is malformed, its schema does not compile, or the model has no tokenizer."""
    schema = requested_schema(body.get(PARAM))
    if schema is None:
        return None
    check_schema(schema)
    if served.eos_id is None or not hasattr(served.tokenizer, "hf"):
        raise _bad(PARAM, f"needs a model with a tokenizer; {served.name!r} has none (its text is token ids): "
                          "serve smollm2 for JSON output")
    from ..decoding.grammar import JsonSchema

    try:  # the end token is the engine's stop token: the reply may end only once the JSON is complete
        return JsonSchema(schema, served.tokenizer, end_tokens=[served.eos_id])
    except ValueError as exc:
        raise _bad(f"{PARAM}.json_schema.schema", str(exc)) from None
