"""RoPE taken apart (notebook 04): which coordinates form a pair, the two layouts, the score
that depends only on distance, and two cache bugs.

The library's `ops.apply_rope(x, positions, base, layout)` rotates pair i of every head by
pos * base^(-2i/d). This module adds the pieces that explain it; the model never needs them.
"""
from __future__ import annotations

import numpy as np

from ..core.cache import LayerKV
from ..core.model import Model
from ..core.ops import apply_rope, rmsnorm, rope_angles
from ..core.reference import decoder_block, embed_tokens, forward
from ..core.rope import layout_permutation, permute_head_columns, rope_pairs, with_layout  # noqa: F401
from ..core.validate import check_token_ids, is_int


def rotate_vector(vector, position, base=10000.0, layout="halves") -> np.ndarray:
    """One head vector [d] rotated at `position` (float64)."""
    v = np.asarray(vector, dtype=np.float64)
    return apply_rope(v[None, None, :], np.array([position]), base, layout)[0, 0]


def rope_score(q, k, pos_q, pos_k, base=10000.0, layout="halves") -> float:
    """q rotated at pos_q, dotted with k rotated at pos_k (unscaled).  q, k: [d]."""
    return float(rotate_vector(q, pos_q, base, layout) @ rotate_vector(k, pos_k, base, layout))


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
        if not is_int(pos) or pos < 0:
            raise ValueError(f"{name} must be an integer position >= 0, got {pos!r}")
    q_rot, k_rot = rotate_vector(q, pos_q, base, layout), rotate_vector(k, pos_k, base, layout)
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
    for l, layer in enumerate(model.layers):
        x = decoder_block(layer, x, positions, LayerKV(cache, l, cfg))
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
