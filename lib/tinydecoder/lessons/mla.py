"""A toy multi-head latent attention (MLA, DeepSeek-V2), and KV-cache sizes of MHA/GQA/MQA/MLA.

MLA caches, per token and layer, one latent vector c = x W_DKV of d_c numbers instead of the
keys and values of every head. Each head rebuilds its key and value from it:

    c = x W_DKV                  # [T, d_c]      cached
    k_h = c W_UK[h],  v_h = c W_UV[h]          # [T, d] each, never cached
    k_rope = rope(x W_KR)        # [T, d_R]      cached: one decoupled RoPE key shared by all heads
    score_h(i, j) = (q_h(i) . k_h(j) + rope(q_rope_h(i)) . k_rope(j)) / sqrt(d + d_R)

Because k_h = c W_UK[h] is linear in c, q_h . k_h = (q_h W_UK[h]^T) . c: W_UK can be folded into
the query ("absorbed"), and W_UV likewise into the output projection, so attention runs on the
cached latents directly. RoPE would break that fold: a rotation R(j) that depends on the key's
position sits between W_UK and c (k_h = R(j) c W_UK[h]) and cannot be moved into the query once
for all positions. Hence the positional part travels in a separate, small key k_rope.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.ops import apply_rope, causal_mask, softmax
from ..core.validate import is_int

DEEPSEEK_V2 = {"n_heads": 128, "head_dim": 128, "d_latent": 512, "d_rope": 64, "n_layers": 60}
"""DeepSeek-V2's attention shapes (paper, section 2.1 and Table 1): n_h, d_h, d_c = 4 d_h,
d_h^R = d_h / 2, 60 layers."""


@dataclass
class MLAWeights:
    """One MLA layer (queries not compressed, to keep the toy small).

    w_q [D, H*d], w_q_rope [D, H*d_R], w_dkv [D, d_c], w_uk [d_c, H*d], w_uv [d_c, H*d],
    w_k_rope [D, d_R], w_o [H*d, D]."""

    n_heads: int
    head_dim: int
    w_q: np.ndarray
    w_q_rope: np.ndarray
    w_dkv: np.ndarray
    w_uk: np.ndarray
    w_uv: np.ndarray
    w_k_rope: np.ndarray
    w_o: np.ndarray
    rope_base: float = 10000.0

    @property
    def d_latent(self) -> int:
        return self.w_dkv.shape[1]

    @property
    def d_rope(self) -> int:
        return self.w_k_rope.shape[1]


def random_mla(d_model=32, n_heads=4, head_dim=8, d_latent=16, d_rope=4, seed=0, dtype=np.float64):
    """An MLA layer with random weights (scaled 1/sqrt(fan-in))."""
    for name, value in {"d_model": d_model, "n_heads": n_heads, "head_dim": head_dim,
                        "d_latent": d_latent, "d_rope": d_rope}.items():
        if not is_int(value) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if d_rope % 2:
        raise ValueError(f"RoPE rotates pairs, so d_rope must be even, got {d_rope}")
    rng = np.random.default_rng(seed)

    def w(rows, cols):
        return (rng.standard_normal((rows, cols)) / math.sqrt(rows)).astype(dtype)

    H, d = n_heads, head_dim
    return MLAWeights(H, d, w_q=w(d_model, H * d), w_q_rope=w(d_model, H * d_rope),
                      w_dkv=w(d_model, d_latent), w_uk=w(d_latent, H * d), w_uv=w(d_latent, H * d),
                      w_k_rope=w(d_model, d_rope), w_o=w(H * d, d_model))


@dataclass
class MLACache:
    """What MLA caches per position: the latent c [T, d_c] and the RoPE key [T, d_R]."""

    latent: np.ndarray
    k_rope: np.ndarray

    def __len__(self) -> int:
        return self.latent.shape[0]

    @property
    def elements_per_token(self) -> int:
        return self.latent.shape[1] + self.k_rope.shape[1]


def _project(w: MLAWeights, x, cache):
    """Queries of the new rows and the cache extended by them.  x: [S, D]."""
    S, past = x.shape[0], 0 if cache is None else len(cache)
    positions = past + np.arange(S)
    H, d, dR = w.n_heads, w.head_dim, w.d_rope
    q = (x @ w.w_q).reshape(S, H, d)  # [S, H, d]
    q_rope = apply_rope((x @ w.w_q_rope).reshape(S, H, dR), positions, w.rope_base)  # [S, H, d_R]
    latent = x @ w.w_dkv  # [S, d_c]
    k_rope = apply_rope((x @ w.w_k_rope).reshape(S, 1, dR), positions, w.rope_base)[:, 0]  # [S, d_R]
    if cache is not None:
        latent = np.concatenate([cache.latent, latent])  # [T, d_c]
        k_rope = np.concatenate([cache.k_rope, k_rope])  # [T, d_R]
    return q, q_rope, MLACache(latent, k_rope)


def _weights(w, content_scores, q_rope, k_rope):
    """Softmax of (content + RoPE scores) / sqrt(d + d_R), causal.  -> [H, S, T]"""
    _, S, T = content_scores.shape  # [H, S, T]
    scores = content_scores + np.einsum("shr,tr->hst", q_rope, k_rope)
    scores = scores * scores.dtype.type(1 / math.sqrt(w.head_dim + w.d_rope))
    return softmax(scores + causal_mask(S, T, scores.dtype))


def mla_attention(w: MLAWeights, x, cache: MLACache | None = None):
    """Unabsorbed MLA: rebuild every head's K and V from the cached latents.
    x: [S, D] new rows after the cache's T - S.  -> (out [S, D], the extended cache)"""
    q, q_rope, cache = _project(w, x, cache)
    T, H, d = len(cache), w.n_heads, w.head_dim
    k = (cache.latent @ w.w_uk).reshape(T, H, d)  # [T, H, d]
    v = (cache.latent @ w.w_uv).reshape(T, H, d)  # [T, H, d]
    weights = _weights(w, np.einsum("shd,thd->hst", q, k), q_rope, cache.k_rope)  # [H, S, T]
    heads = np.einsum("hst,thd->shd", weights, v)  # [S, H, d]
    return heads.reshape(len(x), H * d) @ w.w_o, cache


def absorbed_weights(w: MLAWeights):
    """W_UK per head as [H, d, d_c] (to fold into the query) and W_UV W_O per head [H, d_c, D]."""
    H, d, dc = w.n_heads, w.head_dim, w.d_latent
    w_uk = w.w_uk.reshape(dc, H, d).transpose(1, 2, 0)  # [H, d, d_c]
    w_uv = w.w_uv.reshape(dc, H, d).transpose(1, 0, 2)  # [H, d_c, d]
    w_o = w.w_o.reshape(H, d, -1)  # [H, d, D]
    return w_uk, w_uv @ w_o  # [H, d, d_c], [H, d_c, D]


def mla_attention_absorbed(w: MLAWeights, x, cache: MLACache | None = None):
    """Absorbed MLA: queries map into latent space (q W_UK^T), attention reads the latents
    directly, and W_UV W_O maps each head's latent mix to the output. No K or V is built."""
    q, q_rope, cache = _project(w, x, cache)
    w_uk, w_uvo = absorbed_weights(w)
    q_latent = np.einsum("shd,hdc->shc", q, w_uk)  # [S, H, d_c]
    weights = _weights(w, np.einsum("shc,tc->hst", q_latent, cache.latent), q_rope, cache.k_rope)
    mixed = weights @ cache.latent  # [H, S, d_c]: each head's weighted latents
    return np.einsum("hsc,hcD->sD", mixed, w_uvo), cache


def cache_elements_per_token(kind: str, n_heads: int, head_dim: int, n_layers: int, *,
                             n_groups: int | None = None, d_latent: int | None = None,
                             d_rope: int | None = None) -> int:
    """Numbers cached per token over all layers (DeepSeek-V2, Table 1):
    MHA 2 n_h d_h l, GQA 2 n_g d_h l, MQA 2 d_h l, MLA (d_c + d_h^R) l."""
    if kind == "MHA":
        return 2 * n_heads * head_dim * n_layers
    if kind == "GQA":
        if n_groups is None or n_groups < 1 or n_heads % n_groups:
            raise ValueError(f"GQA needs n_groups (KV heads) dividing n_heads={n_heads}, got {n_groups!r}")
        return 2 * n_groups * head_dim * n_layers
    if kind == "MQA":
        return 2 * head_dim * n_layers
    if kind == "MLA":
        if d_latent is None or d_rope is None:
            raise ValueError("MLA needs d_latent (d_c) and d_rope (d_h^R)")
        return (d_latent + d_rope) * n_layers
    raise ValueError(f"kind must be one of 'MHA', 'GQA', 'MQA', 'MLA', got {kind!r}")


def cache_table(n_heads: int, head_dim: int, n_layers: int, n_groups: int, d_latent: int, d_rope: int) -> list:
    """MHA / GQA / MQA / MLA side by side: kind, elements per token, fraction of MHA's, and the
    GQA group count that would cache as much (elements / (2 d_h l))."""
    mha = cache_elements_per_token("MHA", n_heads, head_dim, n_layers)
    rows = []
    for kind in ("MHA", "GQA", "MQA", "MLA"):
        n = cache_elements_per_token(kind, n_heads, head_dim, n_layers, n_groups=n_groups,
                                     d_latent=d_latent, d_rope=d_rope)
        rows.append({"kind": kind, "elements_per_token": n, "fraction_of_mha": n / mha,
                     "equivalent_groups": n / (2 * head_dim * n_layers)})
    return rows
