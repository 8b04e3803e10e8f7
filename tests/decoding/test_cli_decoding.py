"""`generate --beams N`, `--repetition-penalty`, `--min-p`, `--stop TEXT`: the CLI gives what the
library gives, on the toy model (ids as text) and once on SmolLM2."""
import json

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.cli import main as cli_main
from tinydecoder.decoding.sampling import make_sampler

needs_model = pytest.mark.smollm2  # skipped without the wheel (tests/conftest.py)
TOY = ["generate", "--model", "toy", "--prompt", "0 1 2 3", "--max-new-tokens", "8"]


def run_json(capsys, *extra):
    assert cli_main([*TOY, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_beams_on_the_toy_model(capsys):
    out = run_json(capsys, "--beams", "3")
    expected = td.beam_search(td.toy_model(), td.SEED_PROMPT, 3, 8)
    assert out["token_ids"] == expected.best.tokens
    assert [b["token_ids"] for b in out["beams"]] == [b.tokens for b in expected.beams]
    assert np.allclose([b["logprob"] for b in out["beams"]], [b.logprob for b in expected.beams])
    assert out["forward_calls"] == 8 and out["text"] == " ".join(map(str, expected.best.tokens))
    assert run_json(capsys, "--beams", "1")["token_ids"] == td.generate(td.toy_model(), td.SEED_PROMPT, 8).new_tokens


def test_penalties_and_min_p_on_the_toy_model(capsys):
    model = td.toy_model()
    for flags, processors in ((["--repetition-penalty", "3"], [td.RepetitionPenalty(3.0)]),
                              (["--min-p", "0.9", "--temperature", "1", "--seed", "0"], [td.MinP(0.9)])):
        sampler = make_sampler(temperature=1.0, seed=0) if "--seed" in flags else td.greedy
        expected = td.generate(model, td.SEED_PROMPT, 8, processors=processors, sampler=sampler).new_tokens
        assert run_json(capsys, *flags)["token_ids"] == expected
    assert run_json(capsys, "--repetition-penalty", "3")["token_ids"] != td.generate(model, td.SEED_PROMPT, 8).new_tokens


def test_stop_text_is_repeatable(capsys):
    assert run_json(capsys, "--stop", "2 0")["token_ids"] == [3, 2, 0]  # greedy: 3 2 0 4 ...
    assert run_json(capsys, "--stop", "0 4", "--stop", "3 2")["token_ids"] == [3, 2]
    beams = run_json(capsys, "--beams", "2", "--stop", "5")
    assert all("5" not in b["text"] for b in beams["beams"])


@pytest.mark.parametrize("flags, message", [
    (["--beams", "0"], "must be at least 1"),
    (["--beams", "2", "--temperature", "0.8"], "--beams is a deterministic search"),
    (["--beams", "2", "--no-cache"], "drop --no-cache"),
    (["--repetition-penalty", "0"], "repetition penalty must be a finite number > 0"),
    (["--min-p", "1.5"], r"min_p must be a number in [0, 1]"),
    (["--stop", ""], "stop sequences must be non-empty strings"),
])
def test_bad_flags(capsys, flags, message):
    try:
        code = cli_main([*TOY, *flags])
    except SystemExit as exc:  # argparse's own errors (type checks)
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


@needs_model
@pytest.mark.smollm2
def test_smollm2_beams_and_stop(capsys):
    args = ["generate", "--prompt", "The capital of France is", "--max-new-tokens", "6", "--json"]
    assert cli_main([*args, "--stop", "\n\n"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == " Paris." and out["token_ids"] == [7042, 30, 198, 198]  # "\n" + "\n": two tokens
    # streamed: what could be the start of a stop string is held back, the stop string never shown
    assert cli_main(args[:-1] + ["--stop", " answer"]) == 0
    assert capsys.readouterr().out == " Paris.\n\nThe\n"  # greedy: " Paris.\n\nThe answer is"
    assert cli_main([*args, "--beams", "2", "--repetition-penalty", "1.3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["beams"]) == 2 and out["beams"][0]["score"] >= out["beams"][1]["score"]
    assert out["text"].startswith(" Paris") and out["forward_calls"] <= 6
