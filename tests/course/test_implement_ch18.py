"""Chapter 18's "implement it" exercise, block_hash_chain: the library's own chain passes every
case, a learner-style loop passes, and each classic mistake fails the case written for it."""
import pytest

from tinydecoder.course.exercises import check_implementation
from tinydecoder.course.implement import exercises
from tinydecoder.serving.blocks import block_hash, block_hashes

CASES = {c.name: c for c in exercises()["block_hash_chain"]}


def learner(token_ids, block_size):
    hashes, parent = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes


def no_parent(token_ids, block_size):  # every block hashed on its own
    return [block_hash(None, token_ids[i * block_size:(i + 1) * block_size])
            for i in range(len(token_ids) // block_size)]


def partial_block_too(token_ids, block_size):  # the trailing partial block gets a name
    hashes, parent = [], None
    for i in range(-(-len(token_ids) // block_size)):
        parent = block_hash(parent, token_ids[i * block_size:(i + 1) * block_size])
        hashes.append(parent)
    return hashes


def shifted_blocks(token_ids, block_size):  # off by one: block i starts at i * block_size + 1
    hashes, parent = [], None
    for i in range(len(token_ids) // block_size):
        parent = block_hash(parent, token_ids[i * block_size + 1:(i + 1) * block_size + 1])
        hashes.append(parent)
    return hashes


def one_block_short(token_ids, block_size):  # off by one in the count: (n - 1) // B blocks
    hashes, parent = [], None
    for i in range((len(token_ids) - 1) // block_size):
        parent = block_hash(parent, token_ids[i * block_size:(i + 1) * block_size])
        hashes.append(parent)
    return hashes


def test_library_and_learner_pass_every_case(capsys):
    for fn in (block_hashes, learner):
        report = check_implementation("block_hash_chain", fn)
        assert report.passed, report.failed
    assert "FAIL" not in capsys.readouterr().out


@pytest.mark.parametrize("wrong, case", [
    (no_parent, "a block's name covers its parent"),
    (partial_block_too, "no name for a partial block"),
    (shifted_blocks, "block boundaries"),
    (one_block_short, "a prompt that ends on a block boundary"),
])
def test_each_mistake_fails_its_case(wrong, case, capsys):
    assert not _passes(CASES[case], wrong)  # the case meant to catch it
    report = check_implementation("block_hash_chain", wrong)
    assert not report.passed and case in report.failed
    out = capsys.readouterr().out
    assert f"FAIL {case}: " in out
    assert block_hashes([1, 2, 3, 4], 2)[0] not in out  # never prints an expected hash


def _passes(case, fn) -> bool:
    try:
        return bool(case.run(fn))
    except Exception:  # a raising case is a failed case too (the checker says so)
        return False


def test_stub_is_not_attempted(capsys):
    def stub(token_ids, block_size):
        raise NotImplementedError
    report = check_implementation("block_hash_chain", stub)
    assert report.status == "not attempted"
    assert "NOT ATTEMPTED block_hash_chain" in capsys.readouterr().out

