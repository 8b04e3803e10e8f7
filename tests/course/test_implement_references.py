"""Every exercise names its library reference, and the reference passes all its own cases."""
import pytest

from tinydecoder.course import exercises as exercises_module
from tinydecoder.course.implement import check_implementation, exercises, reference


@pytest.mark.parametrize("name", sorted(exercises()))
def test_every_reference_passes_all_its_cases(name, capsys):
    fn = reference(name)
    assert callable(fn) and fn.__module__.startswith("tinydecoder.")
    report = check_implementation(name, fn)
    out = capsys.readouterr().out
    assert report.passed and report.failed == [], out
    assert out.count("PASS ") == len(exercises()[name])


def test_reference_is_also_in_course_exercises_and_unknown_names_fail():
    assert exercises_module.reference("softmax") is reference("softmax")
    with pytest.raises(KeyError, match="no exercise 'nope'"):
        reference("nope")


def test_the_new_exercises_are_collected():
    new = {"pre_norm_block", "cached_greedy", "paged_decode_attention", "chunk_mask", "tensor_parallel_swiglu",
           "moe_forward", "apply_token_bitmask"}
    found = exercises()
    assert new <= set(found) and {"BlockAllocator", "block_hash_chain", "top_k_gating"} <= set(found)
    for name in new:
        assert len(found[name]) >= 6 and len({c.name for c in found[name]}) == len(found[name])


def test_every_implement_cell_of_the_notebooks_is_a_known_exercise():
    from pathlib import Path

    import nbformat

    from tinydecoder.course.grading import implement_exercises

    found = {}
    for path in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for name in implement_exercises(nbformat.read(str(path), as_version=4)):
            found[name] = path.name[:2]
    assert set(found) <= set(exercises()), set(found) - set(exercises())
    new = {"pre_norm_block": "03", "cached_greedy": "07", "paged_decode_attention": "17", "chunk_mask": "19",
           "tensor_parallel_swiglu": "22", "moe_forward": "24", "apply_token_bitmask": "25"}
    assert {name: found.get(name) for name in new} == new
