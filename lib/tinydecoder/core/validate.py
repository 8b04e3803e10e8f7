"""Argument checks shared by the whole package: one clear message per kind of bad input."""
from __future__ import annotations

from numbers import Integral, Real

import numpy as np

ROPE_LAYOUTS = ("halves", "interleaved")


def is_int(value) -> bool:
    """An integer (Python or numpy), and not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    """A real number (int or float, Python or numpy), and not a bool."""
    return isinstance(value, Real) and not isinstance(value, bool)


def int_at_least(name: str, value, low: int = 1) -> int:
    """`value` as an int; a ValueError naming `name` unless it is an integer >= low."""
    if not is_int(value) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def positive_int(name: str, value) -> int:
    """`value` as an int; a ValueError naming `name` unless it is an integer >= 1."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer (an integer >= 1), got {value!r}")
    return int(value)


def limit(name: str, value) -> int | None:
    """A limit that may be off: None (no limit), or `value` as an int >= 1 (a ValueError naming `name`)."""
    if value is not None and not (is_int(value) and value >= 1):
        raise ValueError(f"{name} must be an integer >= 1 or None (no limit), got {value!r}")
    return None if value is None else int(value)


def number_at_least(name: str, value, low: float = 0.0, *, strict: bool = False) -> float:
    """`value` as a float; a ValueError unless it is a real number >= low (> low if strict)."""
    if not is_real(value) or value != value or (value <= low if strict else value < low):
        raise ValueError(f"{name} must be a number {'>' if strict else '>='} {low}, got {value!r}")
    return float(value)


def layer_index(value, n_layers: int) -> int:
    """A layer number 0..n_layers-1."""
    if not is_int(value) or not 0 <= value < n_layers:
        raise ValueError(f"layer {value!r} is out of range: layers are 0..{n_layers - 1} (n_layers)")
    return int(value)


def max_new_tokens(value) -> int:
    return int_at_least("max_new_tokens", value, 1)


def rope_layout(value) -> str:
    if value not in ROPE_LAYOUTS:
        raise ValueError(f"RoPE layout must be one of {ROPE_LAYOUTS}, got {value!r}")
    return value


def even_head_dim(value) -> int:
    if not is_int(value) or value < 2 or value % 2:
        raise ValueError(f"RoPE rotates pairs: head_dim must be an even integer >= 2, got {value!r}")
    return int(value)


def check_token_ids(config, token_ids) -> np.ndarray:
    """Validate a sequence of token ids (in the model's vocabulary, unless config is None);
    return it as a 1-D int64 array."""
    if isinstance(token_ids, (str, bytes)):
        raise TypeError("token ids must be a sequence of integers, got text; encode it with a tokenizer first")
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        raise ValueError(f"token ids must be a flat sequence of integers, got an array of shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("empty prompt: at least one token id is needed")
    if arr.dtype.kind == "O" and all(is_int(t) for t in arr):
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        bad = next((t for t in arr.tolist() if not is_int(t)), arr[0])
        raise TypeError(f"token ids must be integers, got {bad!r} ({type(bad).__name__})")
    if config is None:
        if arr.size and arr.min() < 0:
            raise ValueError(f"token id {int(arr.min())} is negative: ids are integers >= 0")
        return arr.astype(np.int64, copy=False)
    if arr.min() < 0 or arr.max() >= config.vocab_size:
        i = int(np.flatnonzero((arr < 0) | (arr >= config.vocab_size))[0])
        raise ValueError(f"token id {int(arr[i])} at position {i} is out of range: "
                         f"ids must be in 0..{config.vocab_size - 1} (vocab_size {config.vocab_size})")
    return arr.astype(np.int64, copy=False)


def check_context(config, past: int, new: int, max_new_tokens: int = 0) -> int:
    """The positions a call needs: `past` cached + `new` fed now, plus, when generating
    `max_new_tokens`, all but the last of them (the last chosen token is never fed back).
    A ValueError when that passes the model's context limit.  -> positions needed"""
    needed = past + new + max(max_new_tokens - 1, 0)
    if needed > config.max_context:
        what = (f"a {new}-token prompt plus {max_new_tokens} new tokens needs" if max_new_tokens else
                f"{past} cached + {new} new =")
        raise ValueError(f"context too long: {what} {needed} positions, "
                         f"but this model's context limit is {config.max_context}")
    return needed


def check_positions(positions, n: int, limit: int | None = None) -> np.ndarray:
    """Positions of n new tokens: n integers in 0..limit-1 (any >= 0 without a limit).  -> [n] int64"""
    arr = np.asarray(positions)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise TypeError(f"positions must be a flat sequence of integers, got {arr.dtype} of shape {arr.shape}")
    if len(arr) != n:
        raise ValueError(f"positions has {len(arr)} entries, but {n} tokens were given: one position per token")
    if arr.size and (arr.min() < 0 or (limit is not None and arr.max() >= limit)):
        bad = int(arr.min()) if arr.min() < 0 else int(arr.max())
        raise ValueError(f"position {bad} is out of range: positions must be in 0..{'' if limit is None else limit - 1}")
    return arr.astype(np.int64, copy=False)


def heads_per_kv(n_heads: int, n_kv_heads: int) -> int:
    """How many query heads share one KV head; a ValueError unless n_kv_heads divides n_heads."""
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} query heads cannot share {n_kv_heads} KV heads: the number of query heads "
                         "must be a multiple of the number of KV heads")
    return n_heads // n_kv_heads
