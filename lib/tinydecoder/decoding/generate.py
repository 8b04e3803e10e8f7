"""The generation loop: prefill once, then feed only the newly chosen token each step
(on the fast path, `fast.forward`; on the reference path, `reference.forward`, when kernels
are given)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import fast
from ..core import reference
from ..core.config import Config
from ..core.kernels import Kernels
from ..core.model import Model
from ..core.validate import check_context, check_token_ids
from ..core.validate import max_new_tokens as check_max_new_tokens
from .sampling import greedy


@dataclass
class Event:
    step: int  # 1-based round
    phase: str  # "prefill" (the first round) or "decode"
    input_rows: int  # positions fed to the model this round
    context_tokens: int  # positions in context after this round (= cache length)
    next_token: int  # the token chosen from this round's last-position logits
    logits: np.ndarray | None  # the last position's logits [V]; None when generate(keep_logits=False)

    def to_dict(self) -> dict:
        return {"step": self.step, "phase": self.phase, "input_rows": self.input_rows,
                "context_tokens": self.context_tokens, "next_token": self.next_token,
                "logits": None if self.logits is None else [float(x) for x in self.logits]}


@dataclass
class Generation:
    tokens: list  # the prompt followed by the generated tokens
    prompt_length: int
    events: list = field(default_factory=list)
    projected_rows: int = 0  # positions pushed through the projections, summed over layers
    score_pairs: int = 0  # query-key pairs scored, summed over layers and query heads
    cache: object = None  # the KV cache after the last round (None for full recompute)

    @property
    def new_tokens(self) -> list:
        return self.tokens[self.prompt_length:]

    def to_dict(self) -> dict:
        return {"tokens": list(self.tokens), "projected_rows": self.projected_rows,
                "score_pairs": self.score_pairs, "events": [e.to_dict() for e in self.events]}


def work_counts(config: Config, past: int, new: int) -> tuple:
    """Work of one forward call over `new` positions after `past` cached ones.

    projected rows = L * new; score pairs = L * Hq * sum_{i<new} (past + i + 1)."""
    pairs_per_head = new * past + new * (new + 1) // 2
    return config.n_layers * new, config.n_layers * config.n_heads * pairs_per_head


def tokens_fed(cache) -> int:
    """Tokens a cache has consumed: len(cache), unless it evicts (a SinkCache holds fewer
    positions than it was fed and says how many with `tokens_seen`)."""
    return getattr(cache, "tokens_seen", len(cache))


def generate(model: Model, prompt, max_new_tokens: int, *, sampler=greedy, use_cache: bool = True,
             cache=None, stop_tokens=(), on_token=None, processors=(), keep_logits: bool = True,
             kernels: Kernels | None = None) -> Generation:
    """Generate up to `max_new_tokens` tokens after `prompt`.

    use_cache=True: round 1 prefills the prompt into a KV cache, every later round feeds only
    the token chosen in the round before. use_cache=False recomputes the whole context every
    round (full recompute: the same numbers, far more work). A cache passed in may already hold a prefix of the
    prompt; only the rest is prefilled. `sampler(logits) -> id` picks each token (greedy by
    default); generation stops after a token in `stop_tokens`; `on_token(id)` streams.
    `processors` (see tinydecoder.decoding.processors) rewrite the last logits, given the tokens so far,
    before the sampler sees them; a stopping rule among them (`is_done`) can end generation.
    Every round's Event keeps its logits ([V] floats: 196 KB a step for SmolLM2, 373 MB over
    1,900 steps); keep_logits=False keeps None instead, so a long run's memory stays the
    weights plus the cache. `kernels` (a `Kernels`, e.g. a learner's own attention) runs every
    round on the reference path with those primitives instead of the fast path."""
    from .processors import apply_processors, check_processors, should_stop, start_processors

    processors = check_processors(processors)
    if kernels is not None and not isinstance(kernels, Kernels):
        raise TypeError(f"kernels must be a tinydecoder Kernels (or None for the fast path), got {type(kernels).__name__}")
    cfg = model.config
    check_max_new_tokens(max_new_tokens)
    tokens = [int(t) for t in check_token_ids(cfg, prompt)]
    needed = check_context(cfg, 0, len(tokens), max_new_tokens)  # positions the cache must hold
    if use_cache:
        if cache is None:
            cache = model.new_cache(capacity=needed)
        else:
            cache.check(cfg, model.dtype)
            if tokens_fed(cache) >= len(tokens):
                raise ValueError(f"the cache already holds {tokens_fed(cache)} positions; the prompt "
                                 f"({len(tokens)} tokens) must extend it by at least one token")
    elif cache is not None:
        raise ValueError("use_cache=False recomputes everything; do not pass a cache")
    result = Generation(tokens=tokens, prompt_length=len(tokens), cache=cache if use_cache else None)
    start_processors(processors, tokens)
    for step in range(1, max_new_tokens + 1):
        past = len(cache) if use_cache else 0  # positions attended to
        new = tokens[tokens_fed(cache) if use_cache else 0:]
        context = cache if use_cache else None
        logits = (fast.forward(model, new, context, last_only=True) if kernels is None else
                  reference.forward(model, new, context, last_only=True, kernels=kernels))[-1]  # [V]
        rows, pairs = work_counts(cfg, past, len(new))
        result.projected_rows += rows
        result.score_pairs += pairs
        token = int(sampler(apply_processors(processors, tokens, logits) if processors else logits))
        result.events.append(Event(step, "prefill" if step == 1 else "decode", len(new),
                                   past + len(new), token, logits if keep_logits else None))
        tokens.append(token)
        if on_token is not None:
            on_token(token)
        if token in stop_tokens or should_stop(processors, tokens, result.prompt_length):
            break
    return result
