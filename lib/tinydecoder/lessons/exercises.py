"""Exercises in the notebooks: the learner writes an answer into a placeholder, `check` says
whether it is right and, if not, what to look at. It prints and returns; it never raises, so a
notebook whose placeholders are still empty runs top to bottom (and strict nbval passes).

    prediction = None  # your answer: how many rows does the decode step project?
    check("decode rows", prediction, expected=rows_decode, hint="one new token per layer")

The answer cell that follows is tagged `solution` with its source hidden; it fills the
placeholder between nbgrader's `### BEGIN SOLUTION` / `### END SOLUTION` markers and calls
`check` again.
"""
from __future__ import annotations

import numpy as np

NOT_ANSWERED = (None, Ellipsis)


def matches(answer, expected, rtol: float = 1e-6, atol: float = 0.0) -> bool:
    """Equal, for numbers and arrays within tolerance; for everything else, ==."""
    if isinstance(expected, (str, bytes, bool)) or expected is None:
        return answer == expected
    if isinstance(expected, (set, frozenset, dict)):
        return answer == expected
    try:
        a, e = np.asarray(answer), np.asarray(expected)
    except Exception:  # pragma: no cover - exotic objects
        return answer == expected
    if a.dtype.kind in "biufc" and e.dtype.kind in "biufc":
        return a.shape == e.shape and bool(np.allclose(a, e, rtol=rtol, atol=atol))
    return bool(np.array_equal(a, e)) if a.shape == e.shape else False


def check(name: str, answer, expected, *, hint: str, rtol: float = 1e-6, atol: float = 0.0) -> None:
    """Print whether `answer` equals `expected` (numbers within rtol/atol). Returns nothing, so
    that a notebook cell ending with it shows only the printed line (`matches` gives the bool).

    An unanswered placeholder (None or ...) prints the hint; a wrong answer prints what was
    given and the hint, never the expected value."""
    if any(answer is x for x in NOT_ANSWERED):
        print(f"[{name}] not answered yet. Hint: {hint}")
        return
    if matches(answer, expected, rtol=rtol, atol=atol):
        print(f"[{name}] correct.")
        return
    shown = repr(answer)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    print(f"[{name}] not quite: you answered {shown}. Hint: {hint}")
