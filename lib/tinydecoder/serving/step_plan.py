"""One step of the continuous-batching scheduler as a pure function of plain data, and a replay
of a whole workload with any such function, without a model. This is the planning half of
`scheduler.run_schedule` (decodes first, unlimited KV memory, no chunk limit), written out so
that notebook 20's learner can write it and compare; tests check that the replay with
`schedule_step` gives exactly `run_schedule`'s batches.

    running = [("A", 0), ("B", 0), ("C", 18)]   # admitted, oldest first: prompt tokens left (0: decoding)
    waiting = [("D", 6)]                        # arrived, not admitted, in arrival order: prompt length
    schedule_step(running, waiting, token_budget=8, max_running=8)
    # [("A", "decode", 1), ("B", "decode", 1), ("C", "prefill", 6)]   D waits: the budget is spent

    replay(schedule_step, demo_requests(), token_budget=8)   # [[(name, phase, n), ...] per step]
"""
from __future__ import annotations

from ..core.validate import positive_int

DECODE, PREFILL = "decode", "prefill"


def schedule_step(running, waiting, token_budget: int, max_running: int) -> list:
    """The batch of one engine step, as [(name, phase, n_tokens)] in batch order:
    1. every running request that is decoding (prompt_left == 0), oldest first: ("decode", 1);
    2. every running request still prefilling, oldest first: ("prefill", min(prompt_left, budget left));
    3. waiting requests in arrival order, while budget is left and fewer than max_running
       requests are running (those admitted this step included): ("prefill", min(prompt_len, budget left)).
    Each part runs only while budget is left (> 0), so no entry has 0 tokens."""
    left = token_budget
    plan = []
    for name, prompt_left in running:
        if prompt_left == 0 and left > 0:
            plan.append((name, DECODE, 1))
            left -= 1
    for name, prompt_left in running:
        if prompt_left > 0 and left > 0:
            n = min(prompt_left, left)
            plan.append((name, PREFILL, n))
            left -= n
    n_running = len(running)
    for name, prompt_len in waiting:
        if left <= 0 or n_running >= max_running:
            break
        n = min(prompt_len, left)
        plan.append((name, PREFILL, n))
        left -= n
        n_running += 1
    return plan


def replay(step_fn, requests, token_budget: int, max_running: int | None = None, max_steps: int = 10_000) -> list:
    """Serve `requests` (scheduler.Request: prompt, max_new_tokens, arrival, name) step by step
    with `step_fn(running, waiting, token_budget, max_running)` choosing every batch; return
    the plans, one list of (name, phase, n_tokens) per step (idle steps give []). A request
    picks its first token in the step that prefills its last prompt token, then one per
    decode, and leaves after max_new_tokens. max_running defaults to the token budget, as in
    run_schedule. Raises ValueError when a plan names a request that cannot run that way."""
    token_budget = positive_int("token_budget", token_budget)
    max_running = token_budget if max_running is None else positive_int("max_running", max_running)
    requests = list(requests)
    names = [r.name or f"r{i}" for i, r in enumerate(requests)]
    if len(set(names)) != len(names):
        raise ValueError(f"request names must be unique, got {names}")
    index = {n: i for i, n in enumerate(names)}
    arrivals = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i))
    waiting, running = [], []  # indices; running: admission order
    prompt_left, made = {}, {}
    plans = []
    step = 0
    while arrivals or waiting or running:
        if step >= max_steps:
            raise RuntimeError(f"the replay did not finish within max_steps={max_steps}")
        while arrivals and requests[arrivals[0]].arrival <= step:
            waiting.append(arrivals.pop(0))
        plan = [tuple(x) for x in step_fn([(names[i], prompt_left[i]) for i in running],
                                          [(names[i], len(requests[i].prompt)) for i in waiting],
                                          token_budget, max_running)]
        finished = []
        for entry in plan:
            if len(entry) != 3 or entry[0] not in index:
                raise ValueError(f"step {step}: a plan entry must be (request name, phase, n_tokens), got {entry!r}")
            name, phase, n = entry
            i = index[name]
            if i in waiting:
                waiting.remove(i)
                running.append(i)
                prompt_left[i], made[i] = len(requests[i].prompt), 0
            if i not in running or phase not in (DECODE, PREFILL):
                raise ValueError(f"step {step}: {entry!r} names a request that is not waiting or running, or a bad phase")
            if phase == PREFILL:
                if not 0 < n <= prompt_left[i]:
                    raise ValueError(f"step {step}: {entry!r} prefills {n} tokens, {prompt_left[i]} are left")
                prompt_left[i] -= n
                if prompt_left[i] == 0:
                    made[i] = 1  # the last prompt token's logits pick the first new token
            else:
                if prompt_left[i] != 0 or n != 1:
                    raise ValueError(f"step {step}: {entry!r}: only a request with its prompt in the cache decodes, 1 token")
                made[i] += 1
            if made[i] == requests[i].max_new_tokens:
                finished.append(i)
        running = [i for i in running if i not in finished]
        plans.append(plan)
        step += 1
    return plans


def schedule_plans(schedule) -> list:
    """A scheduler.Schedule's batches in replay's form: [(name, phase, n_tokens)] per step."""
    names = [r.request.name or f"r{i}" for i, r in enumerate(schedule.results)]
    return [[(names[w.request], w.phase, w.n_tokens) for w in s.entries] for s in schedule.steps]
