"""How a `generate` reply ended: --json always says finish_reason ("stop": an end token, a stop
string, a grammar's end; "length": --max-new-tokens), and with a grammar grammar_complete; a
grammar cut short says so on stderr in one line naming the flag to raise. The toy model for
the plain endings (fast); SmolLM2 for grammars, with schemas and prompts written for this test."""
import json

import jsonschema
import pytest

import tinydecoder as td
from tinydecoder.cli import COMMANDS, build_parser
from tinydecoder.cli import main as cli_main

needs_model = pytest.mark.smollm2  # skipped without the wheel (tests/conftest.py)
TOY = ["generate", "--model", "toy", "--prompt", "0 1 2 3"]


def run_json(capsys, *argv):
    assert cli_main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_every_command_is_one_module_with_add_parser_and_run():
    assert set(COMMANDS) == {"seed", "generate", "bench", "verify", "serve", "grade", "eval"}
    for name, module in COMMANDS.items():  # eval's module is evaluate.py (eval is Python's builtin)
        assert module.__name__ == f"tinydecoder.cli.{'evaluate' if name == 'eval' else name}" and callable(module.run)
        assert build_parser().parse_args([name] + (["--prompt", "0"] if name == "generate" else [])
                                         + (["x.ipynb"] if name == "grade" else [])).command == name


def test_toy_endings_length_and_stop(capsys):
    out, err = run_json(capsys, *TOY, "--max-new-tokens", "4")
    assert out["token_ids"] == td.SEED_CONTINUATION and out["finish_reason"] == "length" and err == ""
    assert "grammar_complete" not in out
    stop = " ".join(map(str, td.SEED_CONTINUATION[:2]))  # the toy's text is its ids
    out, _ = run_json(capsys, *TOY, "--max-new-tokens", "8", "--stop", stop)
    assert out["finish_reason"] == "stop" and out["token_ids"] == td.SEED_CONTINUATION[:2]
    for extra in (["--beams", "2"], ["--speculative", "prompt-lookup"]):
        out, _ = run_json(capsys, *TOY, "--max-new-tokens", "3", *extra)
        assert out["finish_reason"] == "length" and len(out["token_ids"]) == 3 and out["weights"] == "f32"


def test_grammar_flags_are_one_at_a_time_and_need_a_tokenizer(tmp_path, capsys):
    grammar = tmp_path / "g.lark"
    grammar.write_text('start: "yes" | "no"\n')
    assert cli_main([*TOY, "--lark", str(grammar)]) == 2
    assert "--lark needs a tokenizer" in capsys.readouterr().err
    assert cli_main(["generate", "--prompt", "x", "--lark", str(grammar), "--regex", "a"]) == 2
    assert "--regex and --lark each constrain the whole output" in capsys.readouterr().err
    assert cli_main(["generate", "--prompt", "x", "--lark", str(tmp_path / "none.lark")]) == 2
    assert "--lark: cannot read" in capsys.readouterr().err


@needs_model
def test_smollm2_schema_cut_short_warns_once_and_complete_is_valid(tmp_path, capsys):
    schema = {"type": "object", "properties": {"river": {"type": "string", "maxLength": 20},
                                               "continent": {"type": "string", "enum": ["Africa", "Asia", "Europe"]}},
              "required": ["river", "continent"], "additionalProperties": False}
    path = tmp_path / "river.json"
    path.write_text(json.dumps(schema))
    question = ["generate", "--chat", "--prompt", "Name the longest river and its continent.", "--json-schema", str(path)]
    out, err = run_json(capsys, *question, "--max-new-tokens", "5")
    assert out["finish_reason"] == "length" and out["grammar_complete"] is False and len(out["token_ids"]) == 5
    assert err == ("warning: the JSON schema's output was cut at 5 tokens before it was complete; "
                   "raise --max-new-tokens\n")
    out, err = run_json(capsys, *question, "--max-new-tokens", "48")
    if out["finish_reason"] == "stop":
        assert out["grammar_complete"] is True and err == ""
        jsonschema.validate(json.loads(out["text"]), schema)
    else:  # the model wrote past 48 tokens (e.g. long whitespace): then it must have said so
        assert out["grammar_complete"] is False and "raise --max-new-tokens" in err


@needs_model
def test_smollm2_lark_grammar_ends_with_stop(tmp_path, capsys):
    grammar = tmp_path / "answer.lark"
    grammar.write_text('start: "yes" | "no"\n')
    out, err = run_json(capsys, "generate", "--chat", "--prompt", "Is water wet? Answer yes or no.",
                        "--lark", str(grammar), "--max-new-tokens", "8")
    assert out["text"] in ("yes", "no") and out["finish_reason"] == "stop" and out["grammar_complete"] is True
    assert err == ""
