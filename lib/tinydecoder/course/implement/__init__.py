""""Implement it" exercises: the learner writes a function in a notebook, `check_implementation`
runs the exercise's cases against it and prints one line per case.

    def softmax(x):            # the cell tagged `implement`
        ...
    report = check_implementation("softmax", softmax)
    # PASS shape
    # FAIL large logits: subtract the row's max before exp ...

Cases live in one module per chapter (`ch02`, `ch04`, ...: `ch` and two digits, or a second
module of a chapter such as `ch17_paged_read`), each defining
`EXERCISES = {"name": [Case(name, hint, run), ...]}` and `REFERENCES = {"name": the library's
function or class the exercise is judged against, in the exercise's signature}` (`reference(name)`
hands it out; the tests prove it passes every case of its exercise); every such module of this package is found
with pkgutil, so a chapter adds its exercises without touching this file. `run(fn)` returns True
when the learner's `fn` passes; it may raise, which counts as a fail (the hint plus the
exception's one-line message). A case compares with the library on random inputs or checks a
property; it never prints the expected array or the library's code.

`check_implementation` never raises. A function that still raises NotImplementedError (or, as a
`...` stub, returns None) everywhere is "not attempted", so a student copy runs top to bottom.
When the environment variable TINYDECODER_GRADE_LOG names a file, every report is appended to it
as one JSON line (this is how `python -m tinydecoder grade` collects them from a notebook).
"""
from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import warnings
from dataclasses import dataclass, field

import numpy as np

from .case import Case

__all__ = ["Case", "Report", "check_implementation", "exercises", "reference", "GRADE_LOG_ENV"]

GRADE_LOG_ENV = "TINYDECODER_GRADE_LOG"
STATUSES = ("passed", "failed", "not attempted")
_CHAPTER = re.compile(r"ch\d\d(_[a-z0-9_]+)?$")


@dataclass
class Report:
    """What `check_implementation` found: status "passed", "failed" or "not attempted", the
    names of the failed cases (every case when not attempted) and of the passed ones."""
    exercise: str
    status: str
    failed: list = field(default_factory=list)
    passed_cases: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def attempted(self) -> bool:
        return self.status != "not attempted"

    def to_dict(self) -> dict:
        return {"exercise": self.exercise, "status": self.status, "failed": list(self.failed),
                "passed": list(self.passed_cases)}

    def __repr__(self) -> str:
        return f"Report({self.exercise!r}: {self.status}, {len(self.failed)} failed)"


def _chapter_modules() -> list:
    infos = sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)
    return [importlib.import_module(f"{__name__}.{i.name}") for i in infos if _CHAPTER.match(i.name)]


def exercises() -> dict:
    """{exercise name: [Case, ...]} collected from every chapter module (ch + two digits) here."""
    found = {}
    for module in _chapter_modules():
        for name, cases in getattr(module, "EXERCISES", {}).items():
            if name in found:
                raise ValueError(f"exercise {name!r} is defined twice (second time in {module.__name__})")
            found[name] = list(cases)
    return found


def reference(name: str):
    """The library's function (or class) that exercise `name` is judged against, callable in the
    exercise's own signature: check_implementation(name, reference(name)) passes every case."""
    for module in _chapter_modules():
        if name in getattr(module, "EXERCISES", {}):
            refs = getattr(module, "REFERENCES", {})
            if name not in refs:
                raise LookupError(f"exercise {name!r} names no reference in {module.__name__}.REFERENCES")
            return refs[name]
    raise KeyError(f"no exercise {name!r}; known: {', '.join(sorted(exercises()))}")


class _Tracked:
    """The learner's function, watched: did any call return something, or fail otherwise than
    with NotImplementedError? (If neither, the exercise is not attempted.)"""

    def __init__(self, fn):
        self.fn, self.answered = fn, False

    def __call__(self, *args, **kwargs):
        try:
            out = self.fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except Exception:
            self.answered = True
            raise
        if out is not None:
            self.answered = True
        return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:120]}" if text else type(exc).__name__


def _record(report: Report) -> None:
    path = os.environ.get(GRADE_LOG_ENV)
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(report.to_dict()) + "\n")
    except OSError as exc:  # grading is a side channel: never break the learner's notebook
        print(f"(could not write the grading log {path}: {exc})")


def check_implementation(name: str, fn) -> Report:
    """Run exercise `name`'s cases on `fn`, print "PASS case" / "FAIL case: hint" per case and a
    summary line, and return a Report. Never raises."""
    try:
        known = exercises()
    except Exception as exc:  # a broken chapter module must not stop the learner's notebook
        print(f"[{name}] the exercise cases could not be loaded ({_one_line(exc)})")
        report = Report(name, "failed", ["cases could not be loaded"])
        _record(report)
        return report
    if name not in known:
        print(f"[{name}] no such exercise; known: {', '.join(sorted(known))}")
        report = Report(name, "failed", ["unknown exercise"])
        _record(report)
        return report
    cases = known[name]
    if not callable(fn):
        print(f"FAIL {name}: expected a function, got {type(fn).__name__}")
        report = Report(name, "failed", [c.name for c in cases])
        _record(report)
        return report
    tracked, results = _Tracked(fn), []
    for case in cases:
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                ok, why = bool(case.run(tracked)), ""
        except NotImplementedError:
            ok, why = False, "not implemented"
        except Exception as exc:  # the learner's error is a failed case, never a traceback
            ok, why = False, _one_line(exc)
        results.append((case, ok, why))
    if not tracked.answered:
        print(f"NOT ATTEMPTED {name}: the function still raises NotImplementedError (or returns None); "
              f"write it in the exercise cell and run this cell again")
        report = Report(name, "not attempted", [c.name for c in cases])
        _record(report)
        return report
    for case, ok, why in results:
        if ok:
            print(f"PASS {case.name}")
        else:
            print(f"FAIL {case.name}: {case.hint}" + (f" ({why})" if why else ""))
    failed = [c.name for c, ok, _ in results if not ok]
    report = Report(name, "failed" if failed else "passed", failed, [c.name for c, ok, _ in results if ok])
    print(f"{name}: {len(cases) - len(failed)} of {len(cases)} cases pass" +
          ("" if failed else ": well done"))
    _record(report)
    return report
