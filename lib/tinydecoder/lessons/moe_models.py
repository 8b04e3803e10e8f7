"""The shape of real mixture-of-experts models, from their published configs.

Mixtral 8x7B (Jiang et al., "Mixtral of Experts", arXiv:2401.04088): every FFN is 8 experts
of the full width (14,336 hidden units), each token takes the top 2.
DeepSeekMoE 16B (Dai et al., "DeepSeekMoE: Towards Ultimate Expert Specialization in
Mixture-of-Experts Language Models", arXiv:2401.06066): fine-grained experts (64 routed
experts of 1,408 units, 6 per token) plus 2 shared experts every token goes through; the
first layer keeps a dense FFN.

`param_counts` counts parameters from these numbers alone (embedding, attention, FFN or
experts, router; the norms' few thousand are left out) so that a table can be computed, and
checked against the totals the papers publish (46.7B / 12.9B active; 16.4B / 2.8B active).
"""
from __future__ import annotations

from dataclasses import dataclass

SOURCES = {
    "Mixtral 8x7B": "https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json; arXiv:2401.04088",
    "DeepSeekMoE 16B": "https://huggingface.co/deepseek-ai/deepseek-moe-16b-base/blob/main/config.json; "
                       "arXiv:2401.06066",
}


@dataclass(frozen=True)
class MoEShape:
    name: str
    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    expert_units: int  # hidden units of one expert
    n_routed: int  # experts the router chooses from
    k: int  # routed experts per token
    n_shared: int = 0  # experts every token goes through
    dense_layers: int = 0  # first layers with a dense FFN instead of experts
    dense_units: int = 0  # that dense FFN's hidden units
    tied: bool = False  # output head = embedding


MIXTRAL_8X7B = MoEShape("Mixtral 8x7B", vocab=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                        head_dim=128, expert_units=14336, n_routed=8, k=2)
DEEPSEEKMOE_16B = MoEShape("DeepSeekMoE 16B", vocab=102400, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=16,
                           head_dim=128, expert_units=1408, n_routed=64, k=6, n_shared=2, dense_layers=1,
                           dense_units=10944)
PUBLISHED = {"Mixtral 8x7B": (46.7e9, 12.9e9), "DeepSeekMoE 16B": (16.4e9, 2.8e9)}  # total, active per token


def param_counts(s: MoEShape) -> dict:
    """Parameters in total and per token (active), and the FFN's share of each."""
    embed = s.vocab * s.d_model * (1 if s.tied else 2)
    attention = s.d_model * (s.n_heads + 2 * s.n_kv_heads) * s.head_dim + s.n_heads * s.head_dim * s.d_model
    expert = 3 * s.d_model * s.expert_units  # gate, up, down
    moe_layers = s.n_layers - s.dense_layers
    dense_ffn = s.dense_layers * 3 * s.d_model * s.dense_units
    router = moe_layers * s.d_model * s.n_routed
    ffn_total = dense_ffn + router + moe_layers * (s.n_routed + s.n_shared) * expert
    ffn_active = dense_ffn + router + moe_layers * (s.k + s.n_shared) * expert
    fixed = embed + s.n_layers * attention
    return {"total": fixed + ffn_total, "active": fixed + ffn_active, "ffn_total": ffn_total,
            "ffn_active": ffn_active, "expert": expert,
            "experts_per_token": f"{s.n_shared} shared + {s.k} of {s.n_routed}" if s.n_shared
            else f"{s.k} of {s.n_routed}"}
