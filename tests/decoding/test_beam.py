"""Beam search: 1 beam is greedy, the cache changes nothing, a beam as wide as the space finds the
exhaustive best, and the classic bug (cache rows not reordered by parent beam) is caught."""
import itertools

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.core.config import Config
from tinydecoder.decoding import beam
from tinydecoder.decoding.beam import beam_search, log_softmax, reorder_caches, sequence_logprob


@pytest.fixture(scope="module")
def toy():
    return td.toy_model()


@pytest.fixture(scope="module")
def rope_model():  # GQA + RoPE + norms, float32, like SmolLM2 in miniature
    cfg = Config(vocab_size=23, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, n_layers=2, d_ff=32,
                 max_context=64, position="rope", norm_scale=True, tied_embeddings=True, name="tiny-rope")
    return td.random_model(cfg, seed=3, scale=0.6)


def all_sequences(model, prompt, n, stop=None):
    """Every continuation of up to n tokens (ending at `stop` or at length n) with its log-prob."""
    V = model.config.vocab_size
    out = {}
    for length in (range(1, n + 1) if stop is not None else [n]):
        for seq in itertools.product(range(V), repeat=length):
            if stop is not None and (stop in seq[:-1] or (length < n and seq[-1] != stop)):
                continue
            out[seq] = sequence_logprob(model, prompt, list(seq))
    return out


@pytest.mark.parametrize("which", ["toy", "rope_model"])
def test_one_beam_is_greedy(which, request):
    model = request.getfixturevalue(which)
    prompt = [0, 1, 2, 3]
    greedy = td.generate(model, prompt, 8).new_tokens
    result = beam_search(model, prompt, 1, 8)
    assert result.best.tokens == greedy and len(result.beams) == 1
    if which == "toy":
        assert greedy[:4] == td.SEED_CONTINUATION
    assert result.best.logprob == pytest.approx(sequence_logprob(model, prompt, greedy), abs=1e-5)
    # with a stop token and length_penalty 0 it also stops where greedy stops
    stop = greedy[2]
    gen = td.generate(model, prompt, 8, stop_tokens=(stop,)).new_tokens
    assert beam_search(model, prompt, 1, 8, length_penalty=0, stop_tokens=(stop,)).best.tokens == gen


@pytest.mark.parametrize("which", ["toy", "rope_model"])
def test_cache_equals_full_recompute(which, request):
    model = request.getfixturevalue(which)
    a = beam_search(model, [1, 2, 3], 4, 6, stop_tokens=(5,))
    b = beam_search(model, [1, 2, 3], 4, 6, stop_tokens=(5,), use_cache=False)
    assert [x.tokens for x in a.beams] == [x.tokens for x in b.beams]
    assert np.allclose([x.logprob for x in a.beams], [x.logprob for x in b.beams], atol=1e-5)
    assert [[c["status"] for c in s] for s in a.steps] == [[c["status"] for c in s] for s in b.steps]
    assert a.forward_calls == b.forward_calls == len(a.steps)


def test_wide_beam_finds_the_exhaustive_ranking(toy):
    prompt, n = [0, 1, 2, 3], 3
    scores = all_sequences(toy, prompt, n)  # 6**3 = 216 sequences
    ranked = sorted(scores, key=lambda s: -scores[s])
    width = 6 ** (n - 1)  # every prefix survives until the last step
    result = beam_search(toy, prompt, width, n)
    assert [tuple(b.tokens) for b in result.beams] == ranked[:width]
    assert np.allclose([b.logprob for b in result.beams], [scores[s] for s in ranked[:width]], atol=1e-12)
    assert np.allclose([b.score for b in result.beams], [scores[s] / n for s in ranked[:width]])


def test_wide_beam_with_stop_token_finds_the_exhaustive_best(toy):
    prompt, n, stop = [0, 1, 2, 3], 3, 4
    scores = all_sequences(toy, prompt, n, stop=stop)  # finished early or full length
    ranked = sorted(scores, key=lambda s: -scores[s])
    result = beam_search(toy, prompt, len(scores), n, length_penalty=0, stop_tokens=(stop,))
    assert [tuple(b.tokens) for b in result.beams] == ranked
    assert [b.finished for b in result.beams] == [s[-1] == stop for s in ranked]


def test_finished_beams_are_set_aside_and_ranked(toy):
    result = beam_search(toy, [0, 1, 2, 3], 3, 8, stop_tokens=(4,))
    assert any(b.finished for b in result.beams)
    for b in result.beams:
        assert (b.tokens[-1] == 4) == b.finished and 4 not in b.tokens[:-1]
        assert b.score == pytest.approx(b.logprob / len(b.tokens))
    assert [b.score for b in result.beams] == sorted((b.score for b in result.beams), reverse=True)
    # the candidates tree: each kept/finished candidate extends a live beam of the step before
    for t, cands in enumerate(result.steps):
        live_before = 1 if t == 0 else sum(c["status"] == "kept" for c in result.steps[t - 1])
        assert all(0 <= c["parent"] < live_before for c in cands)
        assert sum(c["status"] == "kept" for c in cands) <= 3 and len(cands) <= 6


def test_length_penalty_changes_the_ranking(toy):
    plain = beam_search(toy, [0, 1, 2, 3], 4, 6, length_penalty=0.0, stop_tokens=(4,))
    longer = beam_search(toy, [0, 1, 2, 3], 4, 6, length_penalty=2.0, stop_tokens=(4,))
    assert np.mean([len(b.tokens) for b in longer.beams]) >= np.mean([len(b.tokens) for b in plain.beams])
    assert all(b.score == pytest.approx(b.logprob) for b in plain.beams)


def wrong_reorder(caches, parents, extra=0):
    """The classic bug: beam i keeps cache row/object i whatever its parent was."""
    return [caches[i] if i < len(caches) else caches[0].copy(extra) for i in range(len(parents))]


@pytest.mark.parametrize("which", ["toy", "rope_model"])
def test_not_reordering_the_cache_is_caught(which, request, monkeypatch):
    model = request.getfixturevalue(which)
    prompt = [0, 1, 2, 3]
    reference = beam_search(model, prompt, 3, 8, use_cache=False)
    assert [b.tokens for b in beam_search(model, prompt, 3, 8).beams] == [b.tokens for b in reference.beams]
    monkeypatch.setattr(beam, "reorder_caches", wrong_reorder)
    buggy = beam_search(model, prompt, 3, 8)
    assert [b.tokens for b in buggy.beams] != [b.tokens for b in reference.beams] or \
        not np.allclose([b.logprob for b in buggy.beams], [b.logprob for b in reference.beams], atol=1e-6)


def test_reorder_caches_copies_only_repeated_parents(toy):
    caches = [toy.new_cache(), toy.new_cache()]
    td.forward(toy, [1, 2], caches[0])
    td.forward(toy, [3], caches[1])
    out = reorder_caches(caches, [0, 0, 1], extra=2)
    assert out[0] is caches[0] and out[2] is caches[1] and out[1] is not caches[0]
    assert len(out[1]) == 2 and np.array_equal(out[1].k[0][:2], caches[0].k[0][:2])


def test_processors_reach_every_beam(toy):
    banned = td.LogitBias({t: -np.inf for t in (0, 1)})
    result = beam_search(toy, [0, 1, 2, 3], 3, 5, processors=[banned])
    assert all(not {0, 1} & set(b.tokens) for b in result.beams)


def test_log_softmax_and_sequence_logprob(toy):
    z = np.array([1.0, 2.0, -np.inf])
    assert np.allclose(np.exp(log_softmax(z)), [1 / (1 + np.e), np.e / (1 + np.e), 0])
    logits = td.forward(toy, [0, 1, 2, 3, 3])
    manual = log_softmax(logits[3])[3] + log_softmax(logits[4])[2]
    assert sequence_logprob(toy, [0, 1, 2, 3], [3, 2]) == pytest.approx(manual)
    assert sequence_logprob(toy, [0], []) == 0.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(beams=0), "beams must be an integer >= 1"),
    (dict(beams=2.5), "beams must be an integer >= 1"),
    (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
    (dict(length_penalty=float("nan")), "length_penalty must be a finite number"),
    (dict(max_new_tokens=100), "context too long"),
])
def test_bad_arguments(toy, kwargs, match):
    args = dict(beams=2, max_new_tokens=3) | kwargs
    with pytest.raises(ValueError, match=match):
        beam_search(toy, [0, 1], **args)
