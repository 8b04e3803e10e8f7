"""The OpenAI request bodies the server accepts, checked field by field, and the response
objects it returns. A bad field raises `ApiError(400, message, param)`; the app turns it into
an OpenAI-style error body {"error": {"message", "type", "param", "code"}}.

Fields (both endpoints): model, max_tokens (chat also max_completion_tokens), temperature
(default 1, 0 = greedy), top_p, top_k, min_p, seed, stop (a string or up to 4), stream,
stream_options.include_usage, n (1 only), repetition_penalty, frequency_penalty,
presence_penalty, logit_bias, response_format (formats.py: text, json_object, json_schema).
/v1/completions takes `prompt` (text or token ids);
/v1/chat/completions takes `messages` and writes them with the model's chat template.
Unknown fields are ignored, as OpenAI-compatible servers do."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from ..core.validate import is_int, is_real
from ..decoding import processors as P
from ..decoding.sampling import make_sampler
from ..serving.requests import Request
from .formats import FormatError, format_processor

MAX_STOP = 4


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.headers = status, message, param, kind, headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


def _bad(param, message):
    return ApiError(400, f"{param}: {message}", param)


def _number(body, name, low=None, high=None, low_open=False):
    v = body.get(name)
    if v is None:
        return None
    if not is_real(v):
        raise _bad(name, f"must be a number, got {type(v).__name__}")
    if (low is not None and (v < low or (low_open and v == low))) or (high is not None and v > high):
        rng = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}]"
        raise _bad(name, f"must be in {rng}, got {v}")
    return float(v)


def _integer(body, name, low=None):
    v = body.get(name)
    if v is None:
        return None
    if not is_int(v):
        raise _bad(name, f"must be an integer, got {type(v).__name__}")
    if low is not None and v < low:
        raise _bad(name, f"must be an integer >= {low}, got {v}")
    return int(v)


@dataclass
class ApiRequest:
    """A checked request: what the engine runs and how the answer is written back."""

    chat: bool
    prompt_ids: list
    request: Request
    stop: list = field(default_factory=list)  # stop strings (the text ends before the first)
    stream: bool = False
    include_usage: bool = False


def _stop_strings(body) -> list:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOP:
        raise _bad("stop", f"must be a non-empty string or a list of at most {MAX_STOP} of them")
    return stop


def _messages(body, served) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list of {\"role\", \"content\"} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise _bad(f"messages[{i}]", "must be an object with role system, user or assistant")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise _bad(f"messages[{i}].content", "only text parts are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content", f"must be a string, got {type(content).__name__}")
        out.append({"role": m["role"], "content": content})
    return out


def _prompt_ids(body, served) -> list:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        try:
            ids = served.tokenizer.encode(prompt)
        except ValueError as e:
            raise _bad("prompt", str(e)) from None
    elif isinstance(prompt, list) and all(is_int(t) for t in prompt):
        vocab = served.model.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise _bad("prompt", f"token ids must be in 0..{vocab - 1}")
        ids = list(prompt)
    else:
        raise _bad("prompt", "must be a string or a list of token ids (one prompt per request)")
    if not ids:
        raise _bad("prompt", "is empty: at least one token is needed")
    return ids


def _processors(body, served) -> list:
    """The logits processors the body asks for: response_format's grammar, penalties, min_p, logit_bias
    (a token the grammar masked stays at -inf whatever comes after it)."""
    try:  # the grammar first: min_p then keeps tokens near the best *allowed* one (never none at all)
        grammar = format_processor(body, served)
    except FormatError as e:
        raise ApiError(400, str(e), e.param) from None
    procs = [] if grammar is None else [grammar]
    for name, cls, low, high in (("repetition_penalty", P.RepetitionPenalty, 0, None),
                                 ("frequency_penalty", P.FrequencyPenalty, -2, 2),
                                 ("presence_penalty", P.PresencePenalty, -2, 2), ("min_p", P.MinP, 0, 1)):
        v = _number(body, name, low, high, low_open=name == "repetition_penalty")
        if v is not None:
            procs.append(cls(v))
    bias = body.get("logit_bias")
    if bias is not None:
        vocab = served.model.config.vocab_size
        try:
            bias = {int(k): float(v) for k, v in bias.items()}
        except (AttributeError, TypeError, ValueError):
            raise _bad("logit_bias", "must map token ids to numbers") from None
        if any(not 0 <= k < vocab or not -100 <= v <= 100 for k, v in bias.items()):
            raise _bad("logit_bias", f"token ids must be in 0..{vocab - 1} and biases in [-100, 100]")
        procs.append(P.LogitBias(bias))
    return procs


def parse_request(body, served, chat: bool) -> ApiRequest:
    """Check an OpenAI request body for `served` (a ServedModel); ApiError(400/404) if wrong."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise _bad("model", "is required: a string naming a model of GET /v1/models")
    if model != served.name:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {served.name!r}", "model",
                       "not_found_error")
    if _integer(body, "n", 1) not in (None, 1):
        raise _bad("n", "only n = 1 is supported")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", f"must be true or false, got {type(stream).__name__}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise _bad("stream_options", "must be an object like {\"include_usage\": true}")
    if chat:
        messages = _messages(body, served)
        ids = served.tokenizer.encode_chat(messages)
    else:
        ids = _prompt_ids(body, served)
    max_tokens = _integer(body, "max_completion_tokens", 1) if chat else None
    max_tokens = _integer(body, "max_tokens", 1) or max_tokens
    room = served.max_context - len(ids)
    if max_tokens is None:
        max_tokens = max(1, min(16 if not chat else 256, room))
    if len(ids) + max_tokens > served.max_context:
        raise _bad("max_tokens", f"the prompt's {len(ids)} tokens plus max_tokens {max_tokens} exceed the model's "
                                 f"context of {served.max_context} tokens")
    temperature = _number(body, "temperature", 0, 2)
    top_p = _number(body, "top_p", 0, 1, low_open=True)
    top_k = _integer(body, "top_k", 1)
    seed = _integer(body, "seed", 0)
    sampler = make_sampler(1.0 if temperature is None else temperature, top_k, top_p, seed)
    procs = _processors(body, served)
    request = Request(ids, max_tokens, sampler=sampler, processors=tuple(procs))
    return ApiRequest(chat, ids, request, _stop_strings(body), stream, bool(options.get("include_usage", False)))


# --------------------------------------------------------------------- responses
def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(gen: ApiRequest, rid: str, model: str, text: str, finish: str, n_tokens: int) -> dict:
    created = int(time.time())
    if gen.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": usage(len(gen.prompt_ids), n_tokens)}


def chunk(gen: ApiRequest, rid: str, model: str, text: str | None, finish: str | None, first: bool = False) -> dict:
    if gen.chat:
        delta = {"role": "assistant", "content": ""} if first else ({} if text is None else {"content": text})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}


def usage_chunk(gen: ApiRequest, rid: str, model: str, n_tokens: int) -> dict:
    obj = "chat.completion.chunk" if gen.chat else "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(len(gen.prompt_ids), n_tokens)}
