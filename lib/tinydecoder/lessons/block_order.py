"""the walk-through's decoder block, for notebook 03 to refute: `LayerNorm(attn_output + ffn_output)`.

Compared with the pre-norm block that every Llama-style model runs (`core.model.decoder_block`),
the seed's block is wrong in three ways at once:
- post-norm: the input is not normalised before attention, the sum is normalised after;
- no output projection: the concatenated heads are used as they come out of attention (W_o unused);
- no residual: the block's input x is never added back, so the stream forgets it.
The norm here is the model's RMSNorm without a gain, so that only the order differs. Prefill
only (no cache), for models with a position table; never use it for anything but the lesson.
"""
from __future__ import annotations

import numpy as np

from ..core.model import LayerWeights, Model
from ..core.ops import attention, rmsnorm, swiglu
from ..core.reference import embed_tokens
from ..core.validate import check_token_ids


def _check_fits(config) -> None:
    if config.position != "table":
        raise ValueError(f"walkthrough_block is for models with a position table, got position={config.position!r}")
    if config.n_heads * config.head_dim != config.d_model:
        raise ValueError("the walk-through's block feeds attention's concatenated heads straight into the FFN, which "
                         f"needs n_heads * head_dim == d_model; got {config.n_heads} * {config.head_dim} "
                         f"!= {config.d_model}")


def walkthrough_block(layer: LayerWeights, x, config) -> np.ndarray:
    """x [S, D] -> LayerNorm(attn + FFN(attn)) [S, D], the seed's order (no W_o, no residual)."""
    _check_fits(config)
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != config.d_model:
        raise ValueError(f"x must have shape [S, {config.d_model}], got {x.shape}")
    S, Hq, Hkv, d = x.shape[0], config.n_heads, config.n_kv_heads, config.head_dim
    q = (x @ layer.wq).reshape(S, Hq, d)  # no norm before: [S, Hq, d]
    k = (x @ layer.wk).reshape(S, Hkv, d)  # [S, Hkv, d]
    v = (x @ layer.wv).reshape(S, Hkv, d)  # [S, Hkv, d]
    attn_output = attention(q, k, v)  # [S, Hq*d], W_o never applied
    ffn_output = swiglu(attn_output, layer.w_gate, layer.w_up) @ layer.w_down  # [S, D]
    return rmsnorm(attn_output + ffn_output, None, config.norm_eps)  # x itself is gone


def walkthrough_logits(model: Model, token_ids) -> np.ndarray:
    """Logits [S, V] of a prefill whose every block is `walkthrough_block`."""
    cfg = model.config
    _check_fits(cfg)
    ids = check_token_ids(cfg, token_ids)
    x = embed_tokens(model, ids, np.arange(len(ids)))  # [S, D]
    for layer in model.layers:
        x = walkthrough_block(layer, x, cfg)
    return rmsnorm(x, model.final_norm, cfg.norm_eps) @ model.lm_head  # [S, V]
