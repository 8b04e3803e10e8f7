"""RoPE taken apart (notebook 13): which coordinates form a pair, the two layouts, the score
that depends only on distance, and two cache bugs.

The library's `ops.apply_rope(x, positions, base, layout)` rotates pair i of every head by
pos * base^(-2i/d). This module adds the pieces that explain it; the model never needs them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .config import ROPE_LAYOUTS
from .model import Model, check_token_ids, decoder_block, embed_tokens, forward
from .ops import apply_rope, rmsnorm, rope_angles


def _check_layout(layout):
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"RoPE layout must be one of {ROPE_LAYOUTS}, got {layout!r}")


def _check_head_dim(head_dim):
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"RoPE rotates pairs: head_dim must be an even integer >= 2, got {head_dim!r}")


def rope_pairs(head_dim: int, layout: str = "halves") -> np.ndarray:
    """The coordinates rotated together: row i = (a, b) is pair i, turned by angle theta_i * pos.
    "halves": (i, i + d/2); "interleaved": (2i, 2i + 1).  -> [d/2, 2] int."""
    _check_head_dim(head_dim)
    _check_layout(layout)
    i = np.arange(head_dim // 2)
    if layout == "halves":
        return np.stack([i, i + head_dim // 2], axis=1)
    return np.stack([2 * i, 2 * i + 1], axis=1)


def layout_permutation(head_dim: int) -> np.ndarray:
    """perm [d] with x_interleaved = x_halves[..., perm]: [0, d/2, 1, d/2 + 1, ...].

    It puts each "halves" pair (i, i + d/2) next to each other at (2i, 2i + 1); this is the
    row permutation llama.cpp's GGUF converter applies to Q and K."""
    return rope_pairs(head_dim, "halves").reshape(-1)


def permute_head_columns(w, n_heads: int, head_dim: int, perm) -> np.ndarray:
    """Reorder the output columns of a projection w [in, H*d] inside every head by `perm` [d]."""
    w = np.asarray(w)
    if w.shape[-1] != n_heads * head_dim:
        raise ValueError(f"projection has {w.shape[-1]} output columns, expected n_heads * head_dim = "
                         f"{n_heads} * {head_dim}")
    return w.reshape(*w.shape[:-1], n_heads, head_dim)[..., perm].reshape(w.shape)


def with_layout(model: Model, layout: str) -> Model:
    """The same network for the other RoPE layout: Q and K columns permuted per head, the config's
    rope_layout changed. Its logits equal the original's; V, O and everything else are shared.

    A checkpoint picks its layout through this permutation: weights trained (or converted) for
    one layout compute garbage if run with the other."""
    cfg = model.config
    if cfg.position != "rope":
        raise ValueError(f"model {cfg.name!r} uses position={cfg.position!r}; only RoPE models have a layout")
    _check_layout(layout)
    if layout == cfg.rope_layout:
        return model
    perm = layout_permutation(cfg.head_dim)
    if layout == "halves":  # going back: the inverse permutation
        perm = np.argsort(perm)
    # Q and K become new arrays: w_qkv=None makes Model fuse them again (with the shared V)
    layers = [dataclasses.replace(w, wq=permute_head_columns(w.wq, cfg.n_heads, cfg.head_dim, perm),
                                  wk=permute_head_columns(w.wk, cfg.n_kv_heads, cfg.head_dim, perm), w_qkv=None)
              for w in model.layers]
    return Model(dataclasses.replace(cfg, rope_layout=layout), embed=model.embed, layers=layers,
                 final_norm=model.final_norm, pos_table=model.pos_table,
                 lm_head=None if cfg.tied_embeddings else model.lm_head)


def rotate(vector, position, base=10000.0, layout="halves") -> np.ndarray:
    """One head vector [d] rotated at `position` (float64)."""
    v = np.asarray(vector, dtype=np.float64)
    return apply_rope(v[None, None, :], np.array([position]), base, layout)[0, 0]


def rope_score(q, k, pos_q, pos_k, base=10000.0, layout="halves") -> float:
    """q rotated at pos_q, dotted with k rotated at pos_k (unscaled).  q, k: [d]."""
    return float(rotate(q, pos_q, base, layout) @ rotate(k, pos_k, base, layout))


def score_grid(q, k, n_positions: int, base=10000.0, layout="halves") -> np.ndarray:
    """score[i, j] = rope_score(q, k, i, j) for i, j < n_positions: constant along each diagonal
    (j - i fixed), because only the distance enters.  -> [P, P] float64."""
    positions = np.arange(n_positions)
    qs = apply_rope(np.broadcast_to(np.asarray(q, np.float64), (n_positions, 1, len(q))).copy(),
                    positions, base, layout)[:, 0]  # [P, d]
    ks = apply_rope(np.broadcast_to(np.asarray(k, np.float64), (n_positions, 1, len(k))).copy(),
                    positions, base, layout)[:, 0]  # [P, d]
    return qs @ ks.T


def pair_view(q, k, pos_q, pos_k, base=10000.0, layout="halves") -> dict:
    """What the RoPE widget draws for a query at pos_q and a key at pos_k: per pair i, the 2-D
    pieces of q and k before and after rotation ([d/2, 2]), their angles and each pair's share
    of the score ([d/2]); the score; and, as a check, the score after shifting both positions
    down so that the earlier one is 0 (equal: only the distance matters)."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    if q.shape != k.shape or q.ndim != 1:
        raise ValueError(f"q and k must be vectors of one length, got shapes {q.shape} and {k.shape}")
    pairs = rope_pairs(len(q), layout)  # [d/2, 2]
    for name, pos in (("pos_q", pos_q), ("pos_k", pos_k)):
        if isinstance(pos, bool) or not isinstance(pos, (int, np.integer)) or pos < 0:
            raise ValueError(f"{name} must be an integer position >= 0, got {pos!r}")
    q_rot, k_rot = rotate(q, pos_q, base, layout), rotate(k, pos_k, base, layout)
    cos_q, sin_q = rope_angles([pos_q], len(q), base)
    angle_q = np.arctan2(sin_q[0], cos_q[0])  # [d/2], wrapped to (-pi, pi]
    cos_k, sin_k = rope_angles([pos_k], len(q), base)
    angle_k = np.arctan2(sin_k[0], cos_k[0])
    shift = min(pos_q, pos_k)
    return {"pairs": pairs, "q": q[pairs], "k": k[pairs], "q_rot": q_rot[pairs], "k_rot": k_rot[pairs],
            "angle_q": angle_q, "angle_k": angle_k, "pair_scores": np.sum(q_rot[pairs] * k_rot[pairs], axis=1),
            "score": float(q_rot @ k_rot), "distance": int(pos_q) - int(pos_k),
            "score_shifted_to_zero": rope_score(q, k, pos_q - shift, pos_k - shift, base, layout),
            "pos_q": int(pos_q), "pos_k": int(pos_k)}


# ----------------------------------------------------------------------------- bug clinic

ROPE_BUGS = {
    "none": "the correct loop: K cached after rotation, each new token rotated at past + offset",
    "new_token_at_zero": "every decode step rotates its new token's q and k at position 0",
    "rotate_cached_twice": "keys read back from the cache are rotated again by their positions",
}


class RotateAgainCache:
    """A KV cache with the "rotate cached keys twice" bug: it stores K after RoPE (right), but
    every read rotates the rows that were already there once more, as if they had been stored
    unrotated. The rows of the current call are returned as they are, so prefill is right and
    only the decode steps read doubly-rotated keys."""

    def __init__(self, inner, base=10000.0, layout="halves"):
        self.inner, self.base, self.layout = inner, base, layout

    def check(self, config, dtype=None):
        self.inner.check(config, dtype)

    def __len__(self):
        return len(self.inner)

    def append(self, layer, k_new, v_new):
        past = self.inner.lengths[layer]
        k_all, v_all = self.inner.append(layer, k_new, v_new)  # [T, Hkv, d], past rows rotated once
        k_read = k_all.copy()
        k_read[:past] = apply_rope(k_all[:past], np.arange(past), self.base, self.layout)  # the bug
        return k_read, v_all


def cached_decode(model: Model, prompt, continuation, bug: str = "none") -> list:
    """Prefill `prompt`, then feed `continuation` one token per step, with `bug` switched on.
    Returns the last-position logits of every step ([V] each; the first is the prefill's)."""
    if bug not in ROPE_BUGS:
        raise ValueError(f"unknown RoPE bug {bug!r}; choose one of {list(ROPE_BUGS)}")
    cfg = model.config
    if cfg.position != "rope":
        raise ValueError(f"model {cfg.name!r} uses position={cfg.position!r}; the RoPE bugs need a RoPE model")
    cache = model.new_cache()
    if bug == "rotate_cached_twice":
        cache = RotateAgainCache(cache, cfg.rope_base, cfg.rope_layout)
    logits = [forward(model, list(prompt), cache)[-1]]
    for token in continuation:
        if bug == "new_token_at_zero":
            logits.append(forward_at_positions(model, [token], cache, [0])[-1])
        else:
            logits.append(forward(model, [token], cache)[-1])
    return logits


def forward_at_positions(model: Model, token_ids, cache, positions) -> np.ndarray:
    """`forward` for one sequence with the positions of the new tokens given explicitly, built
    from the library's `decoder_block`. Right: positions = past + 0, 1, ...; anything else is
    a position bug. Returns logits [S, V]."""
    cfg = model.config
    ids = check_token_ids(cfg, token_ids)
    positions = np.asarray(positions, dtype=np.int64)
    if positions.shape != ids.shape:
        raise ValueError(f"{len(ids)} tokens but {positions.size} positions")
    x = embed_tokens(model, ids, positions)  # [S, D]
    bounds = np.array([0, len(ids)])
    for l, layer in enumerate(model.layers):
        x = decoder_block(cfg, layer, l, x, positions, bounds, [cache])
    return rmsnorm(x, model.final_norm, cfg.norm_eps) @ model.lm_head  # [S, V]


def recompute_logits(model: Model, prompt, continuation) -> list:
    """The reference: for every step, the full context recomputed without a cache.  [V] each."""
    tokens = list(prompt)
    out = [forward(model, tokens)[-1]]
    for token in continuation:
        tokens.append(token)
        out.append(forward(model, tokens)[-1])
    return out


def decode_differences(model: Model, prompt, continuation, bug: str = "none") -> list:
    """Per step, max |cached-with-bug logits - full recompute|: ~0 for "none", large for a bug."""
    return [float(np.max(np.abs(a - b)))
            for a, b in zip(cached_decode(model, prompt, continuation, bug),
                            recompute_logits(model, prompt, continuation))]
