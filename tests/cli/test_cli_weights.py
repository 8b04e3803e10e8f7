"""--weights f32|q4_1 on generate, serve and bench: it parses, bad choices are clear errors, the
toy refuses q4_1, --tensor-parallel refuses it, bench --json reports the weights section, and on
SmolLM2 generate --weights q4_1 gives f32's greedy tokens."""
import json

import pytest

from tinydecoder.checkpoint.registry import DEFAULT_WEIGHTS, WEIGHTS, check_weights
from tinydecoder.cli import build_parser
from tinydecoder.cli import main as cli_main


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["serve"], ["bench"]])
def test_weights_parses_on_each_command(command, capsys):
    parser = build_parser()
    assert parser.parse_args(command).weights is None  # the registry's default, per model
    assert parser.parse_args(command + ["--weights", "q4_1"]).weights == "q4_1"
    assert parser.parse_args(command + ["--weights", "f32"]).weights == "f32"
    with pytest.raises(SystemExit):
        parser.parse_args(command + ["--weights", "q4_0"])
    err = capsys.readouterr().err
    assert "--weights" in err and "invalid choice: 'q4_0'" in err and "'q4_1'" in err


def test_one_stream_default_is_q4_1_only_with_the_fast_kernels(monkeypatch):
    from tinydecoder.checkpoint import registry
    from tinydecoder.fast.compiled import jit

    monkeypatch.setattr(jit, "available", lambda: True)
    assert registry.one_stream_weights() == registry.ONE_STREAM_WEIGHTS == "q4_1"
    monkeypatch.setattr(jit, "available", lambda: False)  # no numba: Q4_1 would dequantise every step
    assert registry.one_stream_weights() == registry.DEFAULT_WEIGHTS == "f32"


def test_serve_defaults_to_q4_1_up_to_16_running_requests(monkeypatch):
    from tinydecoder.checkpoint import registry
    from tinydecoder.fast.compiled import jit

    monkeypatch.setattr(jit, "available", lambda: True)
    assert registry.serve_weights(1) == registry.serve_weights(registry.SERVE_Q4_1_UP_TO_BATCH) == "q4_1"
    assert registry.serve_weights(registry.SERVE_Q4_1_UP_TO_BATCH + 1) == "f32"
    monkeypatch.setattr(jit, "available", lambda: False)
    assert registry.serve_weights(1) == "f32"


def test_serve_command_passes_the_weights_it_chose(monkeypatch):
    server = pytest.importorskip("tinydecoder.server")
    from tinydecoder.checkpoint import registry

    calls = []
    monkeypatch.setattr(server, "run_server", lambda model, **kw: calls.append((model, kw["weights"])) or 0)
    monkeypatch.setattr(registry, "one_stream_weights", lambda: "q4_1")  # as where numba runs the fast kernels
    for extra, want in (([], "q4_1"), (["--max-batch", "17"], "f32"), (["--weights", "f32"], "f32"),
                        (["--max-batch", "64", "--weights", "q4_1"], "q4_1")):
        assert cli_main(["serve", "--model", "smollm2", *extra]) == 0
        assert calls.pop() == ("smollm2", want), extra
    assert cli_main(["serve", "--model", "toy"]) == 0 and calls.pop() == ("toy", "f32")


def test_check_weights_defaults_and_errors():
    assert DEFAULT_WEIGHTS in WEIGHTS == ("f32", "q4_1")
    assert check_weights("smollm2", None) == DEFAULT_WEIGHTS
    assert check_weights("toy", None) == "f32"
    assert check_weights("smollm2", "q4_1") == "q4_1"
    with pytest.raises(ValueError, match="use --model smollm2"):
        check_weights("toy", "q4_1")
    with pytest.raises(ValueError, match="unknown weights 'int8'; choose one of f32, q4_1"):
        check_weights("smollm2", "int8")
    with pytest.raises(ValueError, match="unknown model"):
        check_weights("gpt", None)


def test_the_toy_refuses_q4_1_clearly(capsys):
    assert cli_main(["generate", "--model", "toy", "--prompt", "0 1 2", "--weights", "q4_1"]) == 2
    assert "error: weights 'q4_1' need the GGUF file's blocks: use --model smollm2" in capsys.readouterr().err
    assert cli_main(["bench", "--model", "toy", "--weights", "q4_1"]) == 2
    assert "use --model smollm2" in capsys.readouterr().err


def test_tensor_parallel_refuses_q4_1(capsys):
    code = cli_main(["generate", "--model", "toy", "--prompt", "0 1", "--tensor-parallel", "2", "--weights", "q4_1"])
    assert code == 2 and "--tensor-parallel shards float32 weights: drop --weights q4_1" in capsys.readouterr().err


def test_toy_bench_json_has_the_weights_section(capsys):
    assert cli_main(["bench", "--model", "toy", "--json", "--repeat", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["weights_choice"] == "f32" and set(result["weights"]) == {"f32"}  # the toy has no blocks
    f32 = result["weights"]["f32"]
    for key in ("decode_tokens_per_second", "decode_bytes_per_token", "decode_roof_fraction"):
        assert set(f32[key]) == {"128", "512", "2048"} and all(v > 0 for v in f32[key].values())
    assert f32["decode_bytes_per_token"] == result["decode_bytes_per_token"]  # the same model's bytes
    assert [row["batch"] for row in f32["batch_decode"]] == [1, 2, 4, 8, 16, 32]
    assert not any(what.startswith("q4_1") for what in result["targets"])  # nothing to compare against
    assert set(result["load_average"]) == {"before", "after"}  # the machine's load beside the numbers


@pytest.mark.smollm2
def test_generate_by_default_and_with_q4_1_gives_f32s_greedy_tokens(capsys):
    from tinydecoder.fast.compiled import jit

    if not jit.available():
        pytest.skip("q4_1's kernels need numba")
    for prompt in ("The three primary colors are", "A lighthouse keeper found a bottle that"):
        runs = {}
        for weights in (None, "q4_1", "f32"):  # None: generate's default for one stream
            assert cli_main(["generate", "--prompt", prompt, "--max-new-tokens", "16", "--json"]
                            + (["--weights", weights] if weights else [])) == 0
            runs[weights] = json.loads(capsys.readouterr().out)
        assert [runs[w]["weights"] for w in (None, "q4_1", "f32")] == ["q4_1", "q4_1", "f32"]
        assert runs["q4_1"]["prompt_token_ids"] == runs["f32"]["prompt_token_ids"]
        assert len(runs["f32"]["token_ids"]) == 16
        for w in (None, "q4_1"):
            assert runs[w]["token_ids"] == runs["f32"]["token_ids"] and runs[w]["text"] == runs["f32"]["text"]


@pytest.mark.smollm2
def test_beams_and_speculative_default_to_f32_and_say_so(capsys):
    """Passes over several rows (beams, speculative checks) keep float32 unless asked; --json says which."""
    for extra, weights in ((["--beams", "2"], None), (["--speculative", "prompt-lookup"], None),
                           (["--speculative", "prompt-lookup"], "q4_1")):
        assert cli_main(["generate", "--prompt", "def add(a, b):", "--max-new-tokens", "4", "--json", *extra]
                        + (["--weights", weights] if weights else [])) == 0
        assert json.loads(capsys.readouterr().out)["weights"] == (weights or "f32")



@pytest.mark.smollm2
def test_bench_prices_q4_1_by_its_decode_steps():
    """bench's q4_1 price: eval's text fed one token a forward, scored against float32's prefill."""
    from tinydecoder.checkpoint.registry import open_tokenizer
    from tinydecoder.checkpoint.smollm2 import load_smollm2
    from tinydecoder.cli.bench import decode_price

    price = decode_price(load_smollm2("q4_1"), load_smollm2("f32"), open_tokenizer("smollm2"), tokens=48)
    assert price["tokens"] == 48 and 0 < price["mean_kl"] < 1e-6
    assert price["perplexity"] == pytest.approx(price["reference_perplexity"], rel=1e-4) and price["perplexity"] > 1
