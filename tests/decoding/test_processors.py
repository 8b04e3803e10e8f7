"""Logits processors and stopping rules, each against a case computed by hand; top-p's boundary
token; bad values; and generate(..., processors=[...])."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.decoding import sampling
from tinydecoder.decoding.processors import (
    FrequencyPenalty,
    LogitBias,
    MaxLength,
    MinP,
    PresencePenalty,
    RepetitionPenalty,
    StopSequences,
    apply_processors,
    check_processors,
    should_stop,
)

LOGITS = np.array([2.0, -1.0, 0.5, -3.0, 1.0])


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    out = RepetitionPenalty(2.0)([0, 1, 1, 3], LOGITS)
    # seen: 0 (2.0 -> 1.0), 1 (-1.0 -> -2.0, once however often), 3 (-3.0 -> -6.0); 2, 4 untouched
    assert out.tolist() == [1.0, -2.0, 0.5, -6.0, 1.0]
    assert LOGITS.tolist() == [2.0, -1.0, 0.5, -3.0, 1.0]  # input not modified
    assert RepetitionPenalty(1.0)([0, 1, 2], LOGITS).tolist() == LOGITS.tolist()
    assert RepetitionPenalty(0.5)([0], LOGITS)[0] == 4.0  # < 1 encourages repeats


def test_frequency_and_presence_penalties():
    tokens = [0, 1, 1, 3, 1]  # counts: 0 -> 1, 1 -> 3, 3 -> 1
    assert FrequencyPenalty(0.5)(tokens, LOGITS).tolist() == [1.5, -2.5, 0.5, -3.5, 1.0]
    assert PresencePenalty(0.5)(tokens, LOGITS).tolist() == [1.5, -1.5, 0.5, -3.5, 1.0]
    both = apply_processors([FrequencyPenalty(0.5), PresencePenalty(1.0)], tokens, LOGITS)
    assert both.tolist() == [0.5, -3.5, 0.5, -4.5, 1.0]


def test_min_p_keeps_tokens_near_the_best():
    logits = np.log([0.5, 0.3, 0.1, 0.06, 0.04])
    out = MinP(0.2)([], logits)  # threshold 0.2 * 0.5 = 0.1: keeps 0.5, 0.3, 0.1
    assert np.isfinite(out).tolist() == [True, True, True, False, False]
    assert np.allclose(out[:3], logits[:3])
    assert np.isfinite(MinP(0.0)([], logits)).all()
    assert np.isfinite(MinP(1.0)([], logits)).tolist() == [True, False, False, False, False]
    # min-p adapts like top-p but is relative to the best: a flat distribution keeps everything
    assert np.isfinite(MinP(0.5)([], np.zeros(7))).all()


def test_logit_bias_adds_and_bans():
    out = LogitBias({1: 3.0, 4: -np.inf})([], LOGITS)
    assert out.tolist() == [2.0, 2.0, 0.5, -3.0, -np.inf]
    assert sampling.greedy(LogitBias({2: 10})([], LOGITS)) == 2
    with pytest.raises(ValueError, match="names token 9, but the vocabulary has 5 ids"):
        LogitBias({9: 1.0})([], LOGITS)
    with pytest.raises(ValueError, match="banned every token"):
        LogitBias({i: -np.inf for i in range(5)})([], LOGITS)


def test_stop_sequence_across_token_boundaries():
    vocab = {0: "Hello", 1: ",", 2: " wor", 3: "ld", 4: "\n", 5: "\n\nThe", 6: "END"}
    decode = lambda ids: "".join(vocab[i] for i in ids)
    stop = StopSequences(["world", "\n\n"], decode)
    prompt = [2, 3, 4]  # the prompt's " world\n" is not generated text: it never stops generation
    assert not stop.is_done(prompt + [0], 3)
    assert not stop.is_done(prompt + [0, 1, 2], 3)  # "Hello, wor": not yet
    assert stop.is_done(prompt + [0, 1, 2, 3], 3)  # "Hello, world": spans " wor" + "ld"
    assert stop.is_done(prompt + [4, 4], 3)  # "\n" + "\n"
    assert stop.is_done(prompt + [1, 5], 3)  # ends inside the token "\n\nThe"
    assert stop.trim(",\n\nThe world") == ","
    assert stop.trim("Hello, world and\n\n") == "Hello, "
    assert stop([], LOGITS) is LOGITS
    assert should_stop([RepetitionPenalty(1.2), stop], prompt + [4, 4], 3)


def test_max_length_counts_prompt_and_new_tokens():
    rule = MaxLength(5)
    assert not rule.is_done([1, 2, 3, 4], 3) and rule.is_done([1, 2, 3, 4, 5], 3)


def test_top_p_keeps_the_boundary_token():
    logits = np.log([0.1, 0.2, 0.3, 0.4])
    # 0.4 alone < 0.6, so 0.3 (which crosses 0.6) is kept too; 0.2 and 0.1 are not
    assert set(sampling.kept_tokens(logits, top_p=0.6).tolist()) == {3, 2}
    assert np.allclose(sampling.sampling_distribution(logits, top_p=0.6), [0, 0, 3 / 7, 4 / 7])
    assert set(sampling.kept_tokens(logits, top_p=0.7).tolist()) == {3, 2}  # exactly 0.7 reached
    assert set(sampling.kept_tokens(logits, top_p=0.71).tolist()) == {3, 2, 1}


@pytest.mark.parametrize("make, match", [
    (lambda: RepetitionPenalty(0), "repetition penalty must be a finite number > 0"),
    (lambda: RepetitionPenalty(-1.5), "repetition penalty must be a finite number > 0"),
    (lambda: RepetitionPenalty(float("inf")), "repetition penalty must be a finite number > 0"),
    (lambda: MinP(1.5), r"min_p must be a number in \[0, 1\]"),
    (lambda: MinP(-0.1), r"min_p must be a number in \[0, 1\]"),
    (lambda: MinP("0.1"), r"min_p must be a number in \[0, 1\]"),
    (lambda: FrequencyPenalty(float("nan")), "frequency penalty must be a finite number"),
    (lambda: PresencePenalty(None), "presence penalty must be a finite number"),
    (lambda: LogitBias({}), "non-empty dict"),
    (lambda: LogitBias({-1: 1.0}), "keys must be token ids"),
    (lambda: LogitBias({1: float("inf")}), "finite number or -inf"),
    (lambda: StopSequences([""], str), "non-empty strings"),
    (lambda: MaxLength(0), "max_length must be an integer >= 1"),
])
def test_bad_values_get_clear_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_check_processors():
    assert check_processors(None) == [] and len(check_processors(MinP(0.1))) == 1
    with pytest.raises(TypeError, match="must be callable"):
        check_processors([0.5])
    with pytest.raises(TypeError, match="needs decode"):
        StopSequences("x", decode="not a function")


def test_generate_applies_processors_before_the_sampler():
    model = td.toy_model()
    plain = td.generate(model, td.SEED_PROMPT, 6)
    # ban the greedy first token: the first choice becomes the runner-up of the same logits
    first = plain.new_tokens[0]
    banned = td.generate(model, td.SEED_PROMPT, 6, processors=[LogitBias({first: -np.inf})])
    assert first not in banned.new_tokens
    assert banned.new_tokens[0] == int(sampling.rank_tokens(plain.events[0].logits)[1])
    # the processors see the whole context: a huge repetition penalty forbids every seen token
    fresh = td.generate(model, [0], 5, processors=[RepetitionPenalty(1e9), PresencePenalty(1e9)])
    assert len(set(fresh.tokens)) == len(fresh.tokens)
    # stopping rules end generation: MaxLength counts the prompt
    assert len(td.generate(model, td.SEED_PROMPT, 10, processors=[MaxLength(6)]).tokens) == 6
    decode = lambda ids: " ".join(map(str, ids))
    stopped = td.generate(model, td.SEED_PROMPT, 10, processors=[StopSequences("2 0", decode)])
    assert stopped.new_tokens == plain.new_tokens[:3] == [3, 2, 0]
    # the recorded logits stay the model's own
    assert np.array_equal(banned.events[0].logits, plain.events[0].logits)
