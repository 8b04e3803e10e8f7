"""Speculative decoding: a cheap draft guesses k tokens, the target checks them all in ONE pass.

    tokens = prompt;  prefill the prompt, pick token 1             (as generate's first round)
    repeat:
        x_1..x_n = draft.propose(tokens, k)                        # n <= k, maybe 0
        logits = fast.forward(target, [last token, x_1..x_n], cache)    # [n+1, V]: one pass, n+1 rows
        keep the longest prefix x_1..x_a the target agrees with,
        then one token from the target (a correction, or a bonus when all n were kept)
        cache.truncate(len(tokens) - 1)                            # forget the rejected rows

A decode step reads every weight once for one row; reading them once for n+1 rows costs about
the same (notebook 11's roofline: decode is memory-bound), so each pass yields 1..n+1 tokens.

Greedy: accept x_i iff it is the target's argmax there. The n+1-row pass computes the logits of
single-row steps up to float rounding (a differently shaped matmul sums in another order), not
bit for bit; so the output is `generate`'s token for token unless, at some position, the target's
two best logits are closer than that rounding (a tie up to rounding, where either is its argmax).
lessons/speculative_lab.py `greedy_rounding` measures both on a run. Sampling: the rule of Leviathan et al. 2023 and
Chen et al. 2023: accept x ~ q with probability min(1, p(x)/q(x)), otherwise draw from
norm(max(0, p - q)); the output is then distributed exactly as p (see accept_or_resample).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import fast
from ..core.model import Model
from ..core.validate import check_context, check_token_ids, is_int
from .drafts import make_draft
from .sampling import Sampler, draw, greedy, is_greedy, sampling_distribution


class Policy:
    """How a token is chosen from logits, shared by target and draft: greedy, or sampled with
    (temperature, top_k, top_p) from one seeded random stream `rng`."""

    def __init__(self, temperature=None, top_k=None, top_p=None, rng=None):
        self.greedy = is_greedy(temperature, top_k, top_p)
        self.settings = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        self.rng = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng

    def distribution(self, logits) -> np.ndarray:
        """[V] float64: what a token is drawn from (one-hot on the argmax when greedy)."""
        return sampling_distribution(logits, **self.settings)

    def pick(self, logits) -> tuple:
        """(token id, its distribution q [V] or None when greedy)."""
        if self.greedy:
            return int(np.argmax(logits)), None
        q = self.distribution(logits)
        return draw(q, self.rng), q


def make_policy(sampler=None, temperature=None, top_k=None, top_p=None, seed=None) -> Policy:
    """A Policy from `sampler` (None or tinydecoder.greedy: greedy; a sampling.Sampler: its
    settings and random stream) or from the settings themselves (not both)."""
    settings_given = any(v is not None for v in (temperature, top_k, top_p, seed))
    if sampler is None or sampler is greedy:
        return Policy(temperature, top_k, top_p, seed)
    if settings_given:
        raise ValueError("give either sampler= or temperature/top_k/top_p/seed, not both")
    if isinstance(sampler, Sampler):
        return Policy(sampler.temperature, sampler.top_k, sampler.top_p, sampler.rng)
    raise TypeError(f"speculative sampling needs the distribution a token is drawn from, not only a "
                    f"draw: pass sampler=None, tinydecoder.greedy or a sampling.Sampler (make_sampler), "
                    f"or temperature/top_k/top_p/seed; got {sampler!r}")


def accept_or_resample(p, q, x, u, v) -> tuple:
    """The speculative sampling rule for N guesses at once (vectorised).

    p, q: [V] or [N, V], target and draft distributions; x: [N] ids drawn from q; u, v: [N]
    uniforms in [0, 1). Guess x is kept when u < p(x) / q(x) (probability min(1, p/q)); a rejected
    one is replaced by a draw (inverse CDF at v) from the residual norm(max(0, p - q)).
    Returns (tokens [N], accepted [N] bool). Why the result is distributed as p: a token y comes
    out as an accepted guess with probability q(y) min(1, p(y)/q(y)) = min(p(y), q(y)); rejection
    happens with probability 1 - sum min(p, q) = sum max(0, p - q), and then y is drawn with
    probability max(0, p(y) - q(y)) / sum max(0, p - q); together min(p, q) + max(0, p - q) = p."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    x = np.asarray(x, dtype=np.int64)
    p2, q2 = np.broadcast_to(p, (x.size, p.shape[-1])), np.broadcast_to(q, (x.size, q.shape[-1]))
    rows = np.arange(x.size)
    px, qx = p2[rows, x], q2[rows, x]  # [N]
    accepted = np.asarray(u) * qx < px  # u < p/q, without dividing by a zero q
    residual = np.maximum(p - q, 0.0)  # [V] or [N, V]
    mass = residual.sum(axis=-1, keepdims=True)
    residual = np.where(mass > 0, residual, p)  # p == q: never rejected; guard the 0/0 anyway
    cdf = np.cumsum(residual, axis=-1)
    cdf2 = np.broadcast_to(cdf, (x.size, cdf.shape[-1]))
    target = np.asarray(v) * cdf2[:, -1]  # [N]
    resampled = np.minimum((cdf2 <= target[:, None]).sum(axis=-1), cdf.shape[-1] - 1)  # first cdf > target
    return np.where(accepted, x, resampled), accepted


def acceptance_rate(p, q) -> float:
    """The probability a guess x ~ q is kept: sum_y min(p(y), q(y)) = 1 - TV(p, q)."""
    return float(np.minimum(np.asarray(p, np.float64), np.asarray(q, np.float64)).sum())


def expected_tokens_per_step(alpha, k: int):
    """Mean tokens one verification pass yields when each of k guesses is kept with probability
    alpha, independently, until the first rejection: 1 + alpha + ... + alpha^k
    = (1 - alpha^(k+1)) / (1 - alpha)."""
    alpha = np.asarray(alpha, dtype=np.float64)
    return np.sum(alpha[..., None] ** np.arange(k + 1), axis=-1)  # the sum: also right at alpha = 1


@dataclass
class Step:
    """One verification pass: the draft's guesses, how many the target kept, and its own token."""
    proposed: list
    accepted: int
    target_token: int  # the correction (accepted < len(proposed)) or the bonus token

    @property
    def tokens(self) -> list:
        return self.proposed[:self.accepted] + [self.target_token]


class DraftLength:
    """How many guesses the next pass may carry, adapted from the passes so far. The length rule is
    Hugging Face transformers' heuristic for assisted generation (`num_assistant_tokens_schedule=
    "heuristic"`), here capped at k; the pause is this library's own:

    - every guess of a pass kept: the next pass may carry 2 more (up to k); otherwise 1 fewer
      (down to 1), so a wrong guess costs a narrower pass next time;
    - `patience` passes in a row whose guesses were all rejected: guess nothing for `pause`
      passes (plain decode steps, which cost nothing extra), the pause doubling each time this
      repeats (up to `max_pause`) until a guess is kept again.

    A draft that is right keeps its k; one that is never right costs a few wide passes, then
    almost none. Greedy output does not depend on it (the target decides every token), and with
    sampling the rule stays exact (the length depends only on earlier passes)."""

    def __init__(self, k: int, patience: int = 2, pause: int = 4, max_pause: int = 64):
        self.k, self.patience, self.first_pause, self.max_pause = k, patience, pause, max_pause
        self.length, self.misses, self.paused, self.pause = k, 0, 0, pause

    def next(self) -> int:
        """Guesses allowed in the next pass (0 while paused)."""
        if self.paused:
            self.paused -= 1
            return 0
        return self.length

    def update(self, proposed: int, accepted: int) -> None:
        """After a pass that carried `proposed` guesses of which `accepted` were kept."""
        if proposed == 0:
            return
        self.length = min(self.k, self.length + 2) if accepted == proposed else max(1, self.length - 1)
        if accepted:
            self.misses, self.pause = 0, self.first_pause
            return
        self.misses += 1
        if self.misses >= self.patience:
            self.paused, self.misses = self.pause, 0
            self.pause = min(self.max_pause, 2 * self.pause)


@dataclass
class SpeculativeGeneration:
    tokens: list  # the prompt followed by the generated tokens
    prompt_length: int
    draft_name: str = ""
    draft_tokens: int = 0  # k
    steps: list = field(default_factory=list)  # one Step per verification pass (not the prefill)
    target_forward_calls: int = 0  # the prefill plus one per Step
    cache: object = None  # the target's KV cache: always len(tokens) - 1 positions
    paused_steps: int = 0  # passes in which DraftLength let the draft guess nothing (adaptive runs)

    @property
    def new_tokens(self) -> list:
        return self.tokens[self.prompt_length:]

    @property
    def draft_tokens_proposed(self) -> int:
        return sum(len(s.proposed) for s in self.steps)

    @property
    def draft_tokens_accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def accepted_per_step(self) -> list:
        return [s.accepted for s in self.steps]

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed guesses (0.0 when nothing was proposed)."""
        return self.draft_tokens_accepted / self.draft_tokens_proposed if self.draft_tokens_proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        """New tokens per target forward pass (plain decoding: exactly 1)."""
        return len(self.new_tokens) / self.target_forward_calls

    def to_dict(self) -> dict:
        return {"tokens": list(self.tokens), "prompt_length": self.prompt_length, "draft": self.draft_name,
                "draft_tokens": self.draft_tokens, "draft_tokens_proposed": self.draft_tokens_proposed,
                "draft_tokens_accepted": self.draft_tokens_accepted,
                "target_forward_calls": self.target_forward_calls, "accepted_per_step": self.accepted_per_step,
                "paused_steps": self.paused_steps}


def verify(logits, proposed: list, q, policy: Policy) -> tuple:
    """(accepted count a, the target's token after the first a guesses) from the target's
    logits [n+1, V] over [last token, x_1..x_n]; q [n, V] the draft's distributions or None
    (a deterministic draft: one-hot)."""
    if policy.greedy:
        choices = np.argmax(logits, axis=-1)  # [n+1]: the target's greedy token after each prefix
        a = 0
        while a < len(proposed) and proposed[a] == int(choices[a]):
            a += 1
        return a, int(choices[a])
    for i, x in enumerate(proposed):
        p = policy.distribution(logits[i])  # [V]
        if q is None:
            qi = np.zeros_like(p)
            qi[x] = 1.0
        else:
            qi = q[i]
        u, v = policy.rng.random(2)
        token, kept = accept_or_resample(p, qi, [x], [u], [v])
        if not kept[0]:
            return i, int(token[0])
    return len(proposed), draw(policy.distribution(logits[len(proposed)]), policy.rng)


def _check_count(name: str, value, low: int = 1) -> int:
    if not is_int(value) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def speculative_generate(model: Model, prompt, max_new_tokens: int, draft="prompt-lookup", *,
                         draft_tokens: int = 4, sampler=None, temperature=None, top_k=None, top_p=None,
                         seed=None, stop_tokens=(), on_token=None, on_step=None,
                         adaptive: bool = True) -> SpeculativeGeneration:
    """Generate up to `max_new_tokens` after `prompt` with a draft checked by `model`.

    draft: "prompt-lookup", "early-exit:L", a Model of the same vocabulary, or a draft object
    (see tinydecoder.decoding.drafts). draft_tokens: k, the most guesses per pass (fewer near the end, so
    that no pass yields more than max_new_tokens). Greedy by default (the same tokens as
    `generate`); sampler= a sampling.Sampler, or temperature/top_k/top_p/seed, samples with the
    speculative rule. Stops after a token in `stop_tokens`; `on_token(id)` streams each token,
    `on_step(result)` is called after each verification pass (the cache already rolled back).
    adaptive (default): the guesses per pass follow `DraftLength` (fewer after a miss, none for a
    while when guesses keep failing); adaptive=False: always up to k."""
    cfg = model.config
    max_new_tokens = _check_count("max_new_tokens", max_new_tokens)
    k = _check_count("draft_tokens (k, guesses per step)", draft_tokens)
    tokens = [int(t) for t in check_token_ids(cfg, prompt)]
    needed = check_context(cfg, 0, len(tokens), max_new_tokens)  # positions the cache must hold
    draft = make_draft(model, draft)
    if draft.vocab_size != cfg.vocab_size:
        raise ValueError(f"the draft {draft!r} has a vocabulary of {draft.vocab_size} tokens but the target has "
                         f"{cfg.vocab_size}: a draft must share the target's tokenizer")
    policy = make_policy(sampler, temperature, top_k, top_p, seed)
    cache = model.new_cache(capacity=needed)
    result = SpeculativeGeneration(tokens=tokens, prompt_length=len(tokens), draft_name=getattr(draft, "name", repr(draft)),
                                   draft_tokens=k, cache=cache)

    def emit(new) -> bool:
        """Append the step's tokens up to a stop token; True when generation is over."""
        for token in new:
            tokens.append(token)
            if on_token is not None:
                on_token(token)
            if token in stop_tokens:
                cache.truncate(len(tokens) - 1)
                return True
        return len(tokens) - result.prompt_length >= max_new_tokens

    length = DraftLength(k) if adaptive else None
    logits = fast.forward(model, tokens, cache, last_only=True)[-1]  # prefill: [V]
    result.target_forward_calls = 1
    done = emit([policy.pick(logits)[0]])
    while not done:
        allowed = k if length is None else length.next()
        result.paused_steps += allowed == 0
        budget = min(allowed, max_new_tokens - (len(tokens) - result.prompt_length) - 1)
        proposed, q = draft.propose(list(tokens), budget, policy) if budget > 0 else ([], None)
        proposed = [int(t) for t in proposed[:budget]]
        if proposed:
            check_token_ids(cfg, proposed)
        logits = fast.forward(model, [tokens[-1]] + proposed, cache, last_only=not proposed)  # [n+1, V]
        result.target_forward_calls += 1
        accepted, token = verify(logits, proposed, q, policy)
        if length is not None:
            length.update(len(proposed), accepted)
        cache.truncate(len(tokens) + accepted)  # keeps [.., last, x_1..x_a]: len(tokens after) - 1
        step = Step(proposed, accepted, token)
        result.steps.append(step)
        done = emit(step.tokens)
        if on_step is not None:
            on_step(result)
    return result
