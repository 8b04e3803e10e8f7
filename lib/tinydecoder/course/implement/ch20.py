"""Chapter 20's exercise: one step of a continuous-batching scheduler under a token budget.

    schedule_step(running, waiting, token_budget, max_running) -> [(name, phase, n_tokens), ...]

running: [(name, prompt_left)] admitted requests, oldest first (prompt_left 0: it is decoding);
waiting: [(name, prompt_len)] arrived but not admitted, in arrival order. The batch, in order:
every decoding request ("decode", 1); every running request still prefilling
("prefill", min(prompt_left, budget left)); then waiting requests in arrival order
("prefill", min(prompt_len, budget left)) while budget is left and fewer than max_running
requests run. Nothing gets 0 tokens. The library's answer: `serving.step_plan.schedule_step`;
`step_plan.replay` serves a whole workload with any such function.
"""
from __future__ import annotations

import numpy as np

from ...serving.scheduler import ARRIVAL_PATTERNS, demo_requests
from ...serving.step_plan import replay, schedule_step
from .case import Case


def _plan(out) -> list:
    if out is None:
        raise ValueError("the function returned None: did it forget to return the plan?")
    plan = []
    for entry in out:
        entry = tuple(entry)
        if len(entry) != 3:
            raise ValueError(f"each plan entry is (name, phase, n_tokens), got {entry!r}")
        name, phase, n = entry
        plan.append((name, phase, int(n)))
    return plan


def _agrees(fn, running, waiting, budget, max_running) -> bool:
    out = _plan(fn([tuple(r) for r in running], [tuple(w) for w in waiting], budget, max_running))
    return out == schedule_step(running, waiting, budget, max_running)


def _decode_only(fn):
    return _agrees(fn, [("A", 0), ("B", 0)], [], 8, 8)


def _decodes_first(fn):  # a long prompt must not take the decodes' rows
    return _agrees(fn, [("C", 20), ("A", 0), ("B", 0)], [], 4, 4)


def _chunk_fits_budget(fn):  # the chunk gets what is left of the budget, not the whole prompt
    return _agrees(fn, [("A", 0)], [("C", 24)], 8, 8)


def _prefill_before_admission(fn):  # a request already prefilling continues before a new one starts
    return _agrees(fn, [("A", 0), ("C", 18)], [("D", 6)], 8, 8)


def _budget_spent(fn):  # no 0-token chunk and no admission once the budget is spent
    return _agrees(fn, [("A", 0), ("B", 0), ("C", 6)], [("D", 4)], 8, 8)


def _arrival_order(fn):  # first come, first served: the first waiting request is admitted first
    return _agrees(fn, [], [("D", 6), ("E", 3), ("F", 2)], 8, 8)


def _whole_prompts(fn):  # short prompts that fit are admitted whole, several in one step
    return _agrees(fn, [("A", 0)], [("D", 2), ("E", 3), ("F", 1)], 16, 16)


def _max_running(fn):  # at most max_running requests run at once, this step's admissions included
    return _agrees(fn, [("A", 0), ("B", 0)], [("D", 2), ("E", 2), ("F", 2)], 16, 3)


def _random(fn):
    rng = np.random.default_rng(19)
    names = iter(f"r{i}" for i in range(10**6))
    for _ in range(200):
        budget = int(rng.integers(1, 20))
        max_running = int(rng.integers(1, budget + 1))
        running = [(next(names), int(rng.choice([0, 0, rng.integers(1, 30)]))) for _ in range(rng.integers(0, max_running + 1))]
        waiting = [(next(names), int(rng.integers(1, 30))) for _ in range(rng.integers(0, 5))]
        if not _agrees(fn, running, waiting, budget, max_running):
            return False
    return True


def _whole_workload(fn):  # the five demo requests, every arrival pattern and budget, step after step
    for pattern in ARRIVAL_PATTERNS:
        for budget in (1, 3, 8, 32):
            requests = demo_requests(pattern)
            if replay(lambda r, w, b, m: _plan(fn(list(r), list(w), b, m)), requests, budget) != \
                    replay(schedule_step, requests, budget):
                return False
    return True


SCHEDULE_STEP = [
    Case("decodes only", "every decoding request (prompt_left 0) gets ('decode', 1), oldest first", _decode_only),
    Case("decodes go first", "give every decoding request its row before any prompt chunk, whatever the order "
         "of `running`", _decodes_first),
    Case("a chunk fits the budget", "a prompt longer than what is left of the budget gets only what is left",
         _chunk_fits_budget),
    Case("running prefills before admissions", "requests already running that still prefill get their chunk "
         "before any waiting request is admitted", _prefill_before_admission),
    Case("budget spent", "stop when no budget is left: no entry with 0 tokens, no admission", _budget_spent),
    Case("arrival order", "admit waiting requests in the order of the list (first come, first served)",
         _arrival_order),
    Case("several whole prompts", "keep admitting while budget is left", _whole_prompts),
    Case("max_running", "count the running requests and this step's admissions against max_running",
         _max_running),
    Case("random states vs the library", "compare with serving.step_plan.schedule_step on your own examples",
         _random),
    Case("whole workloads", "replay the demo requests step by step (step_plan.replay) and compare", _whole_workload),
]

EXERCISES = {"schedule_step": SCHEDULE_STEP}
REFERENCES = {"schedule_step": schedule_step}
