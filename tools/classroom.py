"""Classroom tools for the notebooks: student copies, a solution-marker check, run timings, and
the static site (tools/classroom_site.py). Standard library + nbformat (+ nbclient for timings,
nbconvert for the site); it does not import tinydecoder.

    python tools/classroom.py check    [NOTEBOOK ...]       # solution cells follow nbgrader's markers
    python tools/classroom.py student  [--out student] [NOTEBOOK ...]
    python tools/classroom.py site     [--out site] [NOTEBOOK ...]
    python tools/classroom.py timings  [--markdown] [NOTEBOOK ...]

Without NOTEBOOK arguments each command takes notebooks/*.ipynb.

Solution cells. A cell is a solution cell when it carries the tag `solution` (or nbgrader's own
`metadata.nbgrader.solution: true`). Its answer sits between two lines that read exactly
`### BEGIN SOLUTION` and `### END SOLUTION` (after stripping blanks), the rule of nbgrader's
ClearSolutions; a cell may hold several such regions, never nested. Lines outside the regions
(typically the `check(...)` call) belong to the exercise, not to the answer.

The student copy (our choice, documented in docs/teaching.md): each region becomes one comment
line at the marker's indentation (plus `...` when indented, so a function body stays valid
Python); the lines outside the regions stay, so the cell still runs and `check` prints the hint
for the learner's answer in the exercise cell above. nbgrader would put
`raise NotImplementedError()` there instead, which stops "Run all" at the first exercise. The
cell's outputs go, its execution count becomes None, and `jupyter.source_hidden` is dropped so the
note is visible. Every other cell is copied unchanged, outputs included.

`check` is stricter than nbgrader, which replaces a whole solution cell that lacks markers and
ignores a stray END: here a solution cell without both markers, an END without a BEGIN, a nested
BEGIN, a BEGIN without END, a marker outside a solution cell, or a solution cell whose source is
not hidden is an error that names the notebook and cell.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
CODE_NOTE = "# Solution removed in the student copy: write your answer in the exercise cell above."
TEXT_NOTE = "*Solution removed in the student copy.*"


class SolutionMarkerError(ValueError):
    """A solution cell (or a marker) that breaks the `### BEGIN/END SOLUTION` convention."""


def default_notebooks() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def read_notebook(path: Path):
    return nbformat.read(str(path), as_version=4)


def is_solution(cell) -> bool:
    meta = cell.get("metadata", {})
    return "solution" in meta.get("tags", []) or bool(meta.get("nbgrader", {}).get("solution"))


def is_hidden(cell) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def _marker(line: str) -> str | None:
    stripped = line.strip()
    return stripped if stripped in (BEGIN, END) else None


def split_solution(source: str, cell_type: str = "code") -> tuple[str, list[str]]:
    """(source with each solution region replaced by the note, the removed answer lines).

    Raises SolutionMarkerError when the markers are missing, unbalanced or nested."""
    lines = source.split("\n")
    note = CODE_NOTE if cell_type == "code" else TEXT_NOTE
    kept, removed, inside, n_regions = [], [], False, 0
    for number, line in enumerate(lines, start=1):
        marker = _marker(line)
        if marker == BEGIN:
            if inside:
                raise SolutionMarkerError(f"line {number}: nested {BEGIN!r} (the previous one is not closed)")
            inside, n_regions = True, n_regions + 1
            indent = line[: len(line) - len(line.lstrip())]
            kept.append(indent + note)
            if indent and cell_type == "code":
                kept.append(indent + "...")  # keeps an indented block (a def body) valid
        elif marker == END:
            if not inside:
                raise SolutionMarkerError(f"line {number}: {END!r} without a {BEGIN!r} before it")
            inside = False
        elif inside:
            removed.append(line)
        else:
            kept.append(line)
    if inside:
        raise SolutionMarkerError(f"{BEGIN!r} without a matching {END!r}")
    if n_regions == 0:
        raise SolutionMarkerError(f"solution cell without the nbgrader markers {BEGIN!r} / {END!r}")
    return "\n".join(kept), removed


def check_notebook(nb, name: str = "notebook") -> list[str]:
    """Every breach of the solution-cell convention in `nb`, one message each ([] when clean)."""
    problems = []
    for index, cell in enumerate(nb.cells):
        where = f"{name} cell {index}"
        has_marker = any(_marker(line) for line in cell.source.split("\n"))
        if not is_solution(cell):
            if has_marker:
                problems.append(f"{where}: solution marker in a cell not tagged 'solution'")
            continue
        try:
            _, removed = split_solution(cell.source, cell.cell_type)
        except SolutionMarkerError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if not any(line.strip() for line in removed):
            problems.append(f"{where}: the solution region is empty")
        if not is_hidden(cell):
            problems.append(f"{where}: solution cell without metadata jupyter.source_hidden = true")
    return problems


def student_notebook(nb, name: str = "notebook"):
    """A copy of `nb` with every solution removed (see the module docstring).

    Raises SolutionMarkerError listing every problem `check_notebook` finds."""
    problems = check_notebook(nb, name)
    if problems:
        raise SolutionMarkerError("\n".join(problems))
    student = copy.deepcopy(nb)
    for cell in student.cells:
        if not is_solution(cell):
            continue
        cell.source, _ = split_solution(cell.source, cell.cell_type)
        cell.metadata.get("jupyter", {}).pop("source_hidden", None)
        if cell.metadata.get("jupyter") == {}:
            del cell.metadata["jupyter"]
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return student


def solution_lines(nb) -> list[str]:
    """The answer lines of every solution cell (what must not reach a student copy)."""
    return [line for cell in nb.cells if is_solution(cell)
            for line in split_solution(cell.source, cell.cell_type)[1]]


def write_student_copies(notebooks: list[Path], out_dir: Path) -> list[Path]:
    """Write out_dir/NAME.ipynb for each notebook (old *.ipynb there are removed first)."""
    prepared, problems = [], []
    for path in notebooks:
        nb = read_notebook(path)
        found = check_notebook(nb, path.name)
        problems += found
        if not found:
            prepared.append((path.name, student_notebook(nb, path.name)))
    if problems:  # write nothing rather than a mix of fresh and stale copies
        raise SolutionMarkerError("\n".join(problems))
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.ipynb"):
        stale.unlink()
    written = []
    for name, student in prepared:
        nbformat.write(student, str(out_dir / name))
        written.append(out_dir / name)
    return written


def execute(nb, cwd: Path, timeout: int = 120):
    """Run `nb` top to bottom in a fresh kernel of this Python (cwd: `cwd`); returns it executed."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def notebook_timings(notebooks: list[Path], timeout: int = 120):
    """Yield (name, wall-clock seconds) for running each notebook top to bottom with nbclient
    (kernel start included). The notebooks are executed in memory; the files are not written."""
    for path in notebooks:
        nb = read_notebook(path)
        start = time.perf_counter()
        execute(nb, path.parent, timeout)
        yield path.stem, time.perf_counter() - start


def _paths(args) -> list[Path]:
    paths = [Path(p) for p in args.notebooks] or default_notebooks()
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SystemExit(f"no such notebook: {', '.join(missing)}")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="classroom.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("check", "check the solution markers"),
                            ("student", "write student copies"),
                            ("site", "build the static site"),
                            ("timings", "time each notebook, top to bottom")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("notebooks", nargs="*", help="default: notebooks/*.ipynb")
        if name == "student":
            p.add_argument("--out", type=Path, default=REPO / "student")
        if name == "site":
            p.add_argument("--out", type=Path, default=REPO / "site")
            p.add_argument("--npm-cache", type=Path, default=REPO / "build" / "classroom-npm")
        if name == "timings":
            p.add_argument("--markdown", action="store_true", help="print a markdown table")
            p.add_argument("--timeout", type=int, default=120, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = _paths(args)
    try:
        if args.command == "check":
            problems = [p for path in paths for p in check_notebook(read_notebook(path), path.name)]
            for problem in problems:
                print(problem, file=sys.stderr)
            n_cells = sum(sum(map(is_solution, read_notebook(p).cells)) for p in paths)
            print(f"{len(paths)} notebooks, {n_cells} solution cells, {len(problems)} problems")
            return 1 if problems else 0
        if args.command == "student":
            written = write_student_copies(paths, args.out)
            print(f"wrote {len(written)} student copies to {args.out}")
            return 0
        if args.command == "site":
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from classroom_site import build_site

            index = build_site(paths, args.out, args.npm_cache)
            print(f"wrote {index}")
            return 0
        if args.markdown:
            print("| notebook | run time (s) |\n|---|---:|", flush=True)
        for stem, seconds in notebook_timings(paths, args.timeout):
            print(f"| `{stem}` | {seconds:.1f} |" if args.markdown else f"{seconds:7.1f} s  {stem}",
                  flush=True)
        return 0
    except SolutionMarkerError as exc:
        print(f"solution markers: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
