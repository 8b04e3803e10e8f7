"""The notebooks as a course: five parts in order, exercises whose answers are hidden, links
from each notebook to the next. (Their outputs are checked by nbval; this checks their shape.)"""
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PARTS = {range(1, 11): "Part I", range(11, 16): "Part II", range(16, 22): "Part III", range(22, 24): "Part IV",
         range(24, 26): "Part V"}


def load(path):
    return json.loads(path.read_text())


def part_of(number: int) -> str:
    return next(name for numbers, name in PARTS.items() if number in numbers)


def source(cell) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_at_least_two_exercises_with_hidden_answers(path):
    cells = load(path)["cells"]
    solutions = [i for i, c in enumerate(cells) if "solution" in c.get("metadata", {}).get("tags", [])]
    assert len(solutions) >= 2, f"{path.name}: {len(solutions)} solution cells, the course asks for at least 2"
    for i in solutions:
        cell = cells[i]
        assert cell["cell_type"] == "code"
        assert cell["metadata"].get("jupyter", {}).get("source_hidden") is True, f"{path.name} cell {i}: source shown"
        text = source(cell)
        assert "### BEGIN SOLUTION" in text and "### END SOLUTION" in text, f"{path.name} cell {i}: no nbgrader markers"
        assert text.index("### BEGIN SOLUTION") < text.index("### END SOLUTION")
        before = cells[i - 1]
        assert "solution" not in before.get("metadata", {}).get("tags", []) and before["cell_type"] == "code", (
            f"{path.name} cell {i}: an answer follows the learner's own cell")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_first_cell_names_the_part_and_last_cell_links_on(path):
    cells = load(path)["cells"]
    number = int(path.name[:2])
    first = source(cells[0])
    assert cells[0]["cell_type"] == "markdown" and re.search(rf"\b{part_of(number)}\b", first), (
        f"{path.name}: the first cell must say it belongs to {part_of(number)}")
    later = [p for p in NOTEBOOKS if int(p.name[:2]) > number]
    if later:
        assert later[0].name in source(cells[-1]), f"{path.name}: the last cell must link to {later[0].name}"


def test_the_course_map_is_complete():
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers == list(range(1, len(numbers) + 1)), f"notebooks present: {numbers}"
    assert max(numbers) == max(max(r) for r in PARTS), f"the course map ends at {max(numbers)}"


APPENDICES = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("A[0-9]_*.ipynb"))


def test_the_appendix_exists_says_it_is_one_and_hides_its_answers():
    names = [p.name for p in APPENDICES]
    assert "A1_how_the_fast_path_works.ipynb" in names, f"appendices present: {names}"
    for path in APPENDICES:
        cells = load(path)["cells"]
        first = source(cells[0])
        assert cells[0]["cell_type"] == "markdown" and re.search(r"\bappendix\b", first, re.I), (
            f"{path.name}: the first cell must say it is an appendix")
        assert "What you will learn" in first, f"{path.name}: the first cell must say what you will learn"
        test_at_least_two_exercises_with_hidden_answers(path)  # the chapters' rules for hidden answers
