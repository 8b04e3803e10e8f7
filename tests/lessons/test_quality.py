"""`python -m tinydecoder eval` (lessons/quality*.py): windows that score every token once,
perplexity equal to a direct computation, KL to the reference, the variants' weights, the
shipped text, the --json object and the errors for bad flags."""
import json
import math
import sys

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder import cli
from tinydecoder.core import reference
from tinydecoder.lessons import quality as q
from tinydecoder.lessons import quality_variants as qv

ROPE = td.Config(vocab_size=37, d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, n_layers=2, d_ff=64,
                 max_context=128, position="rope", name="quality-toy")


@pytest.fixture(scope="module")
def toy():
    return td.random_model(ROPE, seed=5, dtype=np.float64, scale=0.5)


@pytest.fixture(scope="module")
def text():
    return np.random.default_rng(1).integers(0, ROPE.vocab_size, size=61)


def direct_log_softmax(logits):
    z = np.asarray(logits, np.float64)
    return z - z.max(axis=-1, keepdims=True) - np.log(np.exp(z - z.max(axis=-1, keepdims=True)).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("n,context,stride", [(10, 4, 2), (11, 4, 3), (5, 8, 4), (100, 7, 3), (9655, 512, 256)])
def test_windows_score_every_token_once_with_enough_context(n, context, stride):
    plan = q.windows(n, context, stride)
    assert [t for w in plan for t in range(w.first_target, w.end)] == list(range(1, n))
    for w in plan:
        assert w.end - w.start == min(context, n)  # the last window is not shorter
        assert w.start == 0 or w.first_target - w.start >= context - stride


def test_one_window_gives_the_full_sequence_perplexity(toy, text):
    logits = reference.forward(toy, text)  # [N, V], the whole text at once
    nll = -direct_log_softmax(logits[:-1])[np.arange(len(text) - 1), text[1:]]
    result = q.score(lambda ids: td.fast.forward(toy, ids), text, context=len(text), stride=1)
    assert len(result.windows) == 1 and result.kl is None and result.mean_kl == 0.0
    assert result.perplexity == pytest.approx(math.exp(nll.mean()), rel=1e-10)


@pytest.mark.parametrize("context,stride", [(16, 8), (13, 5), (20, 19)])
def test_windowed_nll_equals_each_token_scored_on_its_own_context(toy, text, context, stride):
    """Token t is scored once, by the first window that ends after it, seeing that window's
    tokens before it: recomputed here token by token with the reference forward."""
    n = len(text)
    result = q.score(lambda ids: td.fast.forward(toy, ids), text, context, stride)
    expected = []
    for t in range(1, n):
        k = next(k for k in range(n) if min(k * stride + context, n) > t)
        start = max(0, min(k * stride + context, n) - context)
        expected.append(-direct_log_softmax(reference.forward(toy, text[start:t])[-1])[text[t]])
    np.testing.assert_allclose(result.nll, expected, rtol=1e-9)
    full = reference.forward(toy, text)
    whole = -direct_log_softmax(full[:-1])[np.arange(n - 1), text[1:]]
    assert not np.allclose(result.nll, whole)  # the windows' contexts really differ from the whole text's


def test_kl_is_zero_for_the_reference_and_positive_for_a_variant(toy, text):
    run = lambda ids: td.fast.forward(toy, ids)
    assert q.score(run, text, 16, 8).mean_kl == 0.0
    same = q.score(run, text, 16, 8, reference=run)
    assert same.mean_kl == pytest.approx(0.0, abs=1e-12)
    bad = qv.requantized_model(td.random_model(ROPE, seed=5, dtype=np.float32, scale=0.5), "int4-nogroup")
    result = q.score(lambda ids: td.fast.forward(bad, ids).astype(np.float64), text, 16, 8, reference=run)
    assert result.mean_kl > 1e-4 and (result.kl >= -1e-12).all()
    # the KL of the first window's rows, directly: sum p (log p - log q)
    logp = direct_log_softmax(run(text[:16])[:15])
    logq = direct_log_softmax(td.fast.forward(bad, text[:16])[:15])
    np.testing.assert_allclose(result.kl[:15], (np.exp(logp) * (logp - logq)).sum(axis=1), rtol=1e-9)
    np.testing.assert_allclose(result.reference_nll, q.score(run, text, 16, 8).nll)


def test_requantized_weights_keep_shape_order_and_their_error_bounds():
    model = td.random_model(ROPE, seed=2, dtype=np.float32)
    w = np.asfortranarray(model.layers[0].w_gate_up)  # [in, out], the loader's out-major order
    model.layers[0].w_gate_up = w
    q8, int4 = qv.requantized_model(model, "q8_0"), qv.requantized_model(model, "int4-nogroup")
    for m in (q8, int4):
        assert m.layers[0].w_gate_up.shape == w.shape and m.layers[0].w_gate_up.flags.f_contiguous
        assert m.embed.shape == model.embed.shape
    # Q8_0: d = max|block| / 127, codes round(x / d), d then stored as float16: a code of up to 127
    # times d's rounding (<= d * 2^-11) adds up to 0.062 d to round-to-nearest's d / 2
    blocks = w.T.reshape(w.shape[1], -1, 32)
    bound = np.repeat(np.abs(blocks).max(axis=2) / 127 * (0.5 + 127 * 2 ** -11), 32, axis=1).T.reshape(w.shape)
    err8 = np.abs(q8.layers[0].w_gate_up - w)
    assert (err8 <= bound + 1e-7).all()
    rows = w.T  # int4 without groups: one (max - min) / 15 step per whole row
    step = ((rows.max(axis=1) - rows.min(axis=1)) / 15)[None, :]
    err4 = np.abs(int4.layers[0].w_gate_up - w)
    assert (err4 <= step / 2 * 1.01 + 1e-6).all() and err4.mean() > 5 * err8.mean()
    assert qv.weights_model(model, "f32") is model and qv.weights_model(model, "q4_1", q8) is q8
    with pytest.raises(ValueError, match="reads the model file's own Q4_1 blocks"):
        qv.weights_model(model, "q4_1")


WIDE = td.Config(vocab_size=37, d_model=64, n_heads=2, n_kv_heads=1, head_dim=32, n_layers=3, d_ff=64,
                 max_context=128, position="rope", name="quality-wide")  # head dim 32: the KV cache's groups


@pytest.mark.parametrize("variant", [qv.Variant(weights="q8_0"), qv.Variant(weights="int4-nogroup"),
                                     qv.Variant(kv="int8"), qv.Variant(kv="int4"), qv.Variant(sinks=2, window=6),
                                     qv.Variant(sinks=2, window=6, piece=3), qv.Variant(experts=8),
                                     qv.Variant(early_exit=2), qv.Variant(weights="q8_0", kv="int4", early_exit=2),
                                     qv.Variant(weights="q8_0", piece=3), qv.Variant(experts=8, piece=5)],
                         ids=str)
def test_every_variant_runs_in_windows_and_moves_away_from_the_reference(variant, text):
    model = td.random_model(WIDE, seed=4, dtype=np.float32, scale=0.5)
    run = qv.build_runner(model, variant, calibration=[list(text[:40]), list(text[20:])])
    result = q.score(run, text, 16, 8, reference=qv.reference_runner(model))
    assert not variant.is_reference and len(result.nll) == len(text) - 1
    assert result.mean_kl > 1e-7 and np.isfinite(result.perplexity)


def test_pieces_feed_each_window_through_its_cache_as_decoding_does(text):
    """--piece P: the float32 model fed P tokens per forward gives its prefill's logits up to float32
    rounding (not the reference itself: its KL is measured), and a piece of 1 runs decode steps."""
    model = td.random_model(WIDE, seed=4, dtype=np.float32)
    window = list(text[:24])
    prefill = qv.build_runner(model, qv.Variant())(window)
    for piece in (1, 5, 24):
        assert not qv.Variant(piece=piece).is_reference
        got = qv.build_runner(model, qv.Variant(piece=piece))(window)
        assert got.shape == prefill.shape and np.abs(got - prefill).max() < 1e-4 * np.abs(prefill).max()


def test_q4_1_runs_the_quantised_model_it_is_given_and_is_compared_with_f32(text):
    """weights "q4_1" scores the model on its file's blocks (here a stand-in: the model re-quantised
    to Q8_0), never the float32 model itself: it is not the reference, and its KL is measured."""
    model = td.random_model(WIDE, seed=4, dtype=np.float32)
    blocks = qv.requantized_model(model, "q8_0")
    variant = qv.Variant(weights="q4_1")
    assert not variant.is_reference and qv.Variant().is_reference
    result = q.score(qv.build_runner(model, variant, quantized=blocks), text, 16, 8, reference=qv.reference_runner(model))
    assert result.mean_kl > 0


@pytest.mark.parametrize("variant,message", [
    (dict(weights="q2"), "--weights must be one of f32, q4_1, q8_0, int4-nogroup"),
    (dict(kv="int2"), "--kv must be one of int8, int4"),
    (dict(sinks=4), "--sinks N needs --window W"),
    (dict(sinks=4, window=0), "--window must be an integer >= 1"),
    (dict(experts=0), "--experts must be in 1..16"),
    (dict(experts=17), "--experts must be in 1..16"),
    (dict(early_exit=0), "--early-exit must be in 1..30"),
    (dict(early_exit=31), "--early-exit must be in 1..30"),
    (dict(kv="int8", window=8), "--kv and --sinks/--window"),
    (dict(experts=4, sinks=4, window=8), "cannot be combined"),
    (dict(piece=0), "must be an integer >= 1, got 0"),
    (dict(sinks=2, window=4, piece=5), "--piece must be in 1..window"),
])
def test_a_bad_variant_names_what_is_allowed(variant, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("-", r"\-")):
        qv.Variant(**variant).check(30)


@pytest.mark.parametrize("argv,message", [
    (["--context", "1"], "--context (tokens per window) must be >= 2"),
    (["--stride", "512"], "--stride must be in 1..511"),
    (["--tokens", "1"], "--tokens must be in 2.."),
    (["--tokens", "100000"], "--tokens must be in 2.."),
    (["--sinks", "4"], "--sinks N needs --window W"),
    (["--experts", "17"], "--experts must be in 1..16"),
    (["--early-exit", "31"], "--early-exit must be in 1..30"),
    (["--piece", "0"], "--piece (tokens per forward) must be an integer >= 1"),
])
def test_the_command_line_reports_bad_flags_before_loading_anything(argv, message, capsys):
    assert cli.main(["eval", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_wrong_choice_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        cli.main(["eval", "--weights", "q3"])
    assert "choose from 'f32', 'q4_1', 'q8_0', 'int4-nogroup'" in capsys.readouterr().err


def test_the_shipped_text_records_where_it_came_from():
    sources = q.text_sources()
    assert sources["python"].count(".") == 2 and "pydoc_data.topics" in sources["source"]
    for name, info in sources["files"].items():
        text = q.shipped_text(name)
        assert len(text) == info["characters"]
        assert [t for t, _, _ in info["spans"]] == info["topics"]
    assert q.topic_text("assignment").startswith("Assignment statements\n")
    assert not set(sources["files"][q.EVAL_TEXT]["topics"]) & set(sources["files"][q.CALIBRATION_TEXT]["topics"])
    with pytest.raises(ValueError, match="no shipped topic 'lambda'"):
        q.topic_text("lambda")


def test_the_shipped_topics_match_this_python_when_it_is_the_recorded_one():
    import platform
    import pydoc_data.topics

    if platform.python_version() != q.text_sources()["python"]:
        pytest.skip(f"pydoc_data of Python {platform.python_version()}, text from {q.text_sources()['python']}")
    for info in q.text_sources()["files"].values():
        for topic in info["topics"]:
            assert q.topic_text(topic) == pydoc_data.topics.topics[topic]


@pytest.mark.smollm2
def test_the_shipped_text_has_enough_smollm2_tokens():
    from tinydecoder.checkpoint.smollm2 import smollm2_tokenizer

    n = len(smollm2_tokenizer().encode(q.shipped_text()))
    assert n >= 8000 and n == q.text_sources()["files"][q.EVAL_TEXT]["smollm2_tokens"]


@pytest.mark.smollm2
def test_eval_json_on_smollm2(smollm2, capsys):
    argv = ["eval", "--tokens", "100", "--context", "64", "--stride", "48", "--json"]
    assert cli.main(argv) == 0
    ref = json.loads(capsys.readouterr().out)  # one object
    assert {"perplexity", "tokens", "kl_to_reference", "variant", "windows", "reference_perplexity",
            "scored_tokens", "context", "stride", "text", "seconds", "setup_seconds"} <= set(ref)
    assert ref["tokens"] == 100 and ref["scored_tokens"] == 99 and ref["windows"] == 2
    assert ref["variant"] == {"weights": "f32", "kv": None, "sinks": None, "window": None, "experts": None,
                              "early_exit": None, "piece": None}
    assert ref["kl_to_reference"] == 0.0 and ref["perplexity"] == ref["reference_perplexity"]
    assert 2 < ref["perplexity"] < 100 and ref["variant"]["weights"] == "f32"
    assert cli.main(argv + ["--kv", "int4"]) == 0
    kv = json.loads(capsys.readouterr().out)
    assert kv["variant"]["kv"] == "int4" and 0 < kv["kl_to_reference"] < 0.5
    assert kv["reference_perplexity"] == pytest.approx(ref["perplexity"], rel=1e-9)
    assert cli.main(argv + ["--weights", "q4_1"]) == 0  # the file's blocks: the same weights, other sums
    q4 = json.loads(capsys.readouterr().out)
    assert q4["variant"]["weights"] == "q4_1" and 0 <= q4["kl_to_reference"] < 1e-6
    assert q4["perplexity"] == pytest.approx(ref["perplexity"], rel=1e-3)  # within 0.1 %
    assert cli.main(argv + ["--weights", "q4_1", "--piece", "1"]) == 0  # as decode steps run: its decode kernels
    q4_decode = json.loads(capsys.readouterr().out)
    assert q4_decode["variant"]["piece"] == 1 and 0 < q4_decode["kl_to_reference"] < 1e-6
    assert q4_decode["perplexity"] == pytest.approx(ref["perplexity"], rel=1e-3)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
