"""The model as data: a config, an embedding table, a list of layers' weights. No arithmetic
here: the reference forward pass is `reference.py`, the fast one `fast/forward_pass.py`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cache import KVCache
from .config import Config


@dataclass
class LayerWeights:
    """One block's weights, a projection being `x @ w` ([in, out]).

    Stored the way the checkpoint cache stores them: Q, K and V side by side in `w_qkv`, gate
    and up side by side in `w_gate_up`. The separate matrices (`wq`, `wk`, `wv`, `w_gate`,
    `w_up`) are column views split from them where they are used: one copy of every weight."""

    w_qkv: np.ndarray  # [D, Hq*d + 2*Hkv*d]
    wo: np.ndarray  # [Hq*d, D]
    w_gate_up: np.ndarray  # [D, 2F]
    w_down: np.ndarray  # [F, D]
    attn_norm: np.ndarray | None = None  # [D], when the config has norm_scale
    ffn_norm: np.ndarray | None = None  # [D]

    @classmethod
    def from_parts(cls, wq, wk, wv, wo, w_gate, w_up, w_down, attn_norm=None, ffn_norm=None):
        """Build a layer from separate matrices (copied side by side once)."""
        if np.shape(wk) != np.shape(wv):
            raise ValueError(f"wk {np.shape(wk)} and wv {np.shape(wv)} must have the same shape")
        if np.shape(w_gate) != np.shape(w_up):
            raise ValueError(f"w_gate {np.shape(w_gate)} and w_up {np.shape(w_up)} must have the same shape")
        return cls(w_qkv=np.concatenate([wq, wk, wv], axis=1), wo=wo,
                   w_gate_up=np.concatenate([w_gate, w_up], axis=1), w_down=w_down,
                   attn_norm=attn_norm, ffn_norm=ffn_norm)

    @property
    def wq(self) -> np.ndarray:  # [D, Hq*d]
        return self.w_qkv[:, :self.wo.shape[0]]

    @property
    def wk(self) -> np.ndarray:  # [D, Hkv*d]
        q_width = self.wo.shape[0]
        return self.w_qkv[:, q_width:q_width + (self.w_qkv.shape[1] - q_width) // 2]

    @property
    def wv(self) -> np.ndarray:  # [D, Hkv*d]
        q_width = self.wo.shape[0]
        return self.w_qkv[:, q_width + (self.w_qkv.shape[1] - q_width) // 2:]

    @property
    def w_gate(self) -> np.ndarray:  # [D, F]
        return self.w_gate_up[:, :self.w_down.shape[0]]

    @property
    def w_up(self) -> np.ndarray:  # [D, F]
        return self.w_gate_up[:, self.w_down.shape[0]:]

    def arrays(self) -> dict:
        """The stored arrays by name (each weight once)."""
        return {name: getattr(self, name) for name in
                ("w_qkv", "wo", "w_gate_up", "w_down", "attn_norm", "ffn_norm")}


@dataclass
class Model:
    config: Config
    embed: np.ndarray  # [V, D], a row per token id
    layers: list
    final_norm: np.ndarray | None = None  # [D]
    pos_table: np.ndarray | None = None  # [max_context, D] when config.position == "table"
    lm_head: np.ndarray | None = None  # [D, V]; the embedding transposed (a view) when tied

    def __post_init__(self):
        cfg = self.config
        if self.lm_head is None:
            if not cfg.tied_embeddings:
                raise ValueError("Model needs lm_head [D, V] unless config.tied_embeddings is True")
            self.lm_head = self.embed.T  # a view: no second copy of the table
        D, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
        expect = {"embed": (self.embed, (V, D)), "lm_head": (self.lm_head, (D, V))}
        if cfg.position == "table":
            expect["pos_table"] = (self.pos_table, (cfg.max_context, D))
        if cfg.norm_scale:
            expect["final_norm"] = (self.final_norm, (D,))
        if len(self.layers) != cfg.n_layers:
            raise ValueError(f"config says n_layers={cfg.n_layers} but {len(self.layers)} layers were given")
        for i, layer in enumerate(self.layers):
            shapes = {"w_qkv": (D, cfg.q_width + 2 * cfg.kv_width), "wo": (cfg.q_width, D),
                      "w_gate_up": (D, 2 * F), "w_down": (F, D)}
            if cfg.norm_scale:
                shapes.update(attn_norm=(D,), ffn_norm=(D,))
            for name, shape in shapes.items():
                expect[f"layers[{i}].{name}"] = (getattr(layer, name), shape)
        for name, (array, shape) in expect.items():
            if array is None or tuple(array.shape) != shape:
                got = None if array is None else tuple(array.shape)
                raise ValueError(f"weight {name} has shape {got}, but the config needs {shape}")

    @property
    def dtype(self):
        return self.embed.dtype

    def new_cache(self, capacity: int = 16) -> KVCache:
        return KVCache(self.config, self.dtype, capacity)

    def _weights(self) -> list:
        arrays = [self.embed, self.pos_table, self.final_norm]
        if not self.config.tied_embeddings:
            arrays.append(self.lm_head)
        for layer in self.layers:
            arrays += list(layer.arrays().values())
        return [a for a in arrays if a is not None]

    @property
    def n_params(self) -> int:
        return sum(a.size for a in self._weights())

    @property
    def nbytes(self) -> int:
        """Bytes of weights one forward pass reads (the tied head counted once; a quantised
        matrix, fast.compiled.quant_rows.QuantMatrix, counts its blocks' bytes)."""
        return sum(a.nbytes for a in self._weights())
