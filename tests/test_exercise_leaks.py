"""No answer before its question: a prediction exercise's expected value is neither in its hint nor
in any stored output of a cell above its `check` cell (the learner would read it off the screen).

Executing every notebook takes minutes, so the expected values come from a fixture,
tests/fixtures/exercise_checks.json, that tools/record_checks.py writes by running each notebook
with TINYDECODER_CHECK_LOG set (every `check` call logs its name, expected value and hint). A cheap
test keeps the fixture current: each notebook's `check("name", ...)` calls are the fixture's
names, and each recorded hint is still in the notebook's source. The outputs searched are the
notebooks' stored ones (strict nbval keeps them equal to a fresh run's).

A number is looked for in the ways a notebook shows one: 7.58 as 7.58, 7.6, 7.579; 2949120 as
2949120, 2,949,120, 2.95 MB, 2.8 MiB; 0.5714 as 0.571, 57.1%. Only renderings with at least three
significant characters count (7.6 and 0.571 yes; 0.57 no), integers from 10 up (1, 2, 8 are on every
screen); booleans and strings never (True, "B" or a token are everywhere too). A two-digit integer
can match another quantity by chance: ALLOWED lists such exercises, each with its reason.
A cell marked `# NBVAL_IGNORE_OUTPUT` prints measurements (timings), which change from run to run:
a digit that matches there by chance is no leak, so those outputs are not searched.
"""
from __future__ import annotations

import ast
import html
import json
import math
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FIXTURE = ROOT / "tests" / "fixtures" / "exercise_checks.json"
CHECK_CALL = re.compile(r"(?<![\w.])check\(\s*((['\"])(?:\\.|(?!\2).)*\2)")
SCALES = ((1e3, "[kK]"), (1e6, "M"), (1e9, "G"), (1e12, "T"), (2 ** 10, "K"), (2 ** 20, "M"), (2 ** 30, "G"))
TAG = re.compile(r"<[^>]+>")


def _significant(text: str) -> int:
    """Characters of a rendered number after its sign, separators and leading zeros (7.6: 3, 0.57: 2)."""
    return len(text.lstrip("+-").replace(",", "").lstrip("0."))


def renderings(value) -> list:
    """Regular expressions for the ways a notebook may show `value` (see the module docstring);
    [] for what is never looked for (booleans, strings, None, small integers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return []
    forms = set()
    if float(value).is_integer():
        n = int(value)
        if abs(n) >= 10:
            forms |= {f"{n}", f"{n:,}"}
    else:
        x = float(value)
        forms |= {f"{x:.{d}f}" for d in range(0, 5)} | {f"{x:,.{d}f}" for d in range(0, 5)}
        forms |= {f"{x:.{g}g}" for g in range(2, 6)}
        forms = {f for f in forms if _significant(f) >= 3 and "e" not in f}
        forms |= {f"{x:.{g}e}" for g in range(1, 4)} if not 1e-3 <= abs(x) < 1e5 else set()
    edge = r"(?<![\w.])(?<!\d,)"
    found = [edge + re.escape(f) + r"(?!\d|[.,]\d)" for f in sorted(forms)]
    x = float(value)
    for scale, prefix in SCALES:  # 2.95 MB, 2.8 MiB, 140.5 kB
        y = x / scale
        if 1 <= abs(y) < 1000:
            scaled = {f"{y:.{d}f}" for d in range(0, 4)} | {f"{y:.{g}g}" for g in range(2, 5)}
            found += [edge + re.escape(f) + r"\s?" + prefix for f in sorted(scaled) if _significant(f) >= 3]
    if 0 < abs(x) < 1 and not x.is_integer():  # 57.1%
        pct = {f"{100 * x:.{d}f}" for d in range(0, 3)}
        found += [edge + re.escape(f) + r"\s?%" for f in sorted(pct) if _significant(f) >= 3]
    return found


def shows(text: str, value) -> str | None:
    """The first rendering of `value` found in `text`, or None."""
    for pattern in renderings(value):
        hit = re.search(pattern, text)
        if hit:
            return hit.group(0)
    return None


def _name(match) -> str:
    """The exercise name of a `check(` call: its first argument, a string literal."""
    return ast.literal_eval(match.group(1))


def _is_solution(cell) -> bool:
    return "solution" in cell.get("metadata", {}).get("tags", [])


def check_names(nb) -> list:
    """Names of the `check("name", ...)` calls in the notebook's question cells, in order."""
    names = []
    for cell in nb.cells:
        if cell.cell_type == "code" and not _is_solution(cell):
            names += [n for n in map(_name, CHECK_CALL.finditer(cell.source)) if n not in names]
    return names


def output_text(cell) -> str:
    """What the learner sees of a code cell's stored outputs, as text (HTML without its tags);
    "" for a cell of measurements (# NBVAL_IGNORE_OUTPUT)."""
    parts = []
    if cell.source.lstrip().startswith("# NBVAL_IGNORE_OUTPUT"):
        return ""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        data = out.get("data", {})
        parts += [data.get("text/plain", ""), data.get("text/markdown", "")]
        if "text/html" in data:
            parts.append(html.unescape(TAG.sub(" ", data["text/html"])))
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in parts)


def leaks(nb, exercises) -> list:
    """'name: where' for every exercise whose expected value is in its hint or above its check cell."""
    found = []
    for item in exercises:
        name, expected = item["name"], item["expected"]
        hit = shows(item["hint"], expected)
        if hit:
            found.append(f"{name!r} (expected {expected!r}): its hint shows {hit!r}")
        where = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and not _is_solution(c)
                      and any(_name(m) == name for m in CHECK_CALL.finditer(c.source))), None)
        for i, cell in enumerate(nb.cells[:where]):
            hit = shows(output_text(cell), expected) if cell.cell_type == "code" else None
            if hit:
                found.append(f"{name!r} (expected {expected!r}): the output of cell {i}, above its check "
                             f"(cell {where}), shows {hit!r}")
    return found


# Exercises whose answer is on screen by design, each with the reason.
ALLOWED = {
    ("09_sampling.ipynb", "top-p 1"): "the question states the vocabulary size; it asks whether top-p = 1 drops any",
    ("18_prefix_caching.ipynb", "reused with B = 32"): "96 is printed above only as a token index (96..111)",
    ("20_continuous_batching.ipynb", "E's static batch starts"): "14 is printed above as other quantities "
    "(the continuous run's step count, a prompt length)",
}


def _fixture() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def _ids(paths):
    return [p.name for p in paths]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_the_fixture_is_current(path):
    nb = nbformat.read(str(path), as_version=4)
    recorded = _fixture().get(path.name, [])
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert [e["name"] for e in recorded] == check_names(nb), (
        f"{path.name}'s check calls are not the recorded ones: run tools/record_checks.py {path.relative_to(ROOT)}")
    stale = [e["name"] for e in recorded if json.dumps(e["hint"])[1:-1] not in source and e["hint"] not in source]
    assert not stale, f"{path.name}: hints changed for {stale}: run tools/record_checks.py {path.relative_to(ROOT)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_no_answer_in_its_hint_or_above_its_question(path):
    nb = nbformat.read(str(path), as_version=4)
    found = leaks(nb, [e for e in _fixture().get(path.name, []) if (path.name, e["name"]) not in ALLOWED])
    assert not found, f"{path.name}: answers on screen before their question:\n  " + "\n  ".join(found)


def test_renderings_find_a_number_the_ways_it_is_shown():
    assert shows("the intensity is 7.58 FLOP/byte", 7.578947368421052) == "7.58"
    assert shows("about 7.6 at batch 16", 7.578947368421052) == "7.6"
    assert shows("2,949,120 bytes", 2949120) and shows("2949120 B", 2949120)
    assert shows("the cache holds 2.95 MB", 2949120) and shows("2.8 MiB", 2949120)
    assert shows("gate weight 0.5714", 0.5714285714) and shows("57.1% of the tokens", 0.5714285714)
    assert shows("140.5 kB", 140544)


def test_renderings_ignore_what_is_on_every_screen():
    assert renderings(True) == [] and renderings("B") == [] and renderings(None) == []
    assert not shows("layer 2 of 30, 1 head", 2) and not shows("0 1 2 3", 0) and not shows("8 rows", 8)
    assert not shows("0.57 and 8", 0.5714285714)
    assert not shows("17.58 and 7.581 and 1,7.58", 7.58)  # other numbers that contain the digits
    assert not shows("7.5 and 7.59", 7.578947368421052)
