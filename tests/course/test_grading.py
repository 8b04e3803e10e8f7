"""`python -m tinydecoder grade`: tiny generated notebooks (seconds), each in the course's exercise
format, graded right, wrong, not attempted and broken."""
import csv
import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from tinydecoder.cli import main
from tinydecoder.course import grading

RIGHT = ("import numpy as np\n"
         "def softmax(x):\n"
         "    e = np.exp(x - x.max(axis=-1, keepdims=True))\n"
         "    return e / e.sum(axis=-1, keepdims=True)")
WRONG = "import numpy as np\ndef softmax(x):\n    e = np.exp(x)\n    return e / e.sum(axis=-1, keepdims=True)"
STUB = 'def softmax(x):\n    """Softmax over the last axis."""\n    raise NotImplementedError'


def notebook(path, implementation, *, crash=False):
    cells = [new_markdown_cell("# A tiny exercise notebook"),
             new_code_cell(implementation, metadata={"tags": ["implement"]}),
             new_code_cell("from tinydecoder.course.exercises import check_implementation\n"
                           "report = check_implementation('softmax', softmax)")]
    if crash:
        cells.insert(1, new_code_cell("raise RuntimeError('the learner broke this cell')"))
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The four notebooks graded once, through the command line (--json and --csv)."""
    folder = tmp_path_factory.mktemp("submissions")
    paths = [notebook(folder / "right.ipynb", RIGHT), notebook(folder / "wrong.ipynb", WRONG),
             notebook(folder / "stub.ipynb", STUB), notebook(folder / "crash.ipynb", RIGHT, crash=True)]
    capture = pytest.MonkeyPatch()
    lines = []
    capture.setattr("builtins.print", lambda *a, **k: lines.append(" ".join(map(str, a))))
    try:
        rc = main(["grade", "--json", "--csv", str(folder / "grades.csv"), "--timeout", "120", str(folder)])
    finally:
        capture.undo()
    assert rc == 1  # not everything passed
    rows = json.loads(lines[-1])
    assert [r["notebook"] for r in rows] == sorted(map(str, paths))  # the folder stands for its notebooks
    return {row["notebook"].rsplit("/", 1)[-1]: row for row in rows} | {"csv": folder / "grades.csv"}


def test_right_wrong_stub_and_crash(graded):
    assert graded["right.ipynb"]["status"] == "passed" and graded["right.ipynb"]["ran_to_end"]
    assert graded["wrong.ipynb"]["status"] == "failed"
    assert "large logits (1e4)" in graded["wrong.ipynb"]["failed"]
    assert graded["stub.ipynb"]["status"] == "not attempted" and graded["stub.ipynb"]["ran_to_end"]
    crash = graded["crash.ipynb"]
    assert crash["status"] == "not run" and crash["exercise"] == "softmax" and not crash["ran_to_end"]
    assert "RuntimeError: the learner broke this cell" in crash["error"]


def test_csv_has_one_row_per_exercise(graded):
    rows = list(csv.DictReader(graded["csv"].open()))
    assert [r["status"] for r in rows] == ["not run", "passed", "not attempted", "failed"]  # sorted by name
    assert set(rows[0]) >= {"notebook", "exercise", "status", "failed"}


def test_json_row(graded):
    right = graded["right.ipynb"]
    assert right == {"notebook": right["notebook"], "exercise": "softmax", "status": "passed", "failed": [],
                     "ran_to_end": True, "error": None}


def test_cli_rejects_a_missing_notebook(tmp_path, capsys):
    assert main(["grade", str(tmp_path / "nope.ipynb")]) == 2
    assert "no such notebook" in capsys.readouterr().err


def test_implement_cells_name_the_exercises():
    nb = new_notebook(cells=[new_code_cell(STUB, metadata={"tags": ["implement"]}),
                             new_code_cell("def helper(): pass")])
    assert grading.implement_exercises(nb) == ["softmax"]
