"""Chapter 18's exercise: the chain of block hashes that names a prefix (vLLM's scheme).

    block_hash_chain(token_ids, block_size) -> list of hashes

Cut token_ids into blocks of block_size; full block i gets
h_i = block_hash(h_{i-1}, its tokens), with h_{-1} = None, where `block_hash(parent, tokens)`
is `tinydecoder.serving.blocks.block_hash`. A trailing partial block gets no hash. The
library's version is `tinydecoder.serving.blocks.block_hashes`.
"""
from __future__ import annotations

import numpy as np

from ...serving.blocks import block_hashes
from .case import Case
from .compare import rng


def _tokens(seed: int, n: int) -> list:
    return [int(t) for t in rng(seed).integers(0, 49152, size=n)]


def _same(fn, tokens, block_size) -> bool:
    out = fn(list(tokens), block_size)
    return list(out) == block_hashes(tokens, block_size)


def _parent_matters(fn) -> bool:
    """Two prompts equal from block 1 on, different in block 0: block 1 must be named differently."""
    a = _tokens(60, 12)
    b = [a[0] + 1] + a[1:]
    return list(fn(a, 4))[1] != list(fn(b, 4))[1] and _same(fn, a, 4)


def _partial_block(fn) -> bool:
    tokens = _tokens(61, 10)  # two full blocks of 4, then 2 tokens
    return len(fn(tokens, 4)) == 2 and _same(fn, tokens, 4)


def _exact_multiple(fn) -> bool:
    tokens = _tokens(62, 12)  # exactly three blocks of 4
    return len(fn(tokens, 4)) == 3 and _same(fn, tokens, 4)


def _input_unchanged(fn) -> bool:
    tokens = _tokens(63, 9)
    seen = list(tokens)
    fn(seen, 3)
    return seen == tokens


BLOCK_HASH_CHAIN = [
    Case("one hash per full block", "name each full block once, and nothing else",
         lambda fn: len(fn(_tokens(64, 8), 4)) == 2),
    Case("block 0", "the first block has no parent: pass None as its parent",
         lambda fn: list(fn(_tokens(65, 4), 4)) == block_hashes(_tokens(65, 4), 4)),
    Case("a block's name covers its parent", "two prompts that differ only in block 0 must also get "
         "different names for block 1: equal names must mean equal prefixes", _parent_matters),
    Case("block boundaries", "block i holds exactly block_size tokens, starting at position i * block_size",
         lambda fn: _same(fn, _tokens(66, 20), 5) and _same(fn, _tokens(67, 21), 7)),
    Case("no name for a partial block", "a block that is not full yet may still grow: it gets no name",
         _partial_block),
    Case("a prompt that ends on a block boundary", "when the length is a multiple of block_size, the "
         "last block is full and is named too", _exact_multiple),
    Case("shorter than one block", "no full block, no name: an empty list", lambda fn: list(fn(_tokens(68, 3), 4)) == []),
    Case("block size 1", "with blocks of one token every token starts a new block",
         lambda fn: _same(fn, _tokens(69, 6), 1)),
    Case("a numpy array of ids", "accept any sequence of token ids, a numpy array included",
         lambda fn: list(fn(np.array(_tokens(70, 9)), 3)) == block_hashes(_tokens(70, 9), 3)),
    Case("input unchanged", "do not modify the token list you are given", _input_unchanged),
]

EXERCISES = {"block_hash_chain": BLOCK_HASH_CHAIN}
REFERENCES = {"block_hash_chain": block_hashes}
