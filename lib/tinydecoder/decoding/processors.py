"""Logits processors and stopping rules: small objects the generation loop runs every step.

    logits [V] --processor 1--> ... --processor n--> logits' [V] --sampler--> next id
    after the id is appended: stop if a stop token came out, or any rule's is_done(...) says so

A processor is called as `processor(tokens, logits) -> logits'` where `tokens` is the whole
context so far (prompt + generated) and `logits` one position's vector [V]; it returns a new
float64 vector (the input is never modified). A stopping rule has `is_done(tokens,
prompt_length) -> bool`; it may sit in the same list (its call leaves the logits alone).
`generate(..., processors=[...])`, `beam_search(..., processors=[...])` and the CLI accept them.

Rules, hand-checkable:
- RepetitionPenalty(r) (CTRL, Keskar et al. 2019; Hugging Face's rule): every token already in
  the context has its logit divided by r if positive, multiplied by r if negative. r > 1 discourages
  repeats, r = 1 changes nothing.
- FrequencyPenalty(a) / PresencePenalty(a) (OpenAI's rule): logit_j -= a * count_j, and
  logit_j -= a * [count_j > 0]; counts over the context given.
- MinP(m) (Nguyen et al. 2024): keep tokens with p_j >= m * max_i p_i (p at temperature 1, before
  the sampler's temperature, as llama.cpp's default chain does); the others become -inf.
- LogitBias({id: b}): logit_id += b; b = -inf bans the token.
- StopSequences(["\\n\\n"], decode): done once the generated text contains a stop string, even
  when it spans several tokens (the text is decoded, not the ids compared).
- MaxLength(n): done once the context holds n tokens (prompt included, as Hugging Face's max_length).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.validate import is_int, is_real
from .sampling import check_logits, probabilities


def _number(name: str, value, allowed: str) -> float:
    if not is_real(value) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return float(value)


def _counts(tokens, vocab_size: int) -> np.ndarray:
    """How many times each id occurs in `tokens`.  -> [V] int64"""
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token ids must be in 0..{vocab_size - 1} for these logits, got {ids.tolist()}")
    return np.bincount(ids, minlength=vocab_size)


class RepetitionPenalty:
    """Divide positive logits / multiply negative logits of tokens already seen by `penalty`."""

    def __init__(self, penalty):
        self.penalty = _number("repetition penalty", penalty, "a finite number > 0 (1 = off, > 1 penalises repeats)")
        if self.penalty <= 0:
            raise ValueError(f"repetition penalty must be a finite number > 0 (1 = off, > 1 penalises "
                             f"repeats), got {penalty!r}")

    def __call__(self, tokens, logits) -> np.ndarray:
        out = check_logits(logits)  # a new float64 array
        seen = np.flatnonzero(_counts(tokens, out.size))  # each seen id once, however often it occurs
        z = out[seen]
        out[seen] = np.where(z > 0, z / self.penalty, z * self.penalty)
        return out

    def __repr__(self) -> str:
        return f"RepetitionPenalty({self.penalty})"


class FrequencyPenalty:
    """logit_j -= alpha * (times j occurs in the context)."""

    def __init__(self, alpha):
        self.alpha = _number("frequency penalty", alpha, "a finite number (OpenAI allows -2..2)")

    def __call__(self, tokens, logits) -> np.ndarray:
        out = check_logits(logits)
        return out - self.alpha * _counts(tokens, out.size)

    def __repr__(self) -> str:
        return f"FrequencyPenalty({self.alpha})"


class PresencePenalty:
    """logit_j -= alpha once if j occurs in the context at all."""

    def __init__(self, alpha):
        self.alpha = _number("presence penalty", alpha, "a finite number (OpenAI allows -2..2)")

    def __call__(self, tokens, logits) -> np.ndarray:
        out = check_logits(logits)
        return out - self.alpha * (_counts(tokens, out.size) > 0)

    def __repr__(self) -> str:
        return f"PresencePenalty({self.alpha})"


class MinP:
    """Keep the tokens whose probability is at least min_p times the best one's."""

    def __init__(self, min_p):
        self.min_p = _number("min_p", min_p, "a number in [0, 1] (0 = off)")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be a number in [0, 1] (0 = off), got {min_p!r}")

    def __call__(self, tokens, logits) -> np.ndarray:
        out = check_logits(logits)  # a new float64 array
        probs = probabilities(out)  # [V] float64
        out[probs < self.min_p * probs.max()] = -np.inf  # the best token always stays
        return out

    def __repr__(self) -> str:
        return f"MinP({self.min_p})"


class LogitBias:
    """Add a fixed bias to chosen ids' logits ({id: bias}; -inf bans a token)."""

    def __init__(self, bias: dict):
        if not isinstance(bias, dict) or not bias:
            raise ValueError(f"logit bias must be a non-empty dict {{token id: bias}}, got {bias!r}")
        for i, b in bias.items():
            if not is_int(i) or i < 0:
                raise ValueError(f"logit bias keys must be token ids (integers >= 0), got {i!r}")
            if not is_real(b) or math.isnan(b) or b == math.inf:
                raise ValueError(f"the bias of token {i} must be a finite number or -inf (ban), got {b!r}")
        self.ids = np.array(sorted(bias), dtype=np.int64)
        self.values = np.array([float(bias[i]) for i in sorted(bias)])

    def __call__(self, tokens, logits) -> np.ndarray:
        out = check_logits(logits)  # a new float64 array
        if self.ids[-1] >= out.size:
            raise ValueError(f"logit bias names token {int(self.ids[-1])}, but the vocabulary has "
                             f"{out.size} ids (0..{out.size - 1})")
        out[self.ids] += self.values
        if not np.isfinite(out).any():
            raise ValueError("the logit bias banned every token: nothing can be chosen")
        return out

    def __repr__(self) -> str:
        return f"LogitBias({dict(zip(self.ids.tolist(), self.values.tolist()))})"


class StopSequences:
    """Stop once the generated text contains one of `stops`; `decode(ids) -> str` gives the text.

    Matching the decoded text, not token ids, catches a stop string split across tokens
    ("\\n" + "\\n") or ending inside one token ("\\n\\nThe")."""

    def __init__(self, stops, decode):
        stops = [stops] if isinstance(stops, str) else list(stops)
        if not stops or not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"stop sequences must be non-empty strings, got {stops!r}")
        if not callable(decode):
            raise TypeError("StopSequences needs decode(ids) -> str, e.g. tokenizer.decode")
        self.stops, self.decode = stops, decode

    def __call__(self, tokens, logits):
        return logits  # a stopping rule: the logits pass through

    def find(self, text: str):
        """(index, stop) of the earliest stop string in `text`, or None."""
        hits = [(text.find(s), s) for s in self.stops if s in text]
        return min(hits) if hits else None

    def is_done(self, tokens, prompt_length: int) -> bool:
        return self.find(self.decode(list(tokens)[prompt_length:])) is not None

    def trim(self, text: str) -> str:
        """`text` up to (not including) its first stop string."""
        hit = self.find(text)
        return text if hit is None else text[:hit[0]]

    def __repr__(self) -> str:
        return f"StopSequences({self.stops!r})"


class MaxLength:
    """Stop once the context (prompt + generated) holds `max_length` tokens."""

    def __init__(self, max_length):
        if not is_int(max_length) or max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1 (prompt + new tokens), got {max_length!r}")
        self.max_length = int(max_length)

    def __call__(self, tokens, logits):
        return logits

    def is_done(self, tokens, prompt_length: int) -> bool:
        return len(tokens) >= self.max_length

    def __repr__(self) -> str:
        return f"MaxLength({self.max_length})"


def check_processors(processors) -> list:
    """The processors as a list; a clear error for anything that is not one."""
    if processors is None:
        return []
    if callable(processors):
        processors = [processors]
    processors = list(processors)
    for p in processors:
        if not callable(p):
            raise TypeError(f"a processor must be callable as processor(tokens, logits) -> logits, got {p!r}")
    return processors


def start_processors(processors, prompt) -> None:
    """A new sequence begins after `prompt`: processors that keep per-sequence state (a grammar's
    parser state, see decoding.grammar) have a `start(prompt)` method, called here."""
    for p in processors:
        if hasattr(p, "start"):
            p.start(prompt)


def apply_processors(processors, tokens, logits):
    """Run each processor in order on one position's logits.  [V] -> [V]"""
    for p in processors:
        logits = p(tokens, logits)
    return logits


def should_stop(processors, tokens, prompt_length: int) -> bool:
    """Whether any stopping rule in the list says generation is done."""
    return any(p.is_done(tokens, prompt_length) for p in processors if hasattr(p, "is_done"))
