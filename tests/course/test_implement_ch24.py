"""Chapter 24's implement exercise (top_k_gating): the library passes every case, and each
classic mistake fails the case written to catch it."""
import numpy as np
import pytest

from tinydecoder.algorithms import moe
from tinydecoder.course.implement import check_implementation


def gating_with(logits, k, *, renormalise=True, order="stable", shift=True):
    x = np.asarray(logits, dtype=np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True) if shift else x)
    p = e / e.sum(axis=1, keepdims=True)
    if order == "stable":
        experts = np.argsort(-p, axis=1, kind="stable")[:, :k]
    elif order == "ties high":  # largest first, but equal probabilities go to the higher id
        experts = np.argsort(p, axis=1, kind="stable")[:, ::-1][:, :k]
    else:  # "smallest first" among the k largest
        experts = np.sort(np.argsort(-p, axis=1, kind="stable")[:, :k], axis=1)
        experts = np.take_along_axis(experts, np.argsort(np.take_along_axis(p, experts, 1), axis=1), 1)
    top = np.take_along_axis(p, experts, axis=1)
    return experts, top / top.sum(axis=1, keepdims=True) if renormalise else top


def test_the_library_passes(capsys):
    assert check_implementation("top_k_gating", moe.top_k_gating).passed
    assert check_implementation("top_k_gating", gating_with).passed


@pytest.mark.parametrize("wrong, case", [
    (lambda l, k: gating_with(l, k, renormalise=False), "gates sum to 1"),
    (lambda l, k: gating_with(l, k, renormalise=False), "by hand: probabilities [.1 .2 .3 .4], k = 2"),
    (lambda l, k: gating_with(l, k, order="ties high"), "ties go to the lower id"),
    (lambda l, k: gating_with(l, k, order="smallest first"), "largest first"),
    (lambda l, k: gating_with(l, k, shift=False), "large logits"),
])
def test_each_mistake_fails_its_case(wrong, case, capsys):
    report = check_implementation("top_k_gating", wrong)
    assert case in report.failed, report.failed


def test_an_unattempted_stub_is_not_attempted(capsys):
    def stub(router_logits, k):
        raise NotImplementedError
    assert check_implementation("top_k_gating", stub).status == "not attempted"
