"""Student copies (tools/classroom.py): nbgrader's solution markers, and student copies of real
notebooks that run top to bottom and keep no answer (issue 15)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import classroom  # noqa: E402

HIDDEN = {"tags": ["solution"], "jupyter": {"source_hidden": True}}
# Two small, fast notebooks whose student copies are executed.
RUN_NOTEBOOKS = ["02_attention_by_hand.ipynb", "03_one_decoder_layer.ipynb"]
SECRET = "answer_rows = 14  # one row per layer"


def solution_cell(source: str, **meta) -> nbformat.NotebookNode:
    return new_code_cell(source, metadata={**HIDDEN, **meta})


def exercise_pair() -> list:
    """An exercise in the course's format: question, placeholder + check, hidden answer."""
    check = ('check("decode rows", answer_rows, expected=14, '
             'hint="one new token goes through each layer")')
    return [
        new_markdown_cell("**Exercise.** How many rows does a decode step project in 14 layers?"),
        new_code_cell("from tinydecoder.course.exercises import check\n"
                      "answer_rows = None  # your answer\n" + check),
        solution_cell(f"### BEGIN SOLUTION\n{SECRET}\n### END SOLUTION\n{check}"),
    ]


# -- the markers ----------------------------------------------------------------------------
def test_one_region_becomes_the_note_and_keeps_the_check():
    source = "### BEGIN SOLUTION\nx = 14\ny = 2\n### END SOLUTION\ncheck('x', x, expected=14, hint='h')"
    new, removed = classroom.split_solution(source)
    assert removed == ["x = 14", "y = 2"]
    assert new == f"{classroom.CODE_NOTE}\ncheck('x', x, expected=14, hint='h')"


def test_several_regions_and_indented_ones_stay_valid_python():
    source = ("def f(a):\n    ### BEGIN SOLUTION\n    return a * 2\n    ### END SOLUTION\n"
              "### BEGIN SOLUTION\nz = f(3)\n### END SOLUTION\nprint(f(1))")
    new, removed = classroom.split_solution(source)
    assert removed == ["    return a * 2", "z = f(3)"]
    compile(new, "<student>", "exec")  # the def body is `...`, not empty
    namespace = {}
    exec(new.replace("print(f(1))", "r = f(1)"), namespace)
    assert namespace["r"] is None


def test_markdown_solution_gets_the_text_note():
    new, removed = classroom.split_solution("Because:\n### BEGIN SOLUTION\nthe cache.\n### END SOLUTION",
                                            "markdown")
    assert new == f"Because:\n{classroom.TEXT_NOTE}" and removed == ["the cache."]


@pytest.mark.parametrize("source, message", [
    ("x = 14", "without the nbgrader markers"),
    ("### BEGIN SOLUTION\nx = 14", "without a matching"),
    ("x = 14\n### END SOLUTION", "without a '### BEGIN SOLUTION' before it"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\nx\n### END SOLUTION", "nested"),
    ("### END SOLUTION\nx = 1\n### BEGIN SOLUTION", "line 1"),
])
def test_broken_markers_are_errors(source, message):
    with pytest.raises(classroom.SolutionMarkerError, match=message):
        classroom.split_solution(source)


def test_check_names_every_breach_with_its_cell():
    nb = new_notebook(cells=[
        new_code_cell("x = 1"),
        solution_cell("x = 14"),                                            # no markers
        new_code_cell("### BEGIN SOLUTION\nx = 2\n### END SOLUTION"),      # not tagged
        new_code_cell("### BEGIN SOLUTION\nx = 3\n### END SOLUTION",
                      metadata={"tags": ["solution"]}),                    # not hidden
        solution_cell("### BEGIN SOLUTION\n\n### END SOLUTION"),           # empty
        solution_cell("### BEGIN SOLUTION\nx = 4\n### END SOLUTION"),      # fine
    ])
    problems = classroom.check_notebook(nb, "nb.ipynb")
    assert [p.split(":")[0] for p in problems] == [f"nb.ipynb cell {i}" for i in (1, 2, 3, 4)]
    assert "markers" in problems[0] and "not tagged" in problems[1]
    assert "source_hidden" in problems[2] and "empty" in problems[3]
    with pytest.raises(classroom.SolutionMarkerError, match="cell 1"):
        classroom.student_notebook(nb, "nb.ipynb")


def test_nbgrader_metadata_marks_a_solution_cell_too():
    cell = new_code_cell("x = 1", metadata={"nbgrader": {"solution": True}})
    assert classroom.is_solution(cell)
    assert "markers" in classroom.check_notebook(new_notebook(cells=[cell]))[0]


def test_every_notebook_follows_the_marker_convention():
    problems = [p for path in classroom.default_notebooks()
                for p in classroom.check_notebook(classroom.read_notebook(path), path.name)]
    assert problems == []


def test_cli_reports_a_bad_notebook_and_writes_nothing(tmp_path):
    bad = tmp_path / "01_bad.ipynb"
    nbformat.write(new_notebook(cells=[solution_cell("x = 14")]), str(bad))
    out = tmp_path / "student"
    run = subprocess.run([sys.executable, str(REPO / "tools" / "classroom.py"), "student",
                          "--out", str(out), str(bad)], capture_output=True, text=True)
    assert run.returncode == 1
    assert "01_bad.ipynb cell 0" in run.stderr and "markers" in run.stderr
    assert not out.exists()


# -- student copies of real notebooks ---------------------------------------------------------
@pytest.fixture(scope="module")
def student_copies(tmp_path_factory):
    """(teacher notebooks, student copies): two real notebooks, each with one extra exercise in
    the course's format appended, written by the `student` command and then executed."""
    root = tmp_path_factory.mktemp("classroom")
    teacher_dir, student_dir = root / "notebooks", root / "student"
    teacher_dir.mkdir()
    teachers = {}
    for name in RUN_NOTEBOOKS:
        nb = classroom.read_notebook(REPO / "notebooks" / name)
        nb.cells += exercise_pair()
        nbformat.write(nb, str(teacher_dir / name))
        teachers[name] = nb
    run = subprocess.run([sys.executable, str(REPO / "tools" / "classroom.py"), "student",
                          "--out", str(student_dir)] + [str(teacher_dir / n) for n in RUN_NOTEBOOKS],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    students = {name: classroom.read_notebook(student_dir / name) for name in RUN_NOTEBOOKS}
    executed = {name: classroom.execute(nbformat.from_dict(nb), student_dir)
                for name, nb in students.items()}
    return teachers, students, executed


@pytest.mark.parametrize("name", RUN_NOTEBOOKS)
def test_student_copy_keeps_no_answer(student_copies, name):
    teacher, student, _ = (d[name] for d in student_copies)
    secrets = [line.strip() for line in classroom.solution_lines(teacher) if len(line.strip()) >= 4]
    assert SECRET in secrets
    text = "\n".join(cell.source for cell in student.cells)
    # A line may also occur in an ordinary cell of the teacher's notebook (a print, say): only
    # lines that the copy holds and the teacher's ordinary cells do not are leaked answers.
    public = "\n".join(c.source for c in teacher.cells if not classroom.is_solution(c))
    assert [s for s in secrets if s in text and s not in public] == []
    assert classroom.BEGIN not in text and classroom.END not in text
    assert len(student.cells) == len(teacher.cells)
    for t_cell, s_cell in zip(teacher.cells, student.cells):
        if classroom.is_solution(t_cell):
            assert classroom.CODE_NOTE in s_cell.source
            assert s_cell.outputs == [] and s_cell.execution_count is None
            assert not classroom.is_hidden(s_cell)
        else:
            assert s_cell == t_cell  # source, outputs and metadata unchanged


@pytest.mark.parametrize("name", RUN_NOTEBOOKS)
def test_student_copy_runs_and_prints_hints(student_copies, name):
    _, student, executed = (d[name] for d in student_copies)
    errors = [o for cell in executed.cells if cell.cell_type == "code"
              for o in cell.outputs if o.output_type == "error"]
    assert errors == []
    assert all(c.execution_count is not None for c in executed.cells if c.cell_type == "code")
    last = executed.cells[-1]  # the appended solution cell: its check now sees the placeholder
    printed = "".join(o.get("text", "") for o in last.outputs)
    assert printed == "[decode rows] not answered yet. Hint: one new token goes through each layer\n"


def test_student_copy_implement_exercises_are_not_attempted(student_copies):
    """The `implement` exercises of 02 (softmax, causal_attention): without the solutions the
    checker reports "not attempted" and the real-model cell skips instead of failing (issue 22)."""
    _, _, executed = (d["02_attention_by_hand.ipynb"] for d in student_copies)
    printed = "".join(o.get("text", "") for cell in executed.cells if cell.cell_type == "code"
                      for o in cell.outputs)
    assert "NOT ATTEMPTED softmax" in printed and "NOT ATTEMPTED causal_attention" in printed
    assert "softmax is not written yet: skipping the run inside SmolLM2" in printed
    assert "causal_attention is not written yet" in printed
    assert "PASS " not in printed


def test_timings_runs_a_notebook_and_reports_its_seconds(tmp_path):
    path = tmp_path / "01_tiny.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("import time; time.sleep(0.5); print('ran')")]), str(path))
    run = subprocess.run([sys.executable, str(REPO / "tools" / "classroom.py"), "timings", "--markdown",
                          str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    header, rule, row = run.stdout.strip().splitlines()
    assert header == "| notebook | run time (s) |" and row.startswith("| `01_tiny` | ")
    assert 0.5 <= float(row.split("|")[2]) < 60
    assert nbformat.read(str(path), as_version=4).cells[0].outputs == []  # the file is not written
