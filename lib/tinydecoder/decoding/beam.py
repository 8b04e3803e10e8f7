"""Beam search: keep the `beams` best partial continuations instead of one.

    step t: for each live beam b (summed log-probability s_b) and each token j,
            candidate score s_b + log p(j | prompt, beam b)                  # [B, V]
            take the 2B best candidates (ties: lower beam, then lower id):
              a stop token -> a finished beam (if among the B best), set aside
              otherwise    -> a live beam of step t+1, until B are live
            each new live beam continues its PARENT's KV cache: the rows are reordered by parent

A finished beam (or a live one at the end) is ranked by its length-normalised score
logprob / n_new ** length_penalty (Hugging Face's rule): length_penalty > 0 favours longer
sequences, 0 ranks by the plain sum. The search stops early once B beams have finished and
none of them scores below the best live beam (Hugging Face's default heuristic).

All live beams advance in one `forward_batch` call per step (one cache per beam): the weights
are read once per step for the whole beam, as in a batch of requests.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.model import Model
from ..core.reference import forward
from ..core.validate import check_context, check_token_ids, is_int, is_real
from ..fast import forward_batch
from .processors import apply_processors, check_processors, should_stop, start_processors
from .sampling import best_tokens


@dataclass
class Beam:
    tokens: list  # the new tokens (a final stop token included)
    logprob: float  # summed log-probability of those tokens
    score: float  # logprob / len(tokens) ** length_penalty: what beams are ranked by
    finished: bool  # ended with a stop token

    def to_dict(self) -> dict:
        return {"token_ids": list(self.tokens), "logprob": self.logprob, "score": self.score,
                "finished": self.finished}


@dataclass
class BeamSearchResult:
    prompt: list
    beams: list  # Beam, best score first
    steps: list = field(default_factory=list)  # per step: the candidates considered (see beam_search)
    forward_calls: int = 0
    length_penalty: float = 1.0

    @property
    def best(self) -> Beam:
        return self.beams[0]


def length_normalised(logprob: float, n_tokens: int, length_penalty: float) -> float:
    return logprob / n_tokens ** length_penalty


def log_softmax(logits) -> np.ndarray:
    """log p over the last axis, in float64 (-inf stays -inf).  [..., V] -> [..., V]"""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def reorder_caches(caches, parents, extra: int = 0) -> list:
    """The caches of the next step's beams: beam i continues caches[parents[i]].

    A parent chosen once hands its cache over as is; each further child gets a copy (with room
    for `extra` more positions). Caches of parents nobody chose are dropped."""
    taken, out = set(), []
    for p in parents:
        out.append(caches[p].copy(extra) if p in taken else caches[p])
        taken.add(p)
    return out


def _check_args(beams, max_new_tokens, length_penalty, stop_tokens):
    if not is_int(beams) or beams < 1:
        raise ValueError(f"beams must be an integer >= 1 (1 = greedy), got {beams!r}")
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not is_real(length_penalty) or not np.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number (1 = mean log-prob, 0 = plain sum), "
                         f"got {length_penalty!r}")
    return {int(t) for t in stop_tokens}


def beam_search(model: Model, prompt, beams: int, max_new_tokens: int, length_penalty: float = 1.0,
                stop_tokens=(), *, use_cache: bool = True, processors=()) -> BeamSearchResult:
    """The `beams` best continuations of `prompt` (at most `max_new_tokens` tokens), best first.

    use_cache=False recomputes every beam's whole context each step (full recompute, same numbers).
    `processors` rewrite each beam's logits before its log-probabilities are taken; a candidate
    that a stopping rule among them (e.g. StopSequences) declares done finishes like a stop token.
    result.steps[t] lists the candidates of step t, best first, as dicts: parent (index of the
    live beam of step t-1 it extends; 0 = the prompt at step 0), token, tokens (the new tokens so
    far), logprob (summed), status ("kept": live at step t+1 with index `beam`; "finished";
    "pruned")."""
    cfg = model.config
    stop = _check_args(beams, max_new_tokens, length_penalty, stop_tokens)
    processors = check_processors(processors)
    prompt = [int(t) for t in check_token_ids(cfg, prompt)]
    needed = check_context(cfg, 0, len(prompt), max_new_tokens)  # positions the cache must hold
    live = [([], 0.0)]  # (new tokens, summed log-prob); one beam to start, so no duplicates
    caches = [model.new_cache(capacity=needed)] if use_cache else None
    finished, steps, calls = [], [], 0
    start_processors(processors, prompt)
    for step in range(max_new_tokens):
        contexts = [prompt + toks for toks, _ in live]
        if use_cache:  # each beam feeds what its cache lacks: the prompt at step 0, then one token
            rows = forward_batch(model, [c[len(k):] for c, k in zip(contexts, caches)], caches, last_only=True)
        else:
            rows = forward_batch(model, contexts, None, last_only=True)
        calls += 1
        logits = [r[-1] for r in rows]
        if processors:
            logits = [apply_processors(processors, c, z) for c, z in zip(contexts, logits)]
        V = len(logits[0])
        total = np.array([s for _, s in live])[:, None] + log_softmax(np.stack(logits))  # [B, V]
        order = best_tokens(total.ravel(), min(2 * beams, total.size))  # flat ids: beam * V + token
        new_live, parents, candidates = [], [], []
        for rank, flat in enumerate(order):
            b, token = divmod(int(flat), V)
            logprob, toks = float(total.flat[flat]), live[b][0] + [token]
            if logprob == -np.inf:
                break
            cand = {"parent": b, "token": token, "tokens": toks, "logprob": logprob, "status": "pruned", "beam": None}
            if token in stop or (processors and should_stop(processors, prompt + toks, len(prompt))):
                if rank < beams:
                    cand["status"] = "finished"
                    finished.append(Beam(toks, logprob, length_normalised(logprob, len(toks), length_penalty), True))
            elif len(new_live) < beams:
                cand["status"], cand["beam"] = "kept", len(new_live)
                new_live.append((toks, logprob))
                parents.append(b)
            candidates.append(cand)
        steps.append(candidates)
        live = new_live
        if not live or _done(finished, live, beams, length_penalty):
            break
        if use_cache:
            caches = reorder_caches(caches, parents, extra=max_new_tokens - step - 1)
    ended = finished + [Beam(t, s, length_normalised(s, len(t), length_penalty), False) for t, s in live]
    ended.sort(key=lambda beam: -beam.score)  # stable: equal scores keep finished-first order
    return BeamSearchResult(prompt, ended[:beams], steps, calls, float(length_penalty))


def _done(finished, live, beams, length_penalty) -> bool:
    """B beams finished, and the worst of the B best of them beats every live beam's score now."""
    if len(finished) < beams:
        return False
    worst_kept = sorted(b.score for b in finished)[-beams]
    best_live = max(length_normalised(s, len(t), length_penalty) for t, s in live)
    return worst_kept >= best_live


def sequence_logprob(model: Model, prompt, continuation) -> float:
    """log p(continuation | prompt) under the model: one forward over prompt + continuation,
    summing each continuation token's log-probability at the position before it."""
    prompt = [int(t) for t in check_token_ids(model.config, prompt)]
    if len(continuation) == 0:
        return 0.0
    continuation = [int(t) for t in check_token_ids(model.config, continuation)]
    logits = forward(model, prompt + continuation[:-1])[len(prompt) - 1:]  # [n, V]
    logp = log_softmax(logits)
    return float(logp[np.arange(len(continuation)), continuation].sum())
