"""Chapter 25's exercise: apply a grammar's token bitmask to one step's logits.

    apply_token_bitmask(logits [V], bitmask [ceil(V/32)] int32, eos_id, accepting) -> [V]

The bitmask is llguidance's (and vLLM's) layout: token t is allowed when bit t % 32 of word
bitmask[t // 32] is set, bit 0 being the least significant. A forbidden token's logit becomes
-inf; an allowed one keeps its logit. The end-of-sequence token eos_id is allowed exactly when
the grammar `accepting` (the text so far is complete). The input is not modified. The library's
answer: `decoding.grammar.apply_token_bitmask`.
"""
from __future__ import annotations

import numpy as np

from ...decoding.grammar import apply_token_bitmask
from .case import Case
from .compare import as_array, rng


def _words(bits_by_word) -> np.ndarray:
    return np.array([np.uint32(w).view(np.int32) for w in bits_by_word], dtype=np.int32)


def _allowed(out) -> set:
    return {int(t) for t in np.flatnonzero(np.isfinite(as_array(out, "the logits")))}


def _logits(seed, V=70):
    return rng(seed).standard_normal(V)


def _bit_order(fn) -> bool:  # bit 0 of word 0 is token 0, bit 1 of word 1 is token 33
    out = fn(_logits(240), _words([1, 2, 0]), 69, False)
    return _allowed(out) == {0, 33}


def _minus_inf(fn) -> bool:
    logits = _logits(241) + 5.0
    out = as_array(fn(logits, _words([0xF0F0F0F0, 0x0000FFFF, 0x3]), 69, False))
    forbidden = np.ones(70, bool)
    forbidden[sorted(_expected_allowed(np.array([0xF0F0F0F0, 0x0000FFFF, 0x3]), 70))] = False
    forbidden[69] = True
    return bool(np.all(out[forbidden] == -np.inf))


def _expected_allowed(words, V) -> set:
    return {t for t in range(V) if (int(words[t // 32]) >> (t % 32)) & 1}


def _kept(fn) -> bool:
    logits = _logits(242)
    words = _words([0xFFFFFFFF, 0xFFFFFFFF, 0x3F])
    out = as_array(fn(logits.copy(), words, 69, True))
    return out.shape == logits.shape and bool(np.array_equal(out, logits))


def _eos_needs_accepting(fn) -> bool:  # the end token's bit set, but the grammar does not accept
    return 69 not in _allowed(fn(_logits(243), _words([0, 0, 1 << 5]), 69, False))


def _eos_when_accepting(fn) -> bool:
    return 3 in _allowed(fn(_logits(244), _words([1 << 7, 0, 0]), 3, True))


def _sign_bit(fn) -> bool:  # a word with bit 31 set is a negative int32
    return _allowed(fn(_logits(245), _words([1 << 31, 1 << 31, 0]), 69, False)) == {31, 63}


def _input_unchanged(fn) -> bool:
    logits = _logits(246)
    before = logits.copy()
    fn(logits, _words([0x1, 0x0, 0x0]), 69, False)
    return bool(np.array_equal(logits, before))


def _random(fn) -> bool:
    r = rng(247)
    for V, eos in ((100, 99), (64, 0), (37, 20)):
        words = r.integers(-2**31, 2**31, size=-(-V // 32), dtype=np.int64).astype(np.int32)
        logits = r.standard_normal(V)
        for accepting in (False, True):
            out = as_array(fn(logits.copy(), words, eos, accepting))
            want = apply_token_bitmask(logits, words, eos, accepting)
            if out.shape != want.shape or not np.array_equal(out, want):
                return False
    return True


APPLY_TOKEN_BITMASK = [
    Case("shape [V]", "one logit per token comes back",
         lambda fn: np.shape(fn(_logits(248), _words([1, 1, 1]), 69, False)) == (70,)),
    Case("bit order in a word", "token t is bit t % 32 of word t // 32, counting from the least significant "
         "bit", _bit_order),
    Case("forbidden tokens get -inf", "after the softmax a forbidden token must have probability exactly 0; a "
         "logit of 0 still has some", _minus_inf),
    Case("allowed tokens keep their logits", "change only the forbidden ones", _kept),
    Case("no end token before the grammar accepts", "the end token is allowed only where the text is "
         "complete, whatever its bit says", _eos_needs_accepting),
    Case("the end token where the grammar accepts", "accepting: the end token may come", _eos_when_accepting),
    Case("bit 31 (a negative int32 word)", "the top bit makes the int32 negative; it is still token 32*w + 31",
         _sign_bit),
    Case("input left unchanged", "return a new array: the caller may keep the raw logits", _input_unchanged),
    Case("random masks vs the library", "compare with decoding.grammar.apply_token_bitmask", _random),
]

EXERCISES = {"apply_token_bitmask": APPLY_TOKEN_BITMASK}
REFERENCES = {"apply_token_bitmask": apply_token_bitmask}
