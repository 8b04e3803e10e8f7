"""RoPE's two layouts: which coordinates form a pair, and the permutation that converts a
checkpoint from one layout to the other (`ops.apply_rope` is the rotation as the math reads); and
the fast path's rotation: the cos/sin tables of a pass computed once (`rope_tables`), applied by
numpy (`rotate`) or in place by one compiled call (`rotate_heads`, with numba)."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from . import skinny
from .config import Config
from .model import LayerWeights, Model
from .ops import rope_angles
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


# ----------------------------------------------------------------------------- the fast path

class RopeTables(NamedTuple):
    """RoPE's cos and sin for every row of a pass, computed once: cos2 and sin2 shaped for `rotate`,
    cos and sin [N, d/2] for the compiled `rotate_heads`."""
    cos2: np.ndarray  # [N, 1, 2, d/2] ("halves") or [N, 1, d/2, 2] ("interleaved")
    sin2: np.ndarray  # the same, signed: the pair's first member gets -x2 sin, the second +x1 sin
    cos: np.ndarray  # [N, d/2]
    sin: np.ndarray  # [N, d/2]

    def take(self, rows) -> RopeTables:
        """The tables of some rows only."""
        return RopeTables(*(np.ascontiguousarray(t[rows]) for t in self))


def rope_tables(config: Config, positions, dtype) -> RopeTables:
    """cos and sin for every row, once per pass (see RopeTables)."""
    cos, sin = rope_angles(positions, config.head_dim, config.rope_base)  # [N, d/2] each, float64
    cos, sin = cos.astype(dtype), sin.astype(dtype)
    axis = 1 if config.rope_layout == "halves" else 2  # where the pair's two members sit
    cos2 = np.stack([cos, cos], axis=axis)[:, None]  # [N, 1, 2, d/2] or [N, 1, d/2, 2]
    sin2 = np.stack([-sin, sin], axis=axis)[:, None]  # first member gets -x2 sin, second +x1 sin
    return RopeTables(cos2, sin2, cos, sin)


def rotate(x, tables: RopeTables, layout: str):
    """RoPE of x [N, H, d] (a view is fine) with rope_tables' (cos, sin): x cos + swap(x) sin,
    where swap exchanges the two members of every pair (a view).  -> new [N, H, d]."""
    N, H, d = x.shape
    cos2, sin2 = tables.cos2, tables.sin2
    pairs = x.reshape(N, H, 2, d // 2) if layout == "halves" else x.reshape(N, H, d // 2, 2)
    swapped = pairs[:, :, ::-1] if layout == "halves" else pairs[..., ::-1]
    out = pairs * cos2  # [N, H, 2, d/2] (or [N, H, d/2, 2])
    out += swapped * sin2
    return out.reshape(N, H, d)


def rotates_heads(x, tables: RopeTables) -> bool:
    """Whether `rotate_heads(x, ...)` applies: numba installed, x C-contiguous float32 [N, ...]."""
    return (skinny.available() and x.dtype == tables.cos.dtype == np.float32 and x.ndim == 2
            and x.flags.c_contiguous and x.shape[0] == tables.cos.shape[0])


def rotate_heads(x, heads: int, tables: RopeTables, layout: str):
    """RoPE of the first `heads` heads of every row of x [N, >= heads*d] in place (a pass's fused
    q|k|v projection, where q and k lie first), in one compiled call (`_rope_rows`); see
    `rotates_heads`. The same rotation as `rotate`, one pair at a time.  -> x"""
    skinny.compiled(_rope_rows, parallel=False)(x, heads, tables.cos, tables.sin, layout == "halves")
    return x


def _rope_rows(x, heads, cos, sin, halves):  # pragma: no cover - runs compiled by numba
    """Rotate heads 0 .. heads-1 of every row n of x [N, ...] in place, by cos[n], sin[n] [d/2]:
    each pair (a, b) -> (a cos - b sin, b cos + a sin); the pairs are (i, i + d/2) ("halves")
    or (2i, 2i + 1)."""
    N, half = cos.shape
    d = 2 * half
    for n in range(N):
        c, s = cos[n], sin[n]
        for h in range(heads):
            y = x[n, h * d:(h + 1) * d]
            if halves:
                for i in range(half):
                    a, b = y[i], y[half + i]
                    y[i] = a * c[i] - b * s[i]
                    y[half + i] = b * c[i] + a * s[i]
            else:
                for i in range(half):
                    a, b = y[2 * i], y[2 * i + 1]
                    y[2 * i] = a * c[i] - b * s[i]
                    y[2 * i + 1] = b * c[i] + a * s[i]
