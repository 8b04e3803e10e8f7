"""Chapter 07's exercise: the cached generation loop.

    cached_greedy(step, prompt, max_new_tokens) -> [new token ids]

step(ids, positions) runs the model on the rows `ids` at `positions` and appends their K/V to
its cache; it returns logits [len(ids), V]. Round 1 feeds the whole prompt at 0..P-1; every
later round feeds only the token chosen in the round before, at the position right after
everything already cached. Greedy: the next token is the argmax of the last row's logits.
The library's answer: `decoding.cached_loop.cached_greedy`.
"""
from __future__ import annotations

import numpy as np

from ...core.toy import toy_model
from ...decoding.cached_loop import cached_greedy, model_step
from .case import Case

_MODEL = []


def _model():
    if not _MODEL:
        _MODEL.append(toy_model())
    return _MODEL[0]


class _Recorder:
    """The toy model as a step, with a log of every call: (ids, positions)."""

    def __init__(self):
        self.inner, self.calls = model_step(_model()), []

    def __call__(self, ids, positions):
        ids = [int(t) for t in np.asarray(ids).reshape(-1)]
        positions = [int(p) for p in np.asarray(positions).reshape(-1)]
        self.calls.append((ids, positions))
        return self.inner(ids, positions)


def _run(fn, prompt, n):
    step = _Recorder()
    out = fn(step, list(prompt), n)
    if out is None:
        raise ValueError("the function returned None: return the list of new token ids")
    return [int(t) for t in out], step.calls


def _prompt_once(fn) -> bool:  # round 1 feeds the whole prompt, at 0..P-1
    _, calls = _run(fn, [0, 1, 2, 3], 3)
    return bool(calls) and calls[0] == ([0, 1, 2, 3], [0, 1, 2, 3])


def _one_token_per_step(fn) -> bool:  # every later round feeds one token: the one chosen last
    new, calls = _run(fn, [0, 1, 2, 3], 4)
    return len(calls) > 1 and all(ids == [new[j]] for j, (ids, _) in enumerate(calls[1:]))


def _positions(fn) -> bool:  # the token fed in round j + 2 sits at P + j
    _, calls = _run(fn, [5, 4, 3], 4)
    return len(calls) > 1 and all(pos == [3 + j] for j, (_, pos) in enumerate(calls[1:]))


def _count(fn) -> bool:
    new, _ = _run(fn, [0, 1, 2, 3], 5)
    return len(new) == 5


def _calls(fn) -> bool:  # the last chosen token needs no forward call of its own
    _, calls = _run(fn, [0, 1, 2, 3], 5)
    return len(calls) == 5


def _one_new(fn) -> bool:
    new, calls = _run(fn, [2, 0, 1], 1)
    return len(new) == 1 and len(calls) == 1


def _vs_library(fn) -> bool:
    prompt = [1, 5, 0, 2, 2, 4]
    return _run(fn, prompt, 6)[0] == cached_greedy(model_step(_model()), prompt, 6)


CACHED_GREEDY = [
    Case("the prompt is fed once, whole", "round 1 feeds every prompt token, at positions 0 .. P-1",
         _prompt_once),
    Case("one new token per later step", "the cache already holds everything before: feed only the token "
         "you chose in the round before", _one_token_per_step),
    Case("positions continue after the prompt", "a new token's position is the number of positions "
         "already in the cache", _positions),
    Case("max_new_tokens tokens come back", "return exactly max_new_tokens new ids, without the prompt",
         _count),
    Case("n forward calls for n tokens", "the last chosen token is returned, not fed: n new tokens take n "
         "calls of step", _calls),
    Case("max_new_tokens = 1: the prefill alone", "one token comes from the prefill's last row", _one_new),
    Case("the tokens equal the library's", "greedy: the argmax of the last row of each call's logits",
         _vs_library),
]

EXERCISES = {"cached_greedy": CACHED_GREEDY}
REFERENCES = {"cached_greedy": cached_greedy}
