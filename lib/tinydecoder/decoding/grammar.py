"""Grammar-constrained decoding: logits processors that let only tokens a grammar allows through.

    context -> the grammar's state after the generated tokens -> allowed[V] (a bit per token)
    logits'[j] = logits[j] if allowed[j] else -inf            # end of sequence: allowed only
                                                              # when the text so far is complete

The grammar engine is llguidance (guidance-ai's; vLLM and SGLang can use it, llama.cpp can be built with it): it
compiles a JSON schema, a regular expression or a Lark grammar into a lexer plus an Earley
parser, and walks the tokenizer's vocabulary as a trie of byte strings, so each mask costs
one pass over the prefixes of the vocabulary that are still alive, not V separate checks.
Nothing here parses JSON or regexes by hand.

Why a token mask is harder than a character mask: a token is several characters (" true",
'{"', '":'), so "is its first character legal?" is the wrong question; every character of the
token must be legal in turn, the token may finish one grammar symbol and start the next, and
it may run past the end of the text the grammar allows. llguidance answers the whole-token
question for all V tokens at once.

Processors follow tinydecoder.decoding.processors: `processor(tokens, logits) -> logits'` on the
whole context. A grammar also needs to know where the prompt ends: generate and beam_search call
`start(prompt)` on every processor that has one (`start_processors`); a processor used on its
own treats the context of its first call as the prompt. States are kept per generated prefix,
so the beams of a beam search (which share prefixes) each get their own.

    JsonSchema(schema, tokenizer)   schema: a dict or a JSON string
    Regex(pattern, tokenizer)       the whole generated text must match the pattern
    Lark(grammar, tokenizer)        a Lark grammar (llguidance's dialect; start rule `start`)

`tokenizer` is a tinydecoder Tokenizer (e.g. smollm2_tokenizer()) or a `tokenizers.Tokenizer`;
`end_tokens` are the ids that end a sequence (default: the tokenizer's eos_id).
"""
from __future__ import annotations

import json
from numbers import Integral

import numpy as np

from ..core.validate import is_int
from .sampling import check_logits

_LL_TOKENIZERS: dict = {}  # (id of the tokenizers.Tokenizer, end tokens) -> (that object, LLTokenizer)


def _llguidance():
    try:
        import llguidance
    except ImportError:  # pragma: no cover - a core dependency; a clear message if it is missing
        raise ImportError("grammar-constrained decoding needs llguidance: pip install llguidance") from None
    return llguidance


def ll_tokenizer(tokenizer, end_tokens=None):
    """llguidance's view of `tokenizer` (its vocabulary as byte strings, built from the tokenizer's
    JSON with no transformers), cached per tokenizer. -> (LLTokenizer, end token ids)"""
    hf = getattr(tokenizer, "hf", tokenizer)
    if not (hasattr(hf, "to_str") and hasattr(hf, "get_vocab_size")):
        raise TypeError(f"tokenizer must be a tinydecoder Tokenizer (e.g. smollm2_tokenizer()) or a "
                        f"tokenizers.Tokenizer, got {type(tokenizer).__name__}")
    vocab = hf.get_vocab_size(with_added_tokens=True)
    if end_tokens is None:
        if getattr(tokenizer, "eos_id", None) is None:
            raise ValueError("this tokenizer names no end-of-sequence id: pass end_tokens=[ids]")
        end_tokens = [tokenizer.eos_id]
    end_tokens = [end_tokens] if isinstance(end_tokens, Integral) else list(end_tokens)
    if not end_tokens or not all(is_int(t) and 0 <= t < vocab
                                 for t in end_tokens):
        raise ValueError(f"end_tokens must be one or more token ids in 0..{vocab - 1}, got {end_tokens!r}")
    end_tokens = tuple(int(t) for t in end_tokens)
    key = (id(hf), end_tokens)
    if key not in _LL_TOKENIZERS:
        llg = _llguidance()
        _LL_TOKENIZERS[key] = (hf, llg.LLTokenizer(hf.to_str(), n_vocab=vocab, eos_token=list(end_tokens)))
    return _LL_TOKENIZERS[key][1], end_tokens


def load_schema(path, what: str = "the JSON schema file") -> dict:
    """A JSON schema read from a file, with a one-line error naming `what` when it cannot be."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as exc:
        raise FileNotFoundError(f"{what}: cannot read {str(path)!r}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what}: {str(path)!r} is not valid JSON: {exc}") from None


def allowed_tokens(matcher, vocab_size: int) -> np.ndarray:
    """The matcher's next-token mask as booleans.  -> [V] bool"""
    bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little")[:vocab_size].astype(bool)


def apply_token_bitmask(logits, bitmask, eos_id: int, accepting: bool) -> np.ndarray:
    """New logits [V]: -inf for every token the bitmask forbids. Token t is allowed when bit
    t % 32 (least significant first) of the 32-bit word bitmask[t // 32] is set (llguidance's
    and vLLM's layout); the end token `eos_id` is allowed exactly when the grammar `accepting`."""
    logits = np.asarray(logits)
    words = np.asarray(bitmask).astype(np.int64) & 0xFFFFFFFF  # the words' 32 bits, sign aside
    V = logits.shape[-1]
    if logits.ndim != 1 or words.ndim != 1 or len(words) * 32 < V:
        raise ValueError(f"need logits [V] and at least ceil(V / 32) bitmask words; got logits {logits.shape}, "
                         f"bitmask {words.shape}")
    t = np.arange(V)
    allowed = ((words[t // 32] >> (t % 32)) & 1).astype(bool)
    allowed[int(eos_id)] = bool(accepting)
    return np.where(allowed, logits, -np.inf).astype(logits.dtype)


def bitmask_words(matcher) -> np.ndarray:
    """The matcher's next-token mask as llguidance packs it: int32 words, bit t % 32 of word t // 32."""
    return np.frombuffer(matcher.compute_bitmask(), dtype="<i4").copy()


def _one_line(error: str) -> str:
    """llguidance's multi-line error (message, source excerpt, caret) as one line."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    detail = next((line for line in lines[1:] if line.startswith("error:")), "")
    return " ".join([lines[0], detail]).strip() if lines else "unknown error"


class GrammarProcessor:
    """Mask every token the grammar does not allow after the tokens generated so far.

    Also a stopping rule: `is_done` is True once the grammar can take nothing more (an end token
    was consumed, or the text is complete and admits no continuation)."""

    kind = "grammar"

    def __init__(self, grammar: str, tokenizer, end_tokens=None, *, source=None):
        llg = _llguidance()
        self.tokenizer, self.end_tokens = ll_tokenizer(tokenizer, end_tokens)
        self.vocab_size = self.tokenizer.vocab_size
        self.grammar, self.source = grammar, source
        root = llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if root.is_error():
            raise ValueError(f"invalid {self.kind}: {_one_line(root.get_error())}")
        self._root = root
        self._prompt = None  # the prompt's tokens, as a tuple
        self._states = {}  # generated tokens (tuple) -> LLMatcher after them

    # -- per-sequence state -------------------------------------------------------------
    def start(self, prompt) -> None:
        """A new sequence begins after `prompt`: forget every earlier state."""
        self._prompt = tuple(int(t) for t in prompt)
        self._states = {(): self._root.deep_copy()}

    def state(self, tokens):
        """The matcher after the generated part of `tokens` (the context: prompt + generated)."""
        tokens = tuple(int(t) for t in tokens)
        if self._prompt is None or tokens[:len(self._prompt)] != self._prompt:
            self.start(tokens)  # used without start(): the first context seen is the prompt
        generated = tokens[len(self._prompt):]
        matcher = self._states.get(generated)
        if matcher is None:
            parent = self._states.get(generated[:-1]) if generated else None
            if parent is None:  # a jump of several tokens: replay them from the start
                matcher = self._root.deep_copy()
                ok = matcher.consume_tokens(list(generated))
            else:
                matcher = parent.deep_copy()
                ok = matcher.consume_token(generated[-1])
            if not ok:
                text = self.tokenizer.decode_str(list(generated))
                raise ValueError(f"the generated text {text!r} breaks the {self.kind} (token "
                                 f"{generated[-1]} was not allowed): {_one_line(matcher.get_error())}")
            # states older than the parents of this step are no longer reachable
            self._states = {g: m for g, m in self._states.items() if len(g) >= len(generated) - 1}
            self._states[generated] = matcher
        return matcher

    # -- the processor and stopping-rule interface ----------------------------------------
    def mask(self, tokens) -> np.ndarray:
        """Which tokens may come next after `tokens`.  -> [V] bool"""
        return allowed_tokens(self.state(tokens), self.vocab_size)

    def __call__(self, tokens, logits) -> np.ndarray:
        out = check_logits(logits)  # a new float64 array
        if out.size != self.vocab_size:
            raise ValueError(f"this {self.kind} was built for a tokenizer of {self.vocab_size} ids, but the "
                             f"logits have {out.size}: build it with the model's own tokenizer")
        allowed = self.mask(tokens)
        out[~allowed] = -np.inf
        if not np.isfinite(out).any():
            raise ValueError(f"the {self.kind} allows no token here (allowed: {int(allowed.sum())}, all with "
                             f"-inf logits)")
        return out

    def is_accepting(self, tokens) -> bool:
        """Whether the generated text is complete under the grammar (an end token may come)."""
        return bool(self.state(tokens).is_accepting())

    def is_done(self, tokens, prompt_length: int) -> bool:
        if self._prompt is None or len(self._prompt) != prompt_length:
            self.start(list(tokens)[:prompt_length])
        return bool(self.state(tokens).is_stopped())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source!r})"


class JsonSchema(GrammarProcessor):
    """The generated text must be JSON that validates against `schema` (a dict or JSON string).

    JSON only, no text before or after it (whitespace between JSON tokens is free, as JSON
    allows); then an end token."""

    kind = "JSON schema"

    def __init__(self, schema, tokenizer, end_tokens=None):
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None
        if isinstance(schema, bool) or not isinstance(schema, dict):
            raise TypeError(f"schema must be a dict (a JSON schema object) or its JSON text, got "
                            f"{type(schema).__name__}")
        llg = _llguidance()
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(schema)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"invalid JSON schema: {exc}") from None
        self.schema = schema
        super().__init__(grammar, tokenizer, end_tokens, source=schema)


class Regex(GrammarProcessor):
    """The whole generated text must match `pattern` (Rust regex syntax, anchored at both ends)."""

    kind = "regular expression"

    def __init__(self, pattern, tokenizer, end_tokens=None):
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
        if not pattern:
            raise ValueError("the regular expression is empty: it would allow only an end token")
        self.pattern = pattern
        super().__init__(_llguidance().LLMatcher.grammar_from_regex(pattern), tokenizer, end_tokens, source=pattern)


class Lark(GrammarProcessor):
    """The generated text must derive from rule `start` of a Lark grammar (llguidance's dialect)."""

    kind = "Lark grammar"

    def __init__(self, grammar, tokenizer, end_tokens=None):
        if not isinstance(grammar, str):
            raise TypeError(f"a Lark grammar must be a str, got {type(grammar).__name__}")
        super().__init__(_llguidance().LLMatcher.grammar_from_lark(grammar), tokenizer, end_tokens, source=grammar)
