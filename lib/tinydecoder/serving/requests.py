"""What the continuous-batching engine serves and what it records: a `Request`, one request's
share of a step (`Work`), one engine step's log (`EngineStep`) and a request's outcome
(`RequestResult`). Times are engine steps, so every number is deterministic."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..core.validate import check_token_ids, int_at_least

PREFILL, DECODE = "prefill", "decode"


@dataclass(frozen=True)
class Request:
    """One generation request: a continuation of `prompt` by up to `max_new_tokens` tokens; it
    becomes visible to the engine at step `arrival`.

    Optional, per request (a server sets them from the request's fields): `sampler(logits) -> id`
    (default: the engine's, greedy), `processors` run on the logits first (decoding.processors,
    called with prompt + generated ids), `stop_tokens` that end it (the engine's are added)."""

    prompt: tuple
    max_new_tokens: int
    arrival: int = 0
    name: str | None = None
    sampler: object = field(default=None, compare=False, repr=False)
    processors: tuple = field(default=(), compare=False, repr=False)
    stop_tokens: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "prompt", tuple(int(t) for t in check_token_ids(None, self.prompt)))
        for f, low in (("max_new_tokens", 1), ("arrival", 0)):
            object.__setattr__(self, f, int_at_least(f"Request.{f}", getattr(self, f), low))
        object.__setattr__(self, "processors", tuple(self.processors))
        object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))

    @property
    def positions_needed(self) -> int:
        """KV rows it can reach: the prompt plus every chosen token but the last (never fed)."""
        return len(self.prompt) + self.max_new_tokens - 1


@dataclass(frozen=True)
class Work:
    """One request's share of one step: `n_tokens` rows starting at position `start`."""

    request: int  # index into the request list
    phase: str  # "prefill" or "decode"
    n_tokens: int
    start: int  # position of its first row (= cache length before the step)


@dataclass
class EngineStep:
    """The log of one engine step (a scheduler step, not speculative decoding's `Step`)."""

    index: int  # engine step, 0-based
    entries: list  # [Work], in batch order: decodes first, then prefill chunks
    waiting: int  # requests arrived but not admitted, after this step's admissions
    running: int  # requests admitted and not finished, during this step
    free_blocks: int | None  # KV blocks free after the step (None: unlimited pool)
    wall_s: float | None = None  # only with record_wall=True; never compare it
    available_blocks: int | None = None  # free blocks not promised to running requests: what admission sees
    preempted: list = field(default_factory=list)  # requests preempted in this step (blocks freed, requeued)

    @property
    def batch_tokens(self) -> int:
        return sum(w.n_tokens for w in self.entries)

    @property
    def idle(self) -> bool:
        return not self.entries


@dataclass
class RequestResult:
    request: Request
    tokens: list = field(default_factory=list)  # generated ids
    logits: list = field(default_factory=list)  # [V] per generated token (unless keep_logits=False)
    admitted: int | None = None  # step of (first) admission (its first chunk ran in this step)
    first_token_step: int | None = None
    finish_step: int | None = None
    cached_tokens: int = 0  # prompt tokens found in the prefix cache (not prefilled), at first admission
    prefill_chunks: list = field(default_factory=list)  # [(step, n_tokens)]
    preemptions: int = 0  # times its blocks were taken back and it was requeued
    cancelled: bool = False  # ended by Engine.cancel (a client went away), not by its limit or a stop token

    @property
    def finished(self) -> bool:
        return self.finish_step is not None

    @property
    def ttft(self) -> int:
        """Time to first token, in steps: from its arrival step through the step that chose it
        (a request admitted on arrival whose prompt fits in one step has ttft 1)."""
        return self.first_token_step - self.request.arrival + 1

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, in steps (1.0 when it decodes every step)."""
        n = len(self.tokens)
        return None if n < 2 else (self.finish_step - self.first_token_step) / (n - 1)

    @property
    def latency(self) -> int:
        """Steps from arrival through the step that chose its last token."""
        return self.finish_step - self.request.arrival + 1
