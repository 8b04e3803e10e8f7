"""Chapter 16's exercise: how many requests fit in a KV memory budget, from a model's config.json.

    requests_in_budget(config, dtype_bytes, context, budget_bytes, block_size=None) -> int

config: a Hugging Face config.json dict (num_hidden_layers, num_attention_heads, optional
num_key_value_heads (absent: one per query head), optional head_dim (absent: hidden_size /
num_attention_heads)); dtype_bytes: bytes per stored number; context: positions per request;
block_size: None for an exact cache, else positions are rounded up to whole blocks.
The library's answer: `serving.capacity.requests_that_fit(config, budget_bytes, context,
dtype_bytes, block_size)`.
"""
from __future__ import annotations

import numpy as np

from ...core.validate import is_int
from ...serving.capacity import GIB, KNOWN_CONFIGS, requests_that_fit
from .case import Case


def library(config, dtype_bytes, context, budget_bytes, block_size=None) -> int:
    """The library's answer, in the exercise's signature."""
    return requests_that_fit(config, budget_bytes, context, dtype_bytes, block_size)


def _agrees(fn, config, dtype_bytes, context, budget, block_size=None) -> bool:
    out = fn(dict(config), dtype_bytes, context, budget, block_size)
    if out is None:
        raise ValueError("the function returned None: did it forget to return?")
    if not is_int(out):
        raise TypeError(f"expected a whole number of requests (int), got {type(out).__name__} {out!r}")
    return int(out) == library(config, dtype_bytes, context, budget, block_size)


# a 4-layer MHA model (no num_key_value_heads: one KV head per query head), head size 64
_MHA = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512}
# a GQA model whose config gives head_dim explicitly, different from hidden_size / heads (as Gemma's does)
_HEAD_DIM = {"num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2,
             "hidden_size": 1024, "head_dim": 256}
_SMOL = KNOWN_CONFIGS["SmolLM2-135M"]  # 46,080 bytes per token in float32


def _llama7(fn):  # MHA, 16-bit: 20 requests of 4,096 tokens in 40 GiB
    return _agrees(fn, KNOWN_CONFIGS["Llama-2-7B"], 2, 4096, 40 * GIB)


def _gqa(fn):  # 9 query heads share 3 KV heads: counting Hq gives a third of the answer
    return _agrees(fn, _SMOL, 4, 8192, 8 * GIB)


def _missing_kv_heads(fn):
    return _agrees(fn, _MHA, 2, 1000, 10 * 2**20)


def _head_dim_given(fn):
    return _agrees(fn, _HEAD_DIM, 2, 512, 2**30)


def _partial_block(fn):  # 33 positions in blocks of 16 occupy 48; 32 exactly would let 3 fit, not 2
    per_token = 2 * 4 * 8 * 64 * 2
    return _agrees(fn, _MHA, 2, 33, 100 * per_token, block_size=16)


def _exact_blocks(fn):  # 32 positions are exactly 2 blocks of 16: no third block
    per_token = 2 * 4 * 8 * 64 * 2
    return _agrees(fn, _MHA, 2, 32, 95 * per_token, block_size=16)


def _round_down(fn):  # 22.76 requests' worth of memory holds 22
    return _agrees(fn, _SMOL, 4, 8192, 8 * GIB)


def _budget_too_small(fn):
    return _agrees(fn, _SMOL, 4, 8192, 46_080 * 8191)


def _random(fn):
    rng = np.random.default_rng(16)
    for _ in range(40):
        heads = int(rng.choice([4, 8, 12, 16, 32]))
        cfg = {"num_hidden_layers": int(rng.integers(1, 48)), "num_attention_heads": heads,
               "num_key_value_heads": int(rng.choice([h for h in (1, 2, 4, heads) if heads % h == 0])),
               "hidden_size": heads * int(rng.choice([32, 64, 128]))}
        block = [None, 1, 8, 16, 32][int(rng.integers(0, 5))]
        if not _agrees(fn, cfg, int(rng.choice([1, 2, 4])), int(rng.integers(1, 5000)),
                       int(rng.integers(1, 2**34)), block):
            return False
    return True


REQUESTS_IN_BUDGET = [
    Case("Llama-2-7B in 40 GiB", "one position stores a key AND a value in every layer, for every KV head, "
         "head_dim numbers each", _llama7),
    Case("grouped-query attention", "only the KV heads store vectors; the query heads share them", _gqa),
    Case("config without num_key_value_heads", "absent num_key_value_heads means multi-head attention: "
         "one KV head per query head", _missing_kv_heads),
    Case("config with head_dim", "when the config gives head_dim, use it; hidden_size / heads is only the "
         "fallback", _head_dim_given),
    Case("partly filled last block", "a block that is only partly used is still a whole block", _partial_block),
    Case("context a whole number of blocks", "when the context fills its blocks exactly, no extra block is "
         "needed: ceil, not floor + 1", _exact_blocks),
    Case("round down", "a request that only partly fits does not fit: floor the division", _round_down),
    Case("budget below one request", "less memory than one request needs holds 0 requests", _budget_too_small),
    Case("random configs vs the library", "compare with capacity.requests_that_fit on your own examples",
         _random),
]

EXERCISES = {"requests_in_budget": REQUESTS_IN_BUDGET}
REFERENCES = {"requests_in_budget": library}
