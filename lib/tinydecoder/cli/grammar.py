"""`generate --json-schema FILE`, `--regex PATTERN` and `--lark FILE`: grammar-constrained output
on the command line (decoding.grammar's JsonSchema, Regex and Lark, with the model's tokenizer and
its end tokens), and how a reply ended:

    finish_reason      "stop": a stop token, a stop string, or the grammar's end;
                       "length": --max-new-tokens ended it
    grammar_complete   (with a grammar) whether the output is complete under the grammar

A grammar cut short by --max-new-tokens is also said on stderr, in one line naming the flag."""
from __future__ import annotations

import sys

FLAGS = ("--json-schema", "--regex", "--lark")


def add_grammar_arguments(parser) -> None:
    """Add --json-schema FILE, --regex PATTERN and --lark FILE to the `generate` parser."""
    parser.add_argument("--json-schema", metavar="FILE",
                        help="constrain the output to JSON valid under the JSON schema in FILE (llguidance)")
    parser.add_argument("--regex", metavar="PATTERN",
                        help="constrain the output to text that matches PATTERN as a whole (llguidance)")
    parser.add_argument("--lark", metavar="FILE",
                        help="constrain the output to the Lark grammar in FILE (llguidance's dialect, rule start)")


def grammar_flags(args) -> list:
    """(flag, given) for each grammar flag, for commands that refuse them (e.g. --speculative)."""
    return [(flag, getattr(args, flag[2:].replace("-", "_")) is not None) for flag in FLAGS]


def grammar_processors(args, chosen=None) -> list:
    """The processor --json-schema FILE, --regex PATTERN or --lark FILE asks for, if any (a
    one-element list). chosen: the checkpoint.registry model (its tokenizer and end tokens)."""
    given = [flag for flag, on in grammar_flags(args) if on]
    if not given:
        return []
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} each constrain the whole output: give one of them")
    flag = given[0]
    if args.model == "toy":
        raise ValueError(f"{flag} needs a tokenizer: use --model smollm2 (the toy's tokens are bare ids)")
    from ..checkpoint.registry import open_tokenizer, stop_tokens_of
    from ..decoding.grammar import JsonSchema, Lark, Regex, load_schema

    tok, ends = open_tokenizer(args.model), stop_tokens_of(args.model)
    if flag == "--regex":
        return [Regex(args.regex, tok, end_tokens=ends)]
    if flag == "--lark":
        return [Lark(read_text(args.lark, flag), tok, end_tokens=ends)]
    return [JsonSchema(load_schema(args.json_schema, flag), tok, end_tokens=ends)]


def read_text(path, flag: str) -> str:
    try:
        return open(path, encoding="utf-8").read()
    except OSError as exc:
        raise FileNotFoundError(f"{flag}: cannot read {str(path)!r}: {exc.strerror}") from None


def grammar_of(processors):
    """The grammar among the processors (decoding.grammar.GrammarProcessor), or None."""
    return next((p for p in processors if hasattr(p, "is_accepting")), None)


def finish_reason(stopped: bool, n_new: int, max_new_tokens: int) -> str:
    """"stop" when the reply ended by itself (stop token, stop string, grammar), "length" when
    --max-new-tokens ended it."""
    return "stop" if stopped or n_new < max_new_tokens else "length"


def endings(args, processors, prompt, new_tokens, stopped: bool) -> dict:
    """{"finish_reason"} and, with a grammar, {"grammar_complete"}; a grammar cut short by
    --max-new-tokens is reported on stderr in one line."""
    out = {"finish_reason": finish_reason(stopped, len(new_tokens), args.max_new_tokens)}
    grammar = grammar_of(processors)
    if grammar is None:
        return out
    out["grammar_complete"] = complete = grammar.is_accepting(list(prompt) + list(new_tokens))
    if not complete and out["finish_reason"] == "length":
        print(f"warning: the {grammar.kind}'s output was cut at {len(new_tokens)} tokens before it was complete; "
              f"raise --max-new-tokens", file=sys.stderr)
    return out
