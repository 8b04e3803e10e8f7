"""Text in, text out on SmolLM2: a prompt (or a conversation) through the chat template, tokens
streamed back as text (`generate_text`), timed (`timed_generate`), and a conversation that keeps
its turns (`Chat`). The model and tokenizer come from `checkpoint.smollm2`.

    generate_text("What is the capital of France?", chat=True).text
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..decoding.generate import Generation, generate
from ..decoding.sampling import greedy
from .smollm2 import ENDOFTEXT_ID, IM_END_ID, load_smollm2, smollm2_tokenizer


@dataclass
class TextGeneration:
    """What `generate_text` produced, with its timings."""

    prompt_token_ids: list
    token_ids: list  # the new tokens only (a stop token included when generation stopped at one)
    text: str  # the new text (a final stop token is not included)
    prefill_seconds: float  # prompt in -> first token out
    decode_seconds: float  # first token out -> last token out
    cache_bytes: int  # the KV cache's K and V rows after the last step (0 without a cache)
    stopped: bool = False  # ended at a stop token rather than at max_new_tokens
    generation: Generation | None = field(default=None, repr=False)

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Tokens after the first, per second of decoding (None if only one token)."""
        steps = len(self.token_ids) - 1
        return steps / self.decode_seconds if steps > 0 and self.decode_seconds > 0 else None

    def to_dict(self) -> dict:
        return {"prompt_token_ids": list(self.prompt_token_ids), "token_ids": list(self.token_ids),
                "text": self.text, "prefill_seconds": self.prefill_seconds,
                "decode_tokens_per_second": self.decode_tokens_per_second, "cache_bytes": self.cache_bytes}


def timed_generate(model, prompt_ids, max_new_tokens, *, sampler=None, use_cache=True, cache=None,
                   stop_tokens=(), on_token=None, processors=(), keep_logits: bool = True) -> tuple:
    """`generate` plus the time to the first token and from the first to the last.
    Returns (Generation, prefill_seconds, decode_seconds)."""
    times = []

    def record(token):
        times.append(time.perf_counter())
        if on_token is not None:
            on_token(token)

    start = time.perf_counter()
    gen = generate(model, prompt_ids, max_new_tokens, sampler=sampler or greedy, use_cache=use_cache,
                   cache=cache, stop_tokens=stop_tokens, on_token=record, processors=processors,
                   keep_logits=keep_logits)
    return gen, times[0] - start, times[-1] - times[0]


def generate_text(prompt, *, chat: bool = False, max_new_tokens: int = 64, temperature=None,
                  top_k=None, top_p=None, seed=None, use_cache: bool = True, cache=None,
                  on_text=None, model=None, tokenizer=None, processors=(), stop=(),
                  keep_logits: bool = False, weights: str = "f32") -> TextGeneration:
    """Continue `prompt` with SmolLM2 (or the model/tokenizer given), streaming text to `on_text`.

    prompt: a string, or a list of {"role", "content"} messages (implies chat=True).
    chat=True writes the prompt with the chat template (a string becomes one user message).
    Generation stops at <|im_end|> (the end of a turn) or <|endoftext|>. Greedy unless temperature,
    top_k or top_p is given (see tinydecoder.decoding.sampling.make_sampler; seed makes it repeatable).
    cache: a KV cache that already holds a prefix of the prompt's tokens (see Chat).
    processors: logits processors (core.processors); stop: strings that end generation
    when the text contains one (the text is cut before it; streaming holds back what could be
    the start of a stop string). keep_logits: whether the Generation's events keep every
    round's logits (off: a long reply's memory stays the weights plus the cache; see generate).
    weights: load_smollm2's choice ("f32" or "q4_1") when no model is given."""
    tok = smollm2_tokenizer() if tokenizer is None else tokenizer
    if not isinstance(prompt, str):
        chat, messages = True, prompt
    else:
        messages = [{"role": "user", "content": prompt}]
    prompt_ids = tok.encode_chat(messages) if chat else tok.encode(prompt)
    if not prompt_ids:
        raise ValueError("the prompt is empty: give some text to continue")
    model = load_smollm2(weights) if model is None else model  # after the prompt is known to be good
    sampler = None
    if temperature is not None or top_k is not None or top_p is not None or seed is not None:
        from ..decoding.sampling import make_sampler

        sampler = make_sampler(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    stop_tokens = (IM_END_ID, ENDOFTEXT_ID)
    stop_text = None
    if stop:
        from ..decoding.processors import StopSequences

        stop_text = StopSequences(stop, lambda ids: tok.decode([i for i in ids if i not in stop_tokens]))
        processors = list(processors) + [stop_text]
    hold = max((len(s) for s in stop_text.stops), default=1) - 1 if stop_text else 0
    stream = tok.stream()
    pieces, shown = [], [0]  # shown[0]: characters already passed to on_text

    def emit(final=False):
        text = "".join(pieces)
        safe = stop_text.trim(text) if stop_text else text
        if not final and stop_text and len(safe) == len(text):
            safe = text[:max(0, len(text) - hold)]  # could be the start of a stop string
        if on_text is not None and len(safe) > shown[0]:
            on_text(safe[shown[0]:])
            shown[0] = len(safe)
        return safe

    def on_token(token):
        if token in stop_tokens:
            return
        pieces.append(stream.step(token))
        emit()

    gen, prefill_s, decode_s = timed_generate(model, prompt_ids, max_new_tokens, sampler=sampler,
                                              use_cache=use_cache, cache=cache, stop_tokens=stop_tokens,
                                              on_token=on_token, processors=processors, keep_logits=keep_logits)
    new = gen.new_tokens
    text = emit(final=True)
    return TextGeneration(prompt_token_ids=list(prompt_ids), token_ids=list(new), text=text,
                          prefill_seconds=prefill_s, decode_seconds=decode_s,
                          cache_bytes=gen.cache.nbytes if gen.cache is not None else 0,
                          stopped=bool(new) and (new[-1] in stop_tokens or len(text) < len("".join(pieces))),
                          generation=gen)


class Chat:
    """A multi-turn conversation that keeps its KV cache between turns.

        chat = Chat()
        chat.say("What is the capital of France?")   # -> 'The capital of France is Paris.'
        chat.say("And of Italy?")                     # only the new turn is prefilled

    Each turn re-encodes the whole conversation with the chat template, keeps the cached
    positions whose tokens are unchanged, and prefills only the rest."""

    def __init__(self, system_prompt: str | None = None, *, model=None, tokenizer=None):
        self.model = load_smollm2() if model is None else model
        self.tokenizer = smollm2_tokenizer() if tokenizer is None else tokenizer
        self.messages = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
        self.cache = None
        self.cached_ids = []  # the tokens whose K/V the cache holds
        self.last: TextGeneration | None = None

    def say(self, text: str, *, max_new_tokens: int = 128, on_text=None, **sampling) -> str:
        """Add a user message, generate the reply (streamed to on_text), return its text."""
        messages = self.messages + [{"role": "user", "content": text}]
        prompt_ids = self.tokenizer.encode_chat(messages)
        keep = 0
        while keep < min(len(self.cached_ids), len(prompt_ids) - 1) and \
                self.cached_ids[keep] == prompt_ids[keep]:
            keep += 1
        if keep:
            self.cache.truncate(keep)
        reply = generate_text(messages, max_new_tokens=max_new_tokens, on_text=on_text,
                              cache=self.cache if keep else None, model=self.model,
                              tokenizer=self.tokenizer, **sampling)
        self.cache = reply.generation.cache
        self.cached_ids = (reply.prompt_token_ids + reply.token_ids)[:len(self.cache)]
        self.messages = messages + [{"role": "assistant", "content": reply.text}]
        self.last = reply
        return reply.text
