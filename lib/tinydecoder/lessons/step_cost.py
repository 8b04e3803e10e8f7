"""What an engine step costs in seconds (notebook 20): time batched decode steps of a real model
at a few batch sizes, give a schedule's steps those costs, and say what was measured in a
sentence printed from the numbers (so no prose quotes a number this machine did not produce).

    cost = measure_step_seconds(model, rows=(1, 2, 4, 8, 16, 32))   # {rows: median seconds}
    print(step_cost_sentence(cost))
    schedule_seconds(schedule, cost)   # sum over its steps of the cost of a step of that many rows

The cost of a step of n rows is interpolated linearly between the measured row counts (it is
a decode step's cost: a prefill chunk's rows also attend over their own chunk, which a short
context makes cheap). Nothing here asserts a speed.
"""
from __future__ import annotations

import numpy as np

from .. import fast
from ..perf.bench import bench_tokens, cache_copy, prefilled_cache
from ..perf.machine import best_seconds


def measure_step_seconds(model, rows=(1, 2, 4, 8), context: int = 32, repeat: int = 3) -> dict:
    """{n: seconds of one batched decode step over n sequences}: the fast path's forward_batch
    on n stacked caches of `context` positions each, the shortest of `repeat` timed steps after
    one untimed (other programs on the machine can only make a step slower)."""
    rows = sorted({int(n) for n in rows})
    if not rows or rows[0] < 1:
        raise ValueError(f"rows must be batch sizes >= 1, got {rows}")
    base = prefilled_cache(model, context)
    out = {}
    for n in rows:
        caches = fast.BatchKVCache.stack([cache_copy(base) for _ in range(n)], extra=1)
        batch = [bench_tokens(model, 1, seed=3 + s) for s in range(n)]

        def step(batch=batch, caches=caches):
            fast.forward_batch(model, batch, caches, last_only=True)
            caches.truncate(context)  # undo, so every timed step sees the same context

        out[n] = best_seconds(step, repeat)
    return out


def _checked(cost: dict) -> tuple:
    if not cost or 1 not in cost:
        raise ValueError(f"the step costs must include a step of 1 row, got rows {sorted(cost or {})}")
    rows = np.array(sorted(cost), dtype=np.float64)
    seconds = np.array([cost[int(n)] for n in rows], dtype=np.float64)
    if not np.all(seconds > 0):
        raise ValueError("every step cost must be a positive number of seconds")
    return rows, seconds


def step_seconds(n_rows, cost: dict):
    """Seconds of a step of n_rows rows: linear between the measured row counts; past the
    largest, the last two points' slope continues, never downwards (0 rows: 0 seconds)."""
    rows, seconds = _checked(cost)
    n = np.asarray(n_rows, dtype=np.float64)
    inside = np.interp(n, rows, seconds)
    if len(rows) > 1:
        slope = max(0.0, (seconds[-1] - seconds[-2]) / (rows[-1] - rows[-2]))
        inside = np.where(n > rows[-1], seconds[-1] + slope * (n - rows[-1]), inside)
    return np.where(n > 0, inside, 0.0)


def schedule_seconds(schedule, cost: dict) -> float:
    """A schedule's steps priced by their rows: sum of step_seconds(batch tokens) (idle steps 0)."""
    return float(np.sum(step_seconds([s.batch_tokens for s in schedule.steps], cost)))


def step_cost_sentence(cost: dict) -> str:
    """One sentence from the measured costs: the largest batch's step against a step of 1 row,
    and what that means for tokens per second."""
    rows, seconds = _checked(cost)
    n, ratio = int(rows[-1]), float(seconds[-1] / seconds[0])
    speed = n / ratio
    verdict = ("less than" if ratio < n else "at least") + f" {n} steps of 1 row"
    return (f"On this machine a decode step over {n} rows took {ratio:.1f}x the time of a step over 1 row "
            f"({verdict}): {n} requests decoding together got {speed:.1f}x the tokens per second of one alone.")
