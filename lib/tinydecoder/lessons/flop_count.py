"""FLOPs of a prefill from a model's shape alone, op by op (notebook 06).

`prefill_flops(config, S)` gives the FLOP counts a `Trace` records for `forward(model, ids)`
on an S-token prompt, without weights: so the saving of `last_only=True` can be computed for
SmolLM2-135M's published shape on a laptop. The same 2*M*K*N rule as `Trace.matmul`,
attention as `phases.attention_flops`; elementwise ops (norms, RoPE, SwiGLU) count 0 there
and here. The unit tests check every count against a real trace.
"""
from __future__ import annotations

from ..core.config import Config
from ..core.validate import positive_int
from .phases import attention_flops

LAYER_OPS = ("q_proj", "k_proj", "v_proj", "attention", "o_proj", "ffn_gate", "ffn_up", "ffn_down")


def prefill_flops(config: Config, n_tokens: int, *, last_only: bool = False) -> dict:
    """(layer, op) -> FLOPs of one prefill of `n_tokens` positions; the LM head is (None, "lm_head").

    last_only=True is `forward(..., last_only=True)`: the last layer computes queries, attention,
    output projection and FFN for the last position only (its K/V still for all positions),
    and the LM head runs on one row."""
    if not isinstance(config, Config):
        raise ValueError(f"config must be a tinydecoder Config, got {type(config).__name__}")
    S = positive_int("n_tokens", n_tokens)
    D, F, V = config.d_model, config.d_ff, config.vocab_size
    q_width, kv_width = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    flops = {}
    for layer in range(config.n_layers):
        rows = 1 if last_only and layer == config.n_layers - 1 else S  # rows past the K/V projections
        flops[(layer, "q_proj")] = 2 * rows * D * q_width
        flops[(layer, "k_proj")] = 2 * S * D * kv_width  # the cache needs every position's K/V
        flops[(layer, "v_proj")] = 2 * S * D * kv_width
        flops[(layer, "attention")] = attention_flops(1, config.n_heads, rows, S, config.head_dim)
        flops[(layer, "o_proj")] = 2 * rows * q_width * D
        flops[(layer, "ffn_gate")] = 2 * rows * D * F
        flops[(layer, "ffn_up")] = 2 * rows * D * F
        flops[(layer, "ffn_down")] = 2 * rows * F * D
    flops[(None, "lm_head")] = 2 * (1 if last_only else S) * D * V
    return flops


def last_only_saving(config: Config, n_tokens: int) -> dict:
    """What `last_only=True` saves on an `n_tokens` prefill: {"full", "last_only", "saved"
    (total FLOPs), "lm_head_saved", "last_layer_saved" (the rest: the last block's rows),
    "lm_head_share" (lm_head_saved / saved; 0 when nothing is saved, i.e. n_tokens == 1)}."""
    full = prefill_flops(config, n_tokens)
    lean = prefill_flops(config, n_tokens, last_only=True)
    saved = sum(full.values()) - sum(lean.values())
    head = full[(None, "lm_head")] - lean[(None, "lm_head")]
    return {"full": sum(full.values()), "last_only": sum(lean.values()), "saved": saved,
            "lm_head_saved": head, "last_layer_saved": saved - head,
            "lm_head_share": head / saved if saved else 0.0}
