"""The "implement it" exercises of chapters 12 and 15: the library's own implementation passes
every case, and each classic wrong version fails, on the case meant to catch it."""
import math

import numpy as np
import pytest

from tinydecoder.course.implement import ch12, ch15, check_implementation


def _online(q, k, v, block_size, *, rescale=True, lse_max=True, shift=True):
    """online_softmax_attention with one classic mistake switched on or off."""
    Tq, d = q.shape
    scale = q.dtype.type(1 / math.sqrt(d))
    m = np.full(Tq, -np.inf, q.dtype)
    total = np.zeros(Tq, q.dtype)
    acc = np.zeros((Tq, v.shape[1]), q.dtype)
    for start in range(0, k.shape[0], block_size):
        s = (q @ k[start:start + block_size].T) * scale  # [Tq, B]
        m_new = np.maximum(m, s.max(axis=1)) if shift else np.zeros(Tq, q.dtype)
        alpha = np.exp(m - m_new) if rescale else np.ones(Tq, q.dtype)
        p = np.exp(s - m_new[:, None])
        total = alpha * total + p.sum(axis=1)
        acc = alpha[:, None] * acc + p @ v[start:start + block_size]
        m = m_new
    return acc / total[:, None], (m + np.log(total) if lse_max else np.log(total))


def _rule(p, q, x, rng, *, inverted=False, resample="residual"):
    """accept_or_resample with one classic mistake."""
    ratio = q[x] / p[x] if inverted and p[x] > 0 else (p[x] / q[x] if not inverted else np.inf)
    if rng.random() < ratio:
        return True, int(x)
    dist = {"residual": np.maximum(p - q, 0), "p": p, "q": q}[resample]
    return False, int(rng.choice(len(p), p=dist / dist.sum()))


def report(name, fn, capsys):
    result = check_implementation(name, fn)
    capsys.readouterr()
    return result


def test_the_library_passes(capsys):
    assert report("online_softmax_attention", ch12.reference, capsys).passed
    assert report("accept_or_resample", ch15.reference, capsys).passed
    assert report("online_softmax_attention", _online, capsys).passed  # the test's own, right version
    assert report("accept_or_resample", _rule, capsys).passed


@pytest.mark.parametrize("mistake, caught_by", [
    ({"rescale": False}, "the max grows in every block"),
    ({"lse_max": False}, "log-sum-exp includes the max"),
    ({"shift": False}, "large float32 scores"),
])
def test_online_softmax_mistakes(mistake, caught_by, capsys):
    r = report("online_softmax_attention", lambda *a: _online(*a, **mistake), capsys)
    assert not r.passed and caught_by in r.failed


@pytest.mark.parametrize("mistake, caught_by", [
    ({"inverted": True}, "accepted with probability p(x) / q(x)"),
    ({"resample": "p"}, "resampled from max(0, p - q)"),
    ({"resample": "q"}, "resampled from max(0, p - q)"),
])
def test_accept_or_resample_mistakes(mistake, caught_by, capsys):
    r = report("accept_or_resample", lambda *a: _rule(*a, **mistake), capsys)
    assert not r.passed and caught_by in r.failed
    assert "output distributed as p (chi-square)" in r.failed  # the distribution test sees it too


def test_stubs_are_not_attempted(capsys):
    def stub(*args):
        raise NotImplementedError

    for name in ("online_softmax_attention", "accept_or_resample"):
        r = check_implementation(name, stub)
        assert r.status == "not attempted"
        assert "NOT ATTEMPTED" in capsys.readouterr().out
