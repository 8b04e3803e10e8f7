"""Drafts for speculative decoding: cheap guesses of the next few tokens, checked by the target.

A draft has `vocab_size` and `propose(tokens, k, policy) -> (ids, q)`: up to k guessed ids that
would follow `tokens`, and `q` [n, V], the distribution each guess was drawn from (None when the
draft is deterministic: then q is one-hot on each guess). It may return fewer than k ids, or
none (the step is then a plain decode step). `policy` (see speculative.Policy) turns a draft's
logits into a token and its distribution, with the target's sampling settings.

Two drafts that need no second model (SmolLM2 has no smaller sibling sharing its tokenizer):
- PromptLookupDraft: find the last n tokens earlier in the context and propose what followed.
- ModelDraft(early_exit_model(model, L)): the first L blocks of the target itself, then the
  final norm and the tied head. Without training for it the middle layers' hidden state is not
  what the head expects, so its guesses are poor; LayerSkip (Elhoushi et al. 2024) trains a model
  with layer dropout and an early-exit loss so that such a draft agrees often.
A ModelDraft also wraps any separate model with the same vocabulary.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import fast
from ..core.model import Model
from ..core.validate import is_int


class PromptLookupDraft:
    """Propose the tokens that followed an earlier occurrence of the context's last n tokens
    (n from `max_ngram` down to `min_ngram`, longest match first; see `lookup`), at most
    `per_matched_token` guesses for each of the n matched tokens: a one-token match is weak
    evidence of a copy, a three-token match stronger. Deterministic: q is None (one-hot). Saxena
    2023, "prompt lookup decoding"; in Hugging Face `prompt_lookup_num_tokens`."""

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1, per_matched_token: int = 2):
        for name, value in (("vocab_size", vocab_size), ("max_ngram", max_ngram), ("min_ngram", min_ngram),
                            ("per_matched_token", per_matched_token)):
            if not is_int(value) or value < 1:
                raise ValueError(f"PromptLookupDraft: {name} must be an integer >= 1, got {value!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"PromptLookupDraft: min_ngram ({min_ngram}) must be <= max_ngram ({max_ngram})")
        self.vocab_size, self.max_ngram, self.min_ngram = int(vocab_size), int(max_ngram), int(min_ngram)
        self.per_matched_token = int(per_matched_token)
        self.name = "prompt-lookup"

    def propose(self, tokens, k: int, policy=None):
        return lookup(tokens, k, self.max_ngram, self.min_ngram, self.per_matched_token), None

    def __repr__(self) -> str:
        return (f"PromptLookupDraft(max_ngram={self.max_ngram}, min_ngram={self.min_ngram}, "
                f"per_matched_token={self.per_matched_token})")


def lookup(tokens, k: int, max_ngram: int = 3, min_ngram: int = 1, per_matched_token: int | None = None) -> list:
    """Up to k tokens (and, with per_matched_token, up to that many per matched token: n times
    it) that followed an earlier occurrence of the context's last n tokens (the longest n first):
    the latest occurrence followed by at least that many tokens, else the earliest (the one
    followed by the most). [] when no n-gram of the tail occurs before it."""
    seq = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        tail = seq[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)  # [T-n, n], all but the tail itself
        starts = np.flatnonzero((windows == tail).all(axis=1))
        if starts.size:
            k = k if per_matched_token is None else min(k, per_matched_token * n)
            full = starts[starts + n + k <= len(seq)]  # matches with k tokens after them
            follow = int(full[-1] if full.size else starts[0]) + n
            return [int(t) for t in seq[follow:follow + k]]
    return []


def early_exit_model(model: Model, n_layers: int) -> Model:
    """The first `n_layers` blocks of `model`, then its final norm and output head: a Model that
    shares every weight array with `model` (views, no copies), for L in 1..n_layers-1."""
    total = model.config.n_layers
    if not is_int(n_layers) or not 1 <= n_layers <= total - 1:
        raise ValueError(f"early exit after {n_layers!r} layers is not possible: L must be an integer in "
                         f"1..{total - 1} (this model has n_layers={total}; L={total} is the model itself)")
    cfg = dataclasses.replace(model.config, n_layers=int(n_layers), name=f"{model.config.name}[:{n_layers}]")
    return Model(cfg, embed=model.embed, layers=list(model.layers[:n_layers]), final_norm=model.final_norm,
                 pos_table=model.pos_table, lm_head=model.lm_head)


class ModelDraft:
    """A draft model that proposes k tokens one decode step at a time, with its own KV cache.

    The cache is kept in step with the target: before proposing, it is truncated to the longest
    prefix it shares with the accepted tokens (rejected guesses are rolled back), then the tokens
    it has not seen are fed in."""

    def __init__(self, model: Model, name: str | None = None):
        if not isinstance(model, Model):
            raise TypeError(f"ModelDraft needs a tinydecoder Model, got {type(model).__name__}")
        self.model, self.name = model, name or model.config.name
        self.vocab_size = model.config.vocab_size
        self.cache = model.new_cache(capacity=64)
        self.cached_tokens = []  # the ids whose K/V self.cache holds
        self.forward_calls = 0

    def sync(self, tokens) -> None:
        """Roll the cache back to the longest prefix of `tokens` it holds (at most all but the
        last token, so that the next forward has at least one row to compute)."""
        keep = 0
        limit = min(len(self.cached_tokens), len(tokens) - 1)
        while keep < limit and self.cached_tokens[keep] == tokens[keep]:
            keep += 1
        self.cache.truncate(keep)
        del self.cached_tokens[keep:]

    def propose(self, tokens, k: int, policy):
        tokens = [int(t) for t in tokens]
        self.sync(tokens)
        context, ids, qs = list(tokens), [], []
        for _ in range(k):
            new = context[len(self.cached_tokens):]
            logits = fast.forward(self.model, new, self.cache, last_only=True)[-1]  # [V]
            self.forward_calls += 1
            self.cached_tokens += new
            token, q = policy.pick(logits)
            ids.append(token)
            qs.append(q)
            context.append(token)
        q = None if policy.greedy else np.stack(qs)  # [k, V]; greedy: one-hot, left implicit
        return ids, q

    def __repr__(self) -> str:
        return f"ModelDraft({self.name}, {self.model.config.n_layers} layers)"


def make_draft(model: Model, spec):
    """A draft from a name: "prompt-lookup", or "early-exit:L" (the first L layers of `model`).
    A draft object is returned unchanged; a Model becomes a ModelDraft."""
    if isinstance(spec, Model):
        return ModelDraft(spec)
    if not isinstance(spec, str):
        if hasattr(spec, "propose") and hasattr(spec, "vocab_size"):
            return spec
        raise TypeError(f"draft must be 'prompt-lookup', 'early-exit:L', a Model or a draft object "
                        f"(with propose and vocab_size), got {type(spec).__name__}")
    name, _, arg = spec.partition(":")
    if name == "prompt-lookup" and not arg:
        return PromptLookupDraft(model.config.vocab_size)
    if name == "early-exit":
        try:
            n_layers = int(arg)
        except ValueError:
            raise ValueError(f"early exit needs a layer count, e.g. 'early-exit:8' (1..{model.config.n_layers - 1}), "
                             f"got {spec!r}") from None
        return ModelDraft(early_exit_model(model, n_layers), name=f"early-exit:{n_layers}")
    raise ValueError(f"unknown draft {spec!r}: use 'prompt-lookup' or 'early-exit:L' with L in "
                     f"1..{model.config.n_layers - 1}")
