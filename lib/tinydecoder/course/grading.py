"""Grading a class: run each submitted notebook headless and report its "implement it" exercises.

    python -m tinydecoder grade NOTEBOOK_OR_FOLDER... [--json] [--csv FILE] [--timeout SECONDS]
    make grade SUBMISSIONS=dir          # writes dir/grades.csv

Each notebook runs top to bottom in a fresh kernel (nbclient), with at most `timeout` seconds for
the whole notebook, in its own folder. Every `check_implementation` call inside it appends its
report to a log (the environment variable TINYDECODER_GRADE_LOG, see course/implement); the
last report of each exercise is its grade:

    passed          every case passes
    failed          some case fails (the failed cases are listed)
    not attempted   the function still raises NotImplementedError (or is a `...` stub)
    not run         the notebook stopped (error or timeout) before the exercise was checked

The exercises a notebook holds are the functions defined in its cells tagged `implement`, so an
exercise whose check never ran is still listed. A notebook that did not run to the end says so
on every one of its rows (`ran_to_end` false, `error` the one-line reason); a notebook without
exercises gets one row with exercise None. Rows are dicts with at least notebook, exercise and
status. The exit status is 0 when every notebook ran to the end and every exercise passed, 1
otherwise (2 for bad arguments).
"""
from __future__ import annotations

import ast
import csv
import json
import os
import tempfile
import time
from pathlib import Path

from .implement import GRADE_LOG_ENV

NOT_RUN = "not run"
FIELDS = ("notebook", "exercise", "status", "failed", "ran_to_end", "error")


def implement_exercises(nb) -> list:
    """Names of the functions defined in the cells tagged `implement`, in notebook order."""
    names = []
    for cell in nb.cells:
        if cell.cell_type != "code" or "implement" not in cell.get("metadata", {}).get("tags", []):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        names += [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name not in names]
    return names


def _one_line(exc: BaseException) -> str:
    name = getattr(exc, "ename", None) or type(exc).__name__
    value = getattr(exc, "evalue", None)
    text = str(value if value is not None else exc).strip().splitlines()
    return f"{name}: {text[-1][:200]}" if text else name


def run_notebook(path: Path, timeout: float, log: Path) -> str | None:
    """Execute the notebook at `path` in memory (the file is not written); None when it ran to
    the end, else the one-line reason it stopped."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    deadline = time.monotonic() + timeout
    client = NotebookClient(nb, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                            timeout_func=lambda cell: max(1, int(deadline - time.monotonic())))
    saved = os.environ.get(GRADE_LOG_ENV)
    os.environ[GRADE_LOG_ENV] = str(log)
    try:
        client.execute()
    except Exception as exc:  # a learner's error, a timeout or a dead kernel: reported, not raised
        if time.monotonic() >= deadline:
            return f"timed out after {timeout:g} s"
        return _one_line(exc)
    finally:
        if saved is None:
            os.environ.pop(GRADE_LOG_ENV, None)
        else:
            os.environ[GRADE_LOG_ENV] = saved
    return None


def grade_notebook(path, timeout: float = 600) -> list:
    """One row per exercise of the notebook at `path` (see the module docstring)."""
    import nbformat

    path = Path(path)
    names = implement_exercises(nbformat.read(str(path), as_version=4))
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "reports.jsonl"
        error = run_notebook(path, timeout, log)
        lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    last = {}
    for line in lines:
        report = json.loads(line)
        last[report["exercise"]] = report
    names += [name for name in last if name not in names]
    base = {"notebook": str(path), "ran_to_end": error is None, "error": error}
    if not names:
        return [base | {"exercise": None, "status": "no exercises" if error is None else NOT_RUN, "failed": []}]
    return [base | {"exercise": name, "status": last[name]["status"] if name in last else NOT_RUN,
                    "failed": last[name]["failed"] if name in last and last[name]["status"] == "failed" else []}
            for name in names]


def grade(paths, timeout: float = 600, on_row=None) -> list:
    rows = []
    for path in paths:
        for row in grade_notebook(path, timeout):
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def format_row(row: dict) -> str:
    text = f"{row['notebook']}  {row['exercise'] or '-'}: {row['status']}"
    if row["failed"]:
        text += f" (failed: {', '.join(row['failed'])})"
    if not row["ran_to_end"]:
        text += f"  [notebook did not run to the end: {row['error']}]"
    return text


def write_csv(rows, path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow(row | {"failed": "; ".join(row["failed"]), "exercise": row["exercise"] or ""})
