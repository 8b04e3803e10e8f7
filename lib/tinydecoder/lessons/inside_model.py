"""Running a learner's "implement it" function inside a real model or engine, so a notebook can
show that the tokens (or logits, or perplexity) equal the library's. One helper per exercise:

    logits_with_block(model, ids, block)            ch03  block(x, attn_norm, attention, ffn_norm, mlp)
    paged_kernels(fn, block_size)                   ch17  fn(q [Hq, d], pool_k, pool_v, table, length)
    masked_kernels(chunk_mask) + prefill_in_chunks  ch18  chunk_mask(start, n_tokens) -> [n, start + n]
    tensor_parallel_ffn(fn, n_shards)               ch22  fn(x, w_gate, w_up, w_down, b_down, n, all_reduce)
    moe_ffn(fn, moefied, k)                         ch24  fn(x, router_logits, experts, k)
    BitmaskGrammar(grammar, fn)                     ch25  fn(logits, bitmask, eos_id, accepting)

(ch07's loop needs no helper: `decoding.cached_loop.model_step(model)` is the model as a step.)
Each returns what the library's own entry points take: an ffn for `reference.forward`, Kernels
for `generate`, a processor for `generate(processors=...)`.
"""
from __future__ import annotations

import math

import numpy as np

from ..algorithms.tensor_parallel import all_reduce_sum
from ..core import ops
from ..core.cache import LayerKV
from ..core.kernels import Kernels
from ..core.reference import embed_tokens, forward
from ..decoding.grammar import bitmask_words


# -- ch03: the block's wiring over SmolLM2's own sublayers ---------------------------------------
def _sublayers(model, layer, kv, positions):
    cfg = model.config
    Hq, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim

    def attn_norm(x):
        return ops.rmsnorm(x, layer.attn_norm, cfg.norm_eps)

    def ffn_norm(x):
        return ops.rmsnorm(x, layer.ffn_norm, cfg.norm_eps)

    def attention(h):  # q, k, v, RoPE, the cache, attention, output projection: [S, D] -> [S, D]
        q, k = (h @ layer.wq).reshape(-1, Hq, d), (h @ layer.wk).reshape(-1, Hkv, d)
        v = (h @ layer.wv).reshape(-1, Hkv, d)
        if cfg.position == "rope":
            q = ops.apply_rope(q, positions, cfg.rope_base, cfg.rope_layout)
            k = ops.apply_rope(k, positions, cfg.rope_base, cfg.rope_layout)
        k_all, v_all = kv.append(k, v)
        return ops.attention(q, k_all, v_all).reshape(len(h), Hq * d) @ layer.wo

    def mlp(z):
        return ops.swiglu(z, layer.w_gate, layer.w_up) @ layer.w_down

    return attn_norm, attention, ffn_norm, mlp


def logits_with_block(model, token_ids, block) -> np.ndarray:
    """Logits [S, V] of a prefill of token_ids where every layer is `block(x, attn_norm,
    attention, ffn_norm, mlp)` over that layer's own sublayers (a fresh cache)."""
    ids = np.asarray(token_ids)
    positions = np.arange(len(ids))
    cache = model.new_cache(len(ids))
    x = embed_tokens(model, ids, positions)
    for l, layer in enumerate(model.layers):
        x = np.asarray(block(x, *_sublayers(model, layer, LayerKV(cache, l, model.config), positions)))
    return ops.rmsnorm(x, model.final_norm, model.config.norm_eps) @ model.lm_head


# -- ch17: attention through a block table ---------------------------------------------------------
def paged_kernels(fn, block_size: int = 16, seed: int = 0) -> Kernels:
    """Kernels whose attention writes K/V into a pool of shuffled blocks (the unused rows hold
    garbage) and reads it back with fn(q [Hq, d], pool_k, pool_v, block_table, length), one
    query row at a time (row i of S sits at position T - S + i)."""
    rng = np.random.default_rng(seed)

    def attention(q, k, v):
        S, T = len(q), len(k)
        n = -(-T // block_size)
        table = rng.permutation(n + 2)[:n]  # spare blocks, in a shuffled order
        pools = [rng.standard_normal((n + 2, block_size) + k.shape[1:]).astype(k.dtype) * 50 for _ in "kv"]
        for pool, src in zip(pools, (k, v)):
            for i, b in enumerate(table):
                rows = src[i * block_size:(i + 1) * block_size]
                pool[b, :len(rows)] = rows
        return np.stack([np.asarray(fn(q[i], pools[0], pools[1], table, T - S + i + 1)) for i in range(S)])

    return Kernels(attention=attention)


# -- ch18: a chunk's mask ----------------------------------------------------------------------------
def masked_kernels(chunk_mask) -> Kernels:
    """Kernels whose attention adds chunk_mask(T - S, S) ([S, T], 0 or -inf) to the scores of
    S new queries over T keys, then softmax: the learner's mask decides what each query sees."""
    def attention(q, k, v):
        S, Hq, d = q.shape
        T, Hkv, _ = k.shape
        mask = np.asarray(chunk_mask(T - S, S), dtype=q.dtype)
        kv_head = np.arange(Hq) // (Hq // Hkv)
        scores = np.einsum("shd,thd->hst", q, k[:, kv_head]) / q.dtype.type(math.sqrt(d)) + mask  # [Hq, S, T]
        weights = ops.softmax(scores)
        return np.einsum("hst,thd->shd", weights, v[:, kv_head])

    return Kernels(attention=attention)


def prefill_in_chunks(model, token_ids, chunk_size: int, kernels=None) -> np.ndarray:
    """Logits [S, V]: token_ids prefilled chunk_size at a time into one cache (reference path)."""
    cache, out = model.new_cache(len(token_ids)), []
    for a in range(0, len(token_ids), chunk_size):
        out.append(forward(model, token_ids[a:a + chunk_size], cache, kernels=kernels or Kernels()))
    return np.concatenate(out)


# -- ch22 and ch24: a feed-forward of one's own in every layer ---------------------------------------
def tensor_parallel_ffn(fn, n_shards: int):
    """An ffn(l, layer, z) for reference.forward: fn(z, w_gate, w_up, w_down, None, n_shards,
    all_reduce_sum), the layer's SwiGLU split over n_shards simulated shards."""
    def ffn(l, layer, z):
        return np.asarray(fn(z, layer.w_gate, layer.w_up, layer.w_down, None, n_shards, all_reduce_sum), z.dtype)

    return ffn


def moe_ffn(fn, moefied, k: int):
    """An ffn(l, layer, z) for reference.forward: fn(z, router_logits, experts, k) with layer l's
    experts and learned router from a MoEfied model (lessons.moefication)."""
    def ffn(l, layer, z):
        W, b = moefied.routers[l]
        return np.asarray(fn(z, z @ W + b, moefied.experts[l], k), z.dtype)

    return ffn


# -- ch25: the bitmask ---------------------------------------------------------------------------------
class BitmaskGrammar:
    """A processor for generate(): the grammar's llguidance state gives each step's bitmask and
    whether it accepts; fn(logits, bitmask, eos_id, accepting) applies them."""

    def __init__(self, grammar, fn):
        self.grammar, self.fn = grammar, fn
        self.eos_id = grammar.end_tokens[0]

    def start(self, prompt) -> None:
        self.grammar.start(prompt)

    def __call__(self, tokens, logits):
        state = self.grammar.state(tokens)
        return np.asarray(self.fn(np.asarray(logits, np.float64), bitmask_words(state), self.eos_id,
                                  bool(state.is_accepting())))

    def is_done(self, tokens, prompt_length: int) -> bool:
        return self.grammar.is_done(tokens, prompt_length)
