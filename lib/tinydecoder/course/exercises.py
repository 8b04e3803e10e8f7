"""Exercises in the notebooks: the learner writes an answer into a placeholder, `check` says
whether it is right and, if not, what to look at. It prints and returns; it never raises, so a
notebook whose placeholders are still empty runs top to bottom (and strict nbval passes).

    prediction = None  # your answer: how many rows does the decode step project?
    check("decode rows", prediction, expected=rows_decode, hint="one new token per layer")

The answer cell that follows is tagged `solution` with its source hidden; it fills the
placeholder between nbgrader's `### BEGIN SOLUTION` / `### END SOLUTION` markers and calls
`check` again.

`check_implementation(name, fn)` runs an "implement it" exercise: the learner writes a function
and the cases of its chapter (module ch02, ch04, ... of course.implement) judge it (one line per case, never raises).

When the environment variable TINYDECODER_CHECK_LOG names a file, every `check` call appends
{"name", "expected", "hint"} to it as one JSON line (tools/record_checks.py collects them, and a
test makes sure no exercise's answer is in its hint or on screen above it).

`within_rounding(a, b)` prints that two results agree up to float rounding without printing the
rounding itself, whose digits change with the BLAS library, its kernels and its thread count.
"""
from __future__ import annotations

import json
import os

import numpy as np

NOT_ANSWERED = (None, Ellipsis)
CHECK_LOG_ENV = "TINYDECODER_CHECK_LOG"


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
    _log_check(name, expected, hint)
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


def as_json(value, max_items: int = 64):
    """`value` as plain JSON data: numpy scalars and small arrays become numbers and lists, sets
    sorted lists; a large array {"shape", "dtype"}; anything else its repr."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        if value.size > max_items:
            return {"shape": list(value.shape), "dtype": str(value.dtype)}
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted((as_json(v, max_items) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [as_json(v, max_items) for v in value]
    if isinstance(value, dict):
        return {str(k): as_json(v, max_items) for k, v in value.items()}
    return repr(value)


def _log_check(name: str, expected, hint: str) -> None:
    path = os.environ.get(CHECK_LOG_ENV)
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"name": name, "expected": as_json(expected), "hint": hint}) + "\n")
    except (OSError, TypeError, ValueError) as exc:  # a side channel: never break the learner's notebook
        print(f"(could not write the check log {path}: {exc})")


ROUNDING_BOUNDS = {"float64": 1e-12, "float32": 1e-5}  # far above each type's rounding, far below a bug


def within_rounding(a, b) -> str:
    """'< 1e-12 (float64)' or '< 1e-05 (float32)' when max |a - b| is below the bound of the less
    precise of the two dtypes; otherwise the difference itself, marked, e.g. '3.2e-02 (NOT within
    float32 rounding, 1e-05)'.

    The size of a rounding difference (1e-16 or 4e-16, 2e-7 or 8e-7) depends on the BLAS kernels
    and thread count of the machine, so a notebook that printed it would show other digits
    elsewhere and fail strict nbval there; this line is the same on every machine unless the
    two results really differ."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"within_rounding needs two arrays of one shape, got {a.shape} and {b.shape}")
    kinds = {np.dtype(x.dtype).name for x in (a, b)}
    if not kinds <= set(ROUNDING_BOUNDS):
        raise TypeError(f"within_rounding compares float32 or float64 arrays, got {sorted(kinds)}")
    name = "float32" if "float32" in kinds else "float64"
    bound = ROUNDING_BOUNDS[name]
    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
    if diff < bound:
        return f"< {bound:.0e} ({name})"
    return f"{diff:.1e} (NOT within {name} rounding, {bound:.0e})"


def check_implementation(name: str, fn):
    """Run the "implement it" exercise `name` on the learner's `fn` (see course/implement)."""
    from .implement import check_implementation as run

    return run(name, fn)


def reference(name: str):
    """The library's function or class that exercise `name` is judged against (course/implement)."""
    from .implement import reference as find

    return find(name)
