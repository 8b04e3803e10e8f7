"""RoPE's two layouts: which coordinates form a pair, and the permutation that converts a
checkpoint from one layout to the other (`ops.apply_rope` is the rotation as the math reads; the
fast path's tables and in-place rotation are `fast.rope_tables`)."""
from __future__ import annotations

import dataclasses

import numpy as np

from .model import LayerWeights, Model
from .validate import even_head_dim, rope_layout


def rope_pairs(head_dim: int, layout: str = "halves") -> np.ndarray:
    """The coordinates rotated together: row i = (a, b) is pair i, turned by angle theta_i * pos.
    "halves": (i, i + d/2); "interleaved": (2i, 2i + 1).  -> [d/2, 2] int."""
    even_head_dim(head_dim)
    rope_layout(layout)
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
    rope_layout(layout)
    if layout == cfg.rope_layout:
        return model
    perm = layout_permutation(cfg.head_dim)
    if layout == "halves":  # going back: the inverse permutation
        perm = np.argsort(perm)
    # Q and K permuted (new arrays, with V copied beside them); O and the FFN shared
    layers = [LayerWeights.from_parts(permute_head_columns(w.wq, cfg.n_heads, cfg.head_dim, perm),
                                      permute_head_columns(w.wk, cfg.n_kv_heads, cfg.head_dim, perm), w.wv,
                                      w.wo, w.w_gate, w.w_up, w.w_down, w.attn_norm, w.ffn_norm)
              for w in model.layers]
    for new, old in zip(layers, model.layers):
        new.w_gate_up = old.w_gate_up  # shared, not copied
    return Model(dataclasses.replace(cfg, rope_layout=layout), embed=model.embed, layers=layers,
                 final_norm=model.final_norm, pos_table=model.pos_table,
                 lm_head=None if cfg.tied_embeddings else model.lm_head)
