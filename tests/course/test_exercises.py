"""The exercise checker: prints a hint for a placeholder, says correct or not, never raises."""
import numpy as np
import pytest

from tinydecoder.course.exercises import check, matches, within_rounding


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


def test_within_rounding_prints_the_bound_not_the_rounding():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 64))
    assert within_rounding(x, x + 1e-15 * rng.standard_normal(x.shape)) == "< 1e-12 (float64)"
    x32 = x.astype(np.float32)
    noisy = x32 + np.float32(3e-7) * rng.standard_normal(x.shape).astype(np.float32)
    assert within_rounding(x32, noisy) == "< 1e-05 (float32)"
    assert within_rounding(x32, x) == "< 1e-05 (float32)"  # the less precise type sets the bound
    assert within_rounding(x[:0], x[:0]) == "< 1e-12 (float64)"


def test_within_rounding_shows_a_real_difference():
    a = np.zeros((3, 4), np.float32)
    b = a.copy()
    b[1, 2] = 0.03
    assert within_rounding(a, b) == "3.0e-02 (NOT within float32 rounding, 1e-05)"
    assert within_rounding(a.astype(np.float64), b.astype(np.float64) * 1e-12).startswith("< 1e-12")
    assert within_rounding(np.float64(1e-11), 0.0) == "1.0e-11 (NOT within float64 rounding, 1e-12)"
    assert within_rounding([np.nan], [0.0]).startswith("nan (NOT within")


def test_within_rounding_rejects_mismatched_shapes_and_integers():
    with pytest.raises(ValueError, match=r"one shape, got \(2,\) and \(3,\)"):
        within_rounding(np.zeros(2), np.zeros(3))
    with pytest.raises(TypeError, match="float32 or float64"):
        within_rounding(np.arange(3), np.arange(3))


def test_check_logs_name_expected_and_hint_when_asked(tmp_path, monkeypatch, capsys):
    import json

    from tinydecoder.course.exercises import CHECK_LOG_ENV

    log = tmp_path / "checks.jsonl"
    check("off", None, expected=1, hint="h")  # no variable: nothing written
    monkeypatch.setenv(CHECK_LOG_ENV, str(log))
    check("ridge", None, expected=np.float64(295.2), hint="peak over bandwidth")
    check("shape", (4, 16), expected=np.zeros((4, 16)).shape, hint="rows, width")
    check("big", None, expected=np.zeros(1000, np.float32), hint="an array")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert rows == [{"name": "ridge", "expected": 295.2, "hint": "peak over bandwidth"},
                    {"name": "shape", "expected": [4, 16], "hint": "rows, width"},
                    {"name": "big", "expected": {"shape": [1000], "dtype": "float32"}, "hint": "an array"}]
    assert "295.2" not in capsys.readouterr().out  # logging never prints the expected value
