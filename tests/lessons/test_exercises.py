"""The exercise checker: prints a hint for a placeholder, says correct or not, never raises."""
import numpy as np

from tinydecoder.lessons.exercises import check, matches


def test_placeholder_prints_hint(capsys):
    assert check("rows", None, 14, hint="one row per layer") is None
    assert capsys.readouterr().out == "[rows] not answered yet. Hint: one row per layer\n"
    check("rows", ..., 14, hint="h")
    assert capsys.readouterr().out == "[rows] not answered yet. Hint: h\n"


def test_right_and_wrong_answers(capsys):
    check("rows", 14, 14, hint="h")
    check("rows", 15, 14, hint="look at the cache")
    out = capsys.readouterr().out.splitlines()
    assert out == ["[rows] correct.", "[rows] not quite: you answered 15. Hint: look at the cache"]


def test_wrong_answer_never_shows_expected(capsys):
    check("secret", 1, 987654321, hint="h")
    assert "987654321" not in capsys.readouterr().out


def test_matches_numbers_arrays_and_other_values():
    assert matches(0.1 + 0.2, 0.3) and not matches(0.31, 0.3)
    assert matches([1, 2], np.array([1.0, 2.0])) and not matches([1, 2], [1, 2, 3])
    assert matches({1, 2}, {2, 1}) and not matches("a", "b")
    assert matches(1.05, 1.0, atol=0.1) and not matches(True, False)
