"""Speculative decoding (issue 13): greedy output identical to `generate`, the sampling rule's
output distributed as the target's, acceptance and tokens per step as the theory says, the KV
caches rolled back after every pass, the drafts, the errors, and the CLI on SmolLM2."""
import contextlib
import io
import json

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.cli import main as cli_main
from tinydecoder.decoding import speculative
from tinydecoder.decoding.drafts import ModelDraft, PromptLookupDraft, early_exit_model, lookup, make_draft
from tinydecoder.decoding.sampling import make_sampler
from tinydecoder.decoding.speculative import (
    accept_or_resample,
    acceptance_rate,
    expected_tokens_per_step,
    speculative_generate,
)
from tinydecoder.lessons.speculative_lab import simulate_tokens_per_step

needs_model = pytest.mark.smollm2  # skipped without the wheel (tests/conftest.py)

# Chi-square critical values at significance 0.001 (a correct rule fails 1 run in 1000; the
# seeds are fixed, so a run either always passes or always fails).
CHI2_0001 = {5: 20.515, 24: 51.179}


def chi_square(counts, probs) -> float:
    expected = len(counts) and counts.sum() * probs
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 came out"
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


@pytest.fixture(scope="module")
def rope_model():
    cfg = td.Config(vocab_size=11, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, n_layers=3, d_ff=32,
                    max_context=128, position="rope", tied_embeddings=True)
    return td.random_model(cfg, seed=1, dtype=np.float64, scale=0.5)


class OracleDraft:
    """Proposes a fixed continuation (right tokens, then `wrong_after` wrong ones), k or more."""

    def __init__(self, vocab_size, continuation, prompt_length, wrong_after=None, extra=0):
        self.vocab_size, self.continuation, self.prompt_length = vocab_size, continuation, prompt_length
        self.wrong_after, self.extra = wrong_after, extra

    def propose(self, tokens, k, policy):
        done = len(tokens) - self.prompt_length
        ids = list(self.continuation[done:done + k + self.extra])  # extra: more than asked for
        ids += [0] * (k + self.extra - len(ids))
        if self.wrong_after is not None:
            ids = [t if i < self.wrong_after else (t + 1) % self.vocab_size for i, t in enumerate(ids)]
        return ids, None


# ---------------------------------------------------------------- greedy: exactly generate's tokens
@pytest.mark.parametrize("draft", ["prompt-lookup", "early-exit:1", "early-exit:2"])
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("prompt", [[1, 2, 3, 1, 2], [5, 5, 5], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2], [4]])
def test_greedy_is_generate_token_for_token(rope_model, draft, k, prompt):
    plain = td.generate(rope_model, prompt, 30)
    lengths = []
    spec = speculative_generate(rope_model, prompt, 30, draft, draft_tokens=k,
                                on_step=lambda r: lengths.append((len(r.cache), len(r.tokens))))
    assert spec.tokens == plain.tokens
    assert all(c == t - 1 for c, t in lengths) and len(lengths) == len(spec.steps)
    assert spec.target_forward_calls == 1 + len(spec.steps) <= 30
    assert spec.draft_tokens_proposed == sum(len(s.proposed) for s in spec.steps)
    assert all(len(s.proposed) <= k for s in spec.steps)
    assert len(spec.new_tokens) == 1 + spec.draft_tokens_accepted + len(spec.steps)


def test_greedy_on_the_seed_toy_and_a_float32_model():
    toy = td.toy_model()
    assert speculative_generate(toy, td.SEED_PROMPT, 4, "prompt-lookup").new_tokens == td.SEED_CONTINUATION
    assert speculative_generate(toy, td.SEED_PROMPT, 12, "early-exit:1", draft_tokens=3).tokens == \
        td.generate(toy, td.SEED_PROMPT, 12).tokens
    cfg = td.Config(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=1, head_dim=8, n_layers=4, d_ff=64,
                    max_context=256, position="rope", tied_embeddings=True)
    m32 = td.random_model(cfg, seed=3, scale=0.4)
    prompt = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]
    for draft in ("prompt-lookup", "early-exit:2", "early-exit:3"):
        assert speculative_generate(m32, prompt, 40, draft, draft_tokens=5).tokens == td.generate(m32, prompt, 40).tokens


def test_repetitive_context_is_accepted_and_saves_passes(rope_model):
    spec = speculative_generate(rope_model, [5, 5, 5], 30, "prompt-lookup", draft_tokens=4)
    assert spec.new_tokens == [spec.new_tokens[0]] * 30  # this model repeats one token ...
    assert spec.acceptance_rate == 1.0 and spec.target_forward_calls < 10  # ... and the draft guesses it
    assert spec.tokens_per_step > 3


def test_oracle_draft_all_accepted_and_wrong_guesses_rolled_back(rope_model):
    prompt = [1, 2, 3, 1, 2]
    plain = td.generate(rope_model, prompt, 25)
    right = speculative_generate(rope_model, prompt, 25, OracleDraft(11, plain.new_tokens, 5), draft_tokens=4)
    assert right.tokens == plain.tokens and right.acceptance_rate == 1.0
    assert right.accepted_per_step == [4, 4, 4, 4, 3]  # 1 (prefill) + 4 passes x 5 + 1 pass x (3 + 1) = 25
    for wrong_after in (0, 2):
        cache_ok = []
        spec = speculative_generate(rope_model, prompt, 25, OracleDraft(11, plain.new_tokens, 5, wrong_after),
                                    draft_tokens=4, on_step=lambda r: cache_ok.append(len(r.cache) == len(r.tokens) - 1),
                                    adaptive=False)
        assert spec.tokens == plain.tokens and all(cache_ok)
        assert set(spec.accepted_per_step[:-1]) == {wrong_after}
        assert len(spec.steps[0].proposed) == len(spec.steps[5].proposed) == 4 and spec.paused_steps == 0  # fixed k


def test_draft_length_follows_the_passes():
    """All kept: +2 (up to k); a miss: -1 (down to 1); two all-rejected passes in a row: pause
    4 passes, then 8, ...; a kept guess resets the pause."""
    length = speculative.DraftLength(4)
    seen = []
    for proposed, accepted in [(4, 4), (4, 1), (3, 0), (2, 0)]:
        seen.append(length.next())
        assert seen[-1] == proposed
        length.update(proposed, accepted)
    assert [length.next() for _ in range(5)] == [0, 0, 0, 0, 1]  # paused 4 passes after two misses in a row
    length.update(1, 0)
    length.update(1, 0)
    assert [length.next() for _ in range(9)] == [0] * 8 + [1]  # the second pause is twice as long
    length.update(1, 1)  # kept: +2, and the next pause is short again
    assert length.next() == 3
    length.update(0, 0)  # a pass without guesses changes nothing
    assert length.next() == 3


def test_adaptive_drafting_stops_guessing_when_guesses_keep_failing(rope_model):
    prompt = [1, 2, 3, 1, 2]
    plain = td.generate(rope_model, prompt, 40)
    wrong = OracleDraft(11, plain.new_tokens, 5, 0)  # always proposes, never right
    fixed = speculative_generate(rope_model, prompt, 40, wrong, draft_tokens=4, adaptive=False)
    adaptive = speculative_generate(rope_model, prompt, 40, wrong, draft_tokens=4)
    assert adaptive.tokens == fixed.tokens == plain.tokens
    assert fixed.draft_tokens_proposed >= 4 * (len(fixed.steps) - 4) and fixed.paused_steps == 0
    assert adaptive.paused_steps > len(adaptive.steps) / 2  # most passes guess nothing
    assert adaptive.draft_tokens_proposed < fixed.draft_tokens_proposed / 8
    right = speculative_generate(rope_model, prompt, 25, OracleDraft(11, plain.new_tokens, 5), draft_tokens=4)
    assert right.accepted_per_step == [4, 4, 4, 4, 3] and right.paused_steps == 0  # a right draft keeps its k


def test_stop_token_inside_an_accepted_draft(rope_model):
    prompt = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2]
    plain = td.generate(rope_model, prompt, 30).new_tokens
    # a token first seen at position 6 of the output: inside the 2nd pass's guesses (k = 4)
    stop = next(t for i, t in enumerate(plain) if t not in plain[:i] and i >= 6)
    expected = td.generate(rope_model, prompt, 30, stop_tokens=(stop,))
    spec = speculative_generate(rope_model, prompt, 30, OracleDraft(11, plain, len(prompt)), draft_tokens=4,
                                stop_tokens=(stop,))
    assert spec.tokens == expected.tokens and spec.new_tokens[-1] == stop
    last = spec.steps[-1]
    assert stop in last.proposed[:last.accepted]  # it came from the draft, not from the target
    assert len(spec.cache) == len(spec.tokens) - 1
    for draft in ("prompt-lookup", "early-exit:2"):
        assert speculative_generate(rope_model, prompt, 30, draft, draft_tokens=6, stop_tokens=(stop,)).tokens == expected.tokens


@pytest.mark.parametrize("max_new", [1, 2, 5, 7])
def test_draft_running_past_max_new_tokens(rope_model, max_new):
    prompt = [1, 2, 3, 1, 2]
    plain = td.generate(rope_model, prompt, max_new)
    oracle = OracleDraft(11, td.generate(rope_model, prompt, 40).new_tokens, 5, extra=3)  # even k + 3 ids
    spec = speculative_generate(rope_model, prompt, max_new, oracle, draft_tokens=8)
    assert spec.tokens == plain.tokens and len(spec.new_tokens) == max_new
    assert all(len(s.proposed) <= max_new - 1 for s in spec.steps)  # guesses capped to what is left
    assert len(spec.cache) == len(spec.tokens) - 1


def test_early_exit_draft_cache_follows_the_accepted_tokens(rope_model):
    draft = make_draft(rope_model, "early-exit:2")
    checks = []

    def on_step(result):
        n = len(draft.cached_tokens)
        step = result.steps[-1]
        before = result.tokens[:len(result.tokens) - len(step.tokens)]  # the context the draft guessed after
        checks.append(len(draft.cache) == n and draft.cached_tokens == (before + step.proposed)[:n])

    spec = speculative_generate(rope_model, [1, 2, 3, 1, 2], 30, draft, draft_tokens=3, on_step=on_step)
    assert spec.tokens == td.generate(rope_model, [1, 2, 3, 1, 2], 30).tokens
    assert checks and all(checks)
    assert draft.forward_calls == spec.draft_tokens_proposed  # one draft decode step per guess


def test_early_exit_model_shares_the_weights(rope_model):
    small = early_exit_model(rope_model, 2)
    assert small.config.n_layers == 2 and small.config.vocab_size == rope_model.config.vocab_size
    assert small.embed is rope_model.embed and small.final_norm is rope_model.final_norm
    assert np.shares_memory(small.lm_head, rope_model.embed)  # the tied head: a view
    for a, b in zip(small.layers, rope_model.layers[:2]):
        assert a is b or (a.w_qkv is b.w_qkv and a.w_gate_up is b.w_gate_up and a.w_down is b.w_down)
    h = td.layer_input(rope_model, [1, 2, 3], 2)  # the same first two blocks
    x = td.rmsnorm(h, rope_model.final_norm, rope_model.config.norm_eps) @ rope_model.lm_head
    assert np.allclose(td.forward(small, [1, 2, 3]), x)


def test_prompt_lookup_finds_the_latest_longest_match():
    assert lookup([1, 2, 3, 9, 1, 2, 4, 8, 1, 2], 3) == [4, 8, 1]  # the latest "1 2" (not the first)
    assert lookup([7, 1, 2, 3, 5, 2, 3], 2, max_ngram=3) == [5, 2]  # "2 3" matched, "1 2 3" not needed
    assert lookup([7, 1, 2, 3, 5, 6, 1, 2, 3], 4, max_ngram=3) == [5, 6, 1, 2]  # the 3-gram beats shorter ones
    assert lookup([1, 2, 3, 4], 3) == [] and lookup([5], 3) == []  # nothing matches: a plain step
    assert lookup([1, 2, 3, 4, 3], 5, min_ngram=2) == []
    assert lookup([6, 6, 6], 2) == [6]  # overlapping match; only what followed it


def test_prompt_lookup_guesses_at_most_per_matched_token_per_token_of_its_match():
    """A match of n tokens earns at most per_matched_token * n guesses (and k at most); the
    occurrence is the latest one followed by that many."""
    ctx = [1, 5, 6, 7, 8, 9, 2, 3, 1]
    assert lookup(ctx, 4) == [5, 6, 7, 8]  # no cap
    assert lookup(ctx, 4, per_matched_token=2) == [5, 6]  # "1": one token matched, two guesses
    assert lookup(ctx, 4, per_matched_token=1) == [5]
    assert lookup([2, 3, 5, 6, 7, 8, 9, 2, 3], 4, per_matched_token=2) == [5, 6, 7, 8]  # "2 3": four
    assert lookup([2, 3, 5, 6, 7, 8, 9, 2, 3], 3, per_matched_token=2) == [5, 6, 7]  # k still bounds it
    assert lookup([1, 4, 1, 5, 6, 7, 1], 3) == [5, 6, 7] and lookup([1, 4, 1, 5, 6, 7, 1], 3, per_matched_token=1) == [5]
    assert lookup([1, 4, 1, 5, 1], 3, per_matched_token=1) == [5]  # the latest "1" followed by one token
    draft = PromptLookupDraft(11)
    assert draft.per_matched_token == 2 and draft.propose(ctx, 4) == ([5, 6], None)
    assert PromptLookupDraft(11, per_matched_token=4).propose(ctx, 4) == ([5, 6, 7, 8], None)


# ---------------------------------------------------------------- the sampling rule
P = np.array([0.05, 0.30, 0.15, 0.25, 0.05, 0.20])
Q = np.array([0.30, 0.10, 0.15, 0.05, 0.35, 0.05])


@pytest.mark.parametrize("q", [Q, np.eye(6)[1], np.eye(6)[4], P])
def test_rule_output_is_distributed_as_p(q):
    rng = np.random.default_rng(2024)
    n = 200_000
    x = rng.choice(6, size=n, p=q)  # the draft's guesses
    tokens, accepted = accept_or_resample(P, q, x, rng.random(n), rng.random(n))
    counts = np.bincount(tokens, minlength=6)
    assert chi_square(counts, P) < CHI2_0001[5]
    alpha = acceptance_rate(P, q)  # 1 - TV(p, q)
    assert alpha == pytest.approx(1 - 0.5 * np.abs(P - q).sum())
    assert abs(accepted.mean() - alpha) < 5 * np.sqrt(alpha * (1 - alpha) / n) + 1e-12  # 5 standard errors


def test_rule_per_row_distributions_and_a_wrong_rule_is_caught():
    rng = np.random.default_rng(5)
    n = 100_000
    p_rows = rng.dirichlet(np.ones(6), size=2)
    q_rows = rng.dirichlet(np.ones(6), size=2)
    which = rng.integers(0, 2, size=n)
    x = np.minimum((rng.random(n)[:, None] > np.cumsum(q_rows[which], axis=1)).sum(axis=1), 5)  # x ~ q_rows[which]
    tokens, _ = accept_or_resample(p_rows[which], q_rows[which], x, rng.random(n), rng.random(n))
    for w in (0, 1):
        assert chi_square(np.bincount(tokens[which == w], minlength=6), p_rows[w]) < CHI2_0001[5]
    # the test has power: resampling from p (instead of the residual) is biased towards q's tokens
    rng = np.random.default_rng(2024)
    x = rng.choice(6, size=n, p=Q)
    accepted = rng.random(n) * Q[x] < P[x]
    wrong = np.where(accepted, x, rng.choice(6, size=n, p=P))
    assert chi_square(np.bincount(wrong, minlength=6), P) > 10 * CHI2_0001[5]


@pytest.mark.parametrize("k", [1, 4, 8])
def test_tokens_per_step_formula(k):
    # i.i.d. guesses through the real rule: tokens per pass = 1 + leading accepted guesses
    rng = np.random.default_rng(k)
    n = 40_000
    x = rng.choice(6, size=(n, k), p=Q)
    _, accepted = accept_or_resample(P, Q, x.ravel(), rng.random(n * k), rng.random(n * k))
    per_step = 1 + np.cumprod(accepted.reshape(n, k), axis=1).sum(axis=1)
    alpha = acceptance_rate(P, Q)  # 0.6
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert expected_tokens_per_step(alpha, k) == pytest.approx(expected)
    assert abs(per_step.mean() - expected) < 5 * per_step.std() / np.sqrt(n)
    simulated = simulate_tokens_per_step(alpha, k, n, rng=7)
    assert simulated.min() >= 1 and simulated.max() <= k + 1
    assert abs(simulated.mean() - expected) < 5 * simulated.std() / np.sqrt(n)
    assert expected_tokens_per_step(1.0, k) == k + 1 and expected_tokens_per_step(0.0, k) == 1


def test_sampled_generation_is_distributed_as_the_target():
    """Two sampled tokens, 3000 runs: the pairs' frequencies against the target's exact
    probabilities p(t1) p(t2 | t1), through the whole loop (draft, one-pass verify, rollback)."""
    cfg = td.Config(vocab_size=5, d_model=8, n_heads=2, n_kv_heads=1, head_dim=4, n_layers=2, d_ff=16,
                    max_context=32, position="rope", tied_embeddings=True)
    model = td.random_model(cfg, seed=4, dtype=np.float64, scale=1.0)
    prompt, T = [1, 2, 1], 1.5
    dist = lambda ids: td.softmax(td.forward(model, ids)[-1] / T)
    p1 = dist(prompt)
    joint = np.concatenate([p1[a] * dist(prompt + [a]) for a in range(5)])  # [25]
    for draft in ("early-exit:1", "prompt-lookup"):
        sampler = make_sampler(temperature=T, seed=11)
        pairs = [speculative_generate(model, prompt, 2, draft, draft_tokens=1, sampler=sampler).new_tokens
                 for _ in range(3000)]
        counts = np.bincount([5 * a + b for a, b in pairs], minlength=25)
        assert chi_square(counts, joint) < CHI2_0001[24]


def test_sampling_is_repeatable_with_a_seed(rope_model):
    runs = [speculative_generate(rope_model, [1, 2, 3], 20, "early-exit:2", temperature=0.9, seed=s).tokens
            for s in (3, 3, 4)]
    assert runs[0] == runs[1] != runs[2]


# ---------------------------------------------------------------- bad input
def test_errors(rope_model):
    cases = [
        (dict(draft_tokens=0), ValueError, "draft_tokens .* >= 1, got 0"),
        (dict(draft_tokens=True), ValueError, "draft_tokens"),
        (dict(draft="early-exit:0"), ValueError, r"L must be an integer in 1\.\.2"),
        (dict(draft="early-exit:3"), ValueError, r"1\.\.2 \(this model has n_layers=3"),
        (dict(draft="early-exit:x"), ValueError, "needs a layer count"),
        (dict(draft="medusa"), ValueError, "unknown draft 'medusa'"),
        (dict(draft=42), TypeError, "draft must be"),
        (dict(draft=PromptLookupDraft(12)), ValueError, "vocabulary of 12 tokens but the target has 11"),
        (dict(sampler=lambda logits: 0), TypeError, "needs the distribution"),
        (dict(sampler=make_sampler(temperature=1.0), seed=1), ValueError, "not both"),
        (dict(temperature=-1), ValueError, "temperature"),
    ]
    for kwargs, exc, message in cases:
        args = dict(draft="prompt-lookup") | kwargs
        with pytest.raises(exc, match=message):
            speculative_generate(rope_model, [1, 2], 5, **args)
    other = td.random_model(td.Config(vocab_size=7, d_model=8, n_heads=2, n_kv_heads=1, head_dim=4, n_layers=1,
                                      d_ff=8, max_context=32), seed=0, dtype=np.float64)
    with pytest.raises(ValueError, match="vocabulary of 7 tokens but the target has 11"):
        speculative_generate(rope_model, [1, 2], 5, other)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        speculative_generate(rope_model, [1, 2], 0)
    with pytest.raises(ValueError, match="context too long"):
        speculative_generate(rope_model, [1] * 100, 40)
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDraft(11, max_ngram=2, min_ngram=3)
    for bad_value in (0, True, 1.5):
        with pytest.raises(ValueError, match="per_matched_token must be an integer >= 1"):
            PromptLookupDraft(11, per_matched_token=bad_value)
    bad = OracleDraft(11, [99] * 10, 2)
    with pytest.raises(ValueError, match="token id 99"):
        speculative_generate(rope_model, [1, 2], 5, bad)
    assert isinstance(make_draft(rope_model, other), ModelDraft)


# ---------------------------------------------------------------- SmolLM2
@pytest.fixture(scope="module")
def smollm2():
    from tinydecoder.checkpoint.smollm2 import load_smollm2, smollm2_tokenizer

    with contextlib.redirect_stderr(io.StringIO()):
        return load_smollm2(), smollm2_tokenizer()


CODE = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n"


@needs_model
def test_smollm2_greedy_identical(smollm2):
    model, tok = smollm2
    from tinydecoder.checkpoint.smollm2 import IM_END_ID

    repeat = tok.encode_chat([{"role": "user", "content": "Repeat this code exactly:\n" + CODE}])
    free = tok.encode("The capital of France is")
    runs = {}
    for ids, n, drafts in ((repeat, 24, [("prompt-lookup", 3), ("prompt-lookup", 6), ("early-exit:12", 2)]),
                           (free, 12, [("prompt-lookup", 4), ("early-exit:20", 3)])):
        plain = td.generate(model, ids, n, stop_tokens=(IM_END_ID,))
        for draft, k in drafts:
            spec = runs[n, draft, k] = speculative_generate(model, ids, n, draft, draft_tokens=k, stop_tokens=(IM_END_ID,))
            assert spec.tokens == plain.tokens, (draft, k)
            assert len(spec.cache) == len(spec.tokens) - 1
    spec = runs[24, "prompt-lookup", 6]  # the code to repeat, drafted 6 tokens at a time
    assert spec.draft_tokens_accepted >= 8 and spec.target_forward_calls <= 16  # the copy is guessed


@needs_model
def test_smollm2_cli_speculative_same_token_ids(smollm2, capsys):
    common = ["generate", "--model", "smollm2", "--prompt", "Repeat: one two three, one two three,",
              "--max-new-tokens", "12", "--json"]
    assert cli_main(common) == 0
    plain = json.loads(capsys.readouterr().out)
    assert cli_main(common + ["--speculative", "prompt-lookup", "--draft-tokens", "4"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["token_ids"] == plain["token_ids"] and spec["text"] == plain["text"]
    assert spec["draft_tokens_proposed"] >= spec["draft_tokens_accepted"] > 0
    assert 1 <= spec["target_forward_calls"] < 12
    assert "draft_tokens_proposed" not in plain


def test_cli_toy_and_errors(capsys):
    assert cli_main(["generate", "--model", "toy", "--prompt", "0 1 2 3", "--max-new-tokens", "6",
                     "--speculative", "early-exit:1", "--draft-tokens", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == td.generate(td.toy_model(), td.SEED_PROMPT, 6).new_tokens
    assert out["target_forward_calls"] == 1 + len(out["accepted_per_step"])
    assert sum(out["accepted_per_step"]) == out["draft_tokens_accepted"] <= out["draft_tokens_proposed"]
    flags = ["--model", "toy", "--prompt", "0 1", "--max-new-tokens", "4", "--speculative", "early-exit:2"]
    assert cli_main(["generate", *flags]) == 2
    assert "1..1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["generate", "--model", "toy", "--prompt", "0 1", "--speculative", "prompt-lookup",
                  "--draft-tokens", "0"])
    assert cli_main(["generate", "--model", "toy", "--prompt", "0 1", "--draft-tokens", "3"]) == 2
    assert "--draft-tokens needs --speculative" in capsys.readouterr().err


# ---------------------------------------------------------------- what notebook 15 shows
def test_step_view_html_and_widget(rope_model):
    from tinydecoder.widgets import speculative as sv

    prompt = [1, 2, 3, 1, 2]
    plain = td.generate(rope_model, prompt, 12).new_tokens
    spec = speculative_generate(rope_model, prompt, 12, OracleDraft(11, plain, 5, wrong_after=2), draft_tokens=3)
    view = sv.step_view(spec, 1)
    assert view["context"] == prompt + plain[:1] and view["new_before"] == 1 and view["calls"] == 2
    assert view["accepted"] == 2 and len(view["rejected"]) == 1 and view["kind"] == "correction"
    assert view["target_token"] == plain[3]
    last = sv.step_view(spec, len(spec.steps))
    assert last["context"] + last["proposed"][:last["accepted"]] + [last["target_token"]] == spec.tokens
    html_text = sv.step_html(view, lambda t: f"<{t}>")
    assert html_text.count("line-through") == 1 and "&lt;" in html_text and "correction" in html_text
    for bad in (0, len(spec.steps) + 1, True):
        with pytest.raises(ValueError, match="step must be an integer in 1.."):
            sv.step_view(spec, bad)
    box = sv.speculative_widget(spec, str)
    box.controls["step"].value = 2
    assert box.data["step"] == 2 and box.controls["step"].max == len(spec.steps)
    lookup_run = speculative_generate(rope_model, [5, 5, 5], 12, "prompt-lookup")
    assert sv.step_view(lookup_run, 1)["kind"] == "plain"  # [5 5 5 x]: x never seen before, no guess
    fig = sv.steps_figure({"a": spec, "b": lookup_run}, k=3)
    assert len(fig.axes) == 2


def test_verify_pass_seconds_rolls_the_cache_back(rope_model):
    from tinydecoder.widgets import speculative as sv

    seconds = sv.verify_pass_seconds(rope_model, [1, 2, 3, 4], rows=(1, 2, 6), repeat=2)
    assert list(seconds) == [1, 2, 6] and all(s > 0 for s in seconds.values())


def test_early_exit_agreement(rope_model):
    from tinydecoder.lessons.speculative_lab import early_exit_agreement

    tokens = td.generate(rope_model, [1, 2, 3, 1, 2], 20).tokens
    agree = early_exit_agreement(rope_model, tokens, 5)
    assert list(agree) == [1, 2, 3] and agree[3] == 1.0  # all layers: the model itself
    # L layers: the greedy acceptance of the early-exit draft's first guess, with the true context
    small = early_exit_model(rope_model, 1)
    first = np.argmax(td.forward(small, tokens)[4:], axis=-1)
    full = np.argmax(td.forward(rope_model, tokens)[4:], axis=-1)
    assert agree[1] == pytest.approx(float(np.mean(first == full)))
    assert early_exit_agreement(rope_model, tokens, 5, layers=[2]).keys() == {2}
    with pytest.raises(ValueError, match="layers must lie in 1..3"):
        early_exit_agreement(rope_model, tokens, 5, layers=[4])
    with pytest.raises(ValueError, match="start must be in 1.."):
        early_exit_agreement(rope_model, tokens, 0)
