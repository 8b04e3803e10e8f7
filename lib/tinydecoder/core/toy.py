"""The toy decoder of the worked example, weight for weight.

D=8, 2 query heads sharing 1 KV head of width 4, 2 layers, FFN 16, vocab 6, a 64-row
position table, RMSNorm (eps 1e-6) without a learned scale, no RoPE, untied output head.
Weights come from random.Random(7).uniform(-0.2, 0.2), drawn row by row in the order:
embedding 6x8, positions 64x8, then per layer q 8x8, k 8x4, v 8x4, out 8x8, gate 8x16,
up 8x16, down 16x8, and last the output head 8x6. Greedy on [0, 1, 2, 3] gives [3, 2, 0, 4].
"""
from __future__ import annotations

import random

import numpy as np

from .config import Config
from .model import LayerWeights, Model

SEED_PROMPT = [0, 1, 2, 3]
SEED_CONTINUATION = [3, 2, 0, 4]


def toy_config() -> Config:
    return Config(vocab_size=6, d_model=8, n_heads=2, n_kv_heads=1, head_dim=4, n_layers=2,
                  d_ff=16, max_context=64, position="table", norm_eps=1e-6, norm_scale=False,
                  tied_embeddings=False, name="seed-000-toy")


def toy_model(seed: int = 7, dtype=np.float64) -> Model:
    """The seed's model; float64 reproduces its pure-Python logits to ~1e-15."""
    rng = random.Random(seed)

    def draw(rows, cols):
        return np.array([[rng.uniform(-0.2, 0.2) for _ in range(cols)] for _ in range(rows)], dtype=dtype)

    cfg = toy_config()
    embed = draw(cfg.vocab_size, cfg.d_model)
    pos_table = draw(cfg.max_context, cfg.d_model)
    layers = [LayerWeights.from_parts(wq=draw(8, 8), wk=draw(8, 4), wv=draw(8, 4), wo=draw(8, 8),  # drawn in this order
                           w_gate=draw(8, 16), w_up=draw(8, 16), w_down=draw(16, 8))
              for _ in range(cfg.n_layers)]
    lm_head = draw(cfg.d_model, cfg.vocab_size)
    return Model(cfg, embed=embed, layers=layers, pos_table=pos_table, lm_head=lm_head)


def random_model(config: Config, seed: int = 0, dtype=np.float32, scale: float = 0.2) -> Model:
    """A model of any config with uniform(-scale, scale) weights from np.random.default_rng(seed);
    norm weights (when the config has them) are 1 + small noise. For tests and experiments."""
    rng = np.random.default_rng(seed)
    D, F, V = config.d_model, config.d_ff, config.vocab_size
    q_width, kv_width = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim

    def draw(*shape):
        return rng.uniform(-scale, scale, size=shape).astype(dtype)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(D)).astype(dtype) if config.norm_scale else None

    embed = draw(V, D)
    pos_table = draw(config.max_context, D) if config.position == "table" else None
    layers = [LayerWeights.from_parts(wq=draw(D, q_width), wk=draw(D, kv_width), wv=draw(D, kv_width),
                           wo=draw(q_width, D), w_gate=draw(D, F), w_up=draw(D, F), w_down=draw(F, D),
                           attn_norm=norm(), ffn_norm=norm())
              for _ in range(config.n_layers)]
    lm_head = None if config.tied_embeddings else draw(D, V)
    return Model(config, embed=embed, layers=layers, final_norm=norm(), pos_table=pos_table, lm_head=lm_head)
