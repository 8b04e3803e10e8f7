"""The "implement it" checker (course/implement): the library's own functions pass every case,
a learner-style solution passes, and each classic mistake fails the case written to catch it."""
import math

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.core import ops
from tinydecoder.course.exercises import check_implementation
from tinydecoder.course.implement import Case, exercises
from tinydecoder.decoding import sampling


# -- the library's own functions, in each exercise's signature --------------------------------
def lib_softmax(x):
    return ops.softmax(x)


def lib_causal_attention(q, k, v):
    return ops.attention(q[:, None, :], k[:, None, :], v[:, None, :]).reshape(q.shape)


def lib_apply_rope(x, positions, base=10000.0):
    return ops.apply_rope(x, positions, base)


def lib_gqa_attention(q, k, v):
    return ops.attention(q, k, v).reshape(q.shape)


def lib_top_p_filter(probs, p):
    with np.errstate(divide="ignore"):
        return sampling.probabilities(sampling.top_p_filter(np.log(probs), p))


LIBRARY = {"softmax": lib_softmax, "causal_attention": lib_causal_attention, "apply_rope": lib_apply_rope,
           "gqa_attention": lib_gqa_attention, "top_p_filter": lib_top_p_filter}


# -- wrong versions, each one classic mistake ----------------------------------------------------
def softmax_no_max(x):
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def softmax_whole_array(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def softmax_in_place(x):
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def softmax_float64(x):
    e = np.exp(np.asarray(x, dtype=np.float64) - np.max(x, axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention_with(q, k, v, *, scale=True, mask="before", stable=True):
    d = q.shape[-1]
    s = q @ k.T
    if scale:
        s = s / math.sqrt(d)
    future = np.triu(np.ones(s.shape, bool), 1)
    if mask == "before":
        s = np.where(future, -np.inf, s)
    if stable:
        s = s - s.max(axis=-1, keepdims=True)
    w = np.exp(s)
    w = w / w.sum(axis=-1, keepdims=True)
    if mask == "after":
        w = np.where(future, 0.0, w)
    return w @ v


def rope_with(x, positions, base=10000.0, *, layout="halves", offset=0, fixed_base=None, arange=False):
    T, H, d = x.shape
    pos = np.arange(T) if arange else np.asarray(positions) + offset
    inv = (fixed_base or base) ** (-np.arange(0, d, 2) / d)
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :].astype(x.dtype), np.sin(ang)[:, None, :].astype(x.dtype)
    if layout == "halves":
        a, b = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def gqa_with(q, k, v, *, mapping="block", offset=True, scale=True, mask="before"):
    Tq, Hq, d = q.shape
    Tk, Hkv, _ = k.shape
    g = Hq // Hkv
    out = np.empty_like(q)
    start = Tk - Tq if offset else 0
    future = np.arange(Tk)[None, :] > (start + np.arange(Tq))[:, None]
    for h in range(Hq):
        kv = h // g if mapping == "block" else h % Hkv
        s = q[:, h] @ k[:, kv].T
        if scale:
            s = s / math.sqrt(d)
        if mask == "before":
            s = np.where(future, -np.inf, s)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        w = w / w.sum(axis=-1, keepdims=True)
        if mask == "after":
            w = np.where(future, 0.0, w)
        out[:, h] = w @ v[:, kv]
    return out


def top_p_with(probs, p, *, rule="reach", renormalise=True, sort=True, in_place=False):
    probs = np.asarray(probs)
    order = np.argsort(-probs, kind="stable") if sort else np.arange(probs.size)
    mass = probs[order]
    before = np.cumsum(mass) - mass
    if rule == "reach":
        keep = order[(before < p) & (mass > 0)]
    else:  # "below": cumsum <= p drops the token that crosses p
        keep = order[np.cumsum(mass) <= p]
    out = probs if in_place else np.zeros_like(probs)
    kept = probs[keep].copy()
    if in_place:
        out[:] = 0.0
    out[keep] = kept
    return out / out.sum() if renormalise else out


# The learner-style solutions the notebooks show pass every case too.
SOLUTIONS = {
    "softmax": lambda x: (lambda e: e / e.sum(axis=-1, keepdims=True))(np.exp(x - np.max(x, axis=-1, keepdims=True))),
    "causal_attention": attention_with,
    "apply_rope": rope_with,
    "gqa_attention": gqa_with,
    "top_p_filter": top_p_with,
}

WRONG = [  # (exercise, wrong function, the case meant to catch it)
    ("softmax", softmax_no_max, "large logits (1e4)"),
    ("softmax", softmax_no_max, "very negative logits (-1e4)"),
    ("softmax", softmax_whole_array, "last axis of a 3-d array"),
    ("softmax", softmax_in_place, "input left unchanged"),
    ("softmax", softmax_float64, "float32 in, float32 out"),
    ("causal_attention", lambda q, k, v: attention_with(q, k, v, scale=False), "scaled by 1/sqrt(d) (d = 64)"),
    ("causal_attention", lambda q, k, v: attention_with(q, k, v, mask="after"),
     "weights sum to 1 (mask before softmax)"),
    ("causal_attention", lambda q, k, v: attention_with(q, k, v, mask=None), "no peeking at the future"),
    ("causal_attention", lambda q, k, v: attention_with(q, k, v, mask=None), "first query sees only itself"),
    ("causal_attention", lambda q, k, v: attention_with(q, k, v, stable=False), "large scores (stable softmax)"),
    ("causal_attention", lambda q, k, v: attention_with(q, k, v / np.sqrt(1)), "float32 in, float32 out"),
    ("apply_rope", lambda x, p, base=10000.0: rope_with(x, p, base, layout="interleaved"), "rotate-half layout"),
    ("apply_rope", lambda x, p, base=10000.0: rope_with(x, p, base, offset=1), "position 0 is unchanged"),
    ("apply_rope", lambda x, p, base=10000.0: rope_with(x, p, base, offset=1), "one decode row at position 17"),
    ("apply_rope", lambda x, p, base=10000.0: rope_with(x, p, base, arange=True), "the positions given, not 0..T-1"),
    ("apply_rope", lambda x, p, base=10000.0: rope_with(x, p, base, fixed_base=10000.0), "another base (500000)"),
    ("apply_rope", lambda x, p, base=10000.0: rope_with(x, -np.asarray(p), base) * 1.01, "length of each pair kept"),
    ("gqa_attention", lambda q, k, v: gqa_with(q, k, v, mapping="modulo"), "head mapping h -> h // (Hq/Hkv)"),
    ("gqa_attention", lambda q, k, v: gqa_with(q, k, v, offset=False), "decode: 1 query after 6 keys"),
    ("gqa_attention", lambda q, k, v: gqa_with(q, k, v, offset=False), "chunk: 3 queries after 4 cached keys"),
    ("gqa_attention", lambda q, k, v: gqa_with(q, k, v, scale=False), "scaled by 1/sqrt(d) (d = 64)"),
    ("gqa_attention", lambda q, k, v: gqa_with(q, k, v, mask="after"), "weights sum to 1 (mask before softmax)"),
    ("gqa_attention", lambda q, k, v: gqa_with(q, k, v, mask=None), "first query sees only itself"),
    ("top_p_filter", lambda probs, p: top_p_with(probs, p, rule="below"), "the boundary token is kept"),
    ("top_p_filter", lambda probs, p: top_p_with(probs, p, renormalise=False), "renormalised"),
    ("top_p_filter", lambda probs, p: top_p_with(probs, p, sort=False), "unsorted input"),
    ("top_p_filter", lambda probs, p: top_p_with(probs, p, in_place=True), "input left unchanged"),
]


def test_every_exercise_of_this_part_is_collected():
    found = exercises()
    for name in LIBRARY:
        assert name in found and len(found[name]) >= 5
        assert all(isinstance(c, Case) for c in found[name])
        assert len({c.name for c in found[name]}) == len(found[name])  # case names are unique


@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_library_implementation_passes(name, capsys):
    report = check_implementation(name, LIBRARY[name])
    out = capsys.readouterr().out
    assert report.passed and report.status == "passed" and report.failed == [], out
    assert out.count("PASS ") == len(exercises()[name]) and "FAIL" not in out


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_learner_style_solution_passes(name, capsys):
    report = check_implementation(name, SOLUTIONS[name])
    assert report.passed, capsys.readouterr().out


@pytest.mark.parametrize("name, wrong, case", WRONG, ids=[f"{n}: {c}" for n, _, c in WRONG])
def test_wrong_version_fails_its_case(name, wrong, case, capsys):
    report = check_implementation(name, wrong)
    out = capsys.readouterr().out
    assert report.status == "failed" and not report.passed
    assert case in report.failed, out
    assert f"FAIL {case}: " in out


def test_each_exercise_has_two_wrong_versions_caught():
    for name in LIBRARY:
        assert len({id(w) for n, w, _ in WRONG if n == name}) >= 2


@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_not_attempted_never_raises(name, capsys):
    def stub(*args, **kwargs):
        raise NotImplementedError

    def dots(*args, **kwargs):
        ...

    for fn in (stub, dots):
        report = check_implementation(name, fn)
        out = capsys.readouterr().out
        assert report.status == "not attempted" and not report.passed and not report.attempted
        assert out.startswith("NOT ATTEMPTED") and out.count("\n") == 1


def test_errors_become_failed_cases_with_the_message(capsys):
    def broken(x):
        raise KeyError("oops")

    report = check_implementation("softmax", broken)
    out = capsys.readouterr().out
    assert report.status == "failed" and len(report.failed) == len(exercises()["softmax"])
    assert "(KeyError: 'oops')" in out and "Traceback" not in out


def test_wrong_shape_is_named_and_expected_values_never_printed(capsys):
    report = check_implementation("gqa_attention", lambda q, k, v: lib_gqa_attention(q, k, v).reshape(len(q), -1))
    out = capsys.readouterr().out
    assert "shape [Tq, Hq, d]" in report.failed
    assert "returned shape" in out
    assert "[[" not in out and "array(" not in out  # no array is ever shown


def test_unknown_name_and_not_a_function(capsys):
    assert check_implementation("no_such_thing", lib_softmax).status == "failed"
    assert "no such exercise" in capsys.readouterr().out
    assert check_implementation("softmax", 3).status == "failed"
    assert "expected a function" in capsys.readouterr().out


def test_grade_log_records_each_report(tmp_path, monkeypatch, capsys):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("TINYDECODER_GRADE_LOG", str(log))
    check_implementation("softmax", lib_softmax)
    check_implementation("softmax", softmax_no_max)
    import json

    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["status"] for r in rows] == ["passed", "failed"]
    assert "large logits (1e4)" in rows[1]["failed"]


def test_top_level_kernels_compatible_signatures():
    """The exercise signatures are the ones td.Kernels takes (attention = gqa_attention's)."""
    q = np.random.default_rng(0).standard_normal((3, 9, 64)).astype(np.float32)
    k = np.random.default_rng(1).standard_normal((5, 3, 64)).astype(np.float32)
    out = gqa_with(q, k, k)
    assert out.shape == (3, 9, 64) and out.dtype == np.float32
    np.testing.assert_allclose(out.reshape(3, -1), td.attention(q, k, k), rtol=1e-4, atol=1e-5)
