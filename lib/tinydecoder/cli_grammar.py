"""`generate --json-schema FILE` and `generate --regex PATTERN`: grammar-constrained output on the
command line (the processors are decoding.grammar's JsonSchema and Regex, with SmolLM2's tokenizer
and its two end tokens). Kept beside cli.py so that the command module stays short."""
from __future__ import annotations


def add_grammar_arguments(parser) -> None:
    """Add --json-schema FILE and --regex PATTERN to the `generate` parser."""
    parser.add_argument("--json-schema", metavar="FILE",
                        help="constrain the output to JSON valid under the JSON schema in FILE (llguidance)")
    parser.add_argument("--regex", metavar="PATTERN",
                        help="constrain the output to text that matches PATTERN as a whole (llguidance)")


def grammar_flags(args) -> list:
    """(flag, given) for each grammar flag, for commands that refuse them (e.g. --speculative)."""
    return [("--json-schema", args.json_schema is not None), ("--regex", args.regex is not None)]


def grammar_processors(args) -> list:
    """The processor --json-schema FILE or --regex PATTERN asks for, if any (a one-element list)."""
    if args.json_schema is None and args.regex is None:
        return []
    if args.json_schema is not None and args.regex is not None:
        raise ValueError("--json-schema and --regex each constrain the whole output: give one of them")
    flag = "--regex" if args.regex is not None else "--json-schema"
    if args.model == "toy":
        raise ValueError(f"{flag} needs a tokenizer: use --model smollm2 (the toy's tokens are bare ids)")
    from .checkpoint.smollm2 import ENDOFTEXT_ID, IM_END_ID, smollm2_tokenizer
    from .decoding.grammar import JsonSchema, Regex, load_schema

    tok, ends = smollm2_tokenizer(), (IM_END_ID, ENDOFTEXT_ID)
    if args.regex is not None:
        return [Regex(args.regex, tok, end_tokens=ends)]
    return [JsonSchema(load_schema(args.json_schema, "--json-schema"), tok, end_tokens=ends)]
