"""Which slice of every weight a tensor-parallel rank holds (Megatron-LM's split of a Llama block).

With tp ranks, rank r holds:

    Q | K | V   columns of whole KV groups: KV heads [r*Hkv/tp, (r+1)*Hkv/tp) and the query heads
                that read them (column-parallel: no communication, attention stays local)
    Wo          the matching rows (row-parallel: a partial [S, D] on every rank -> all-reduce)
    gate | up   columns of hidden units [r*F/tp, (r+1)*F/tp) (column-parallel: SwiGLU is local)
    Wdown       the matching rows (row-parallel -> all-reduce)
    embedding   rows of tokens [r*V/tp, (r+1)*V/tp): a rank looks up the ids in its range, zeros
                for the others, and an all-reduce fills every row
    LM head     the same vocabulary columns: a rank computes its slice of the logits, gathered
                to rank 0
    norms, the position table: replicated (a few KB)

Every slice is a view of the model's arrays, for SmolLM2 memory-mapped from the weight cache,
so a rank reads only its shard's bytes and nothing is copied. (A column slice of a row-major
matrix is strided: the rank's matmuls read only its columns, but the 4 KB pages the operating
system maps for them also hold neighbouring ranks' columns. Wo's rows and the embedding's rows are
contiguous; Wdown is stored column-major, so its row slice is strided too.) Its KV cache holds
its own KV heads only: a KVCache made for `local_config` (the shard's head counts).

tp must divide Hkv (whole KV groups; Hq is a multiple of Hkv, so whole query heads follow),
F and V (equal shards: every rank's all-reduce and gather buffers have one shape)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..core.config import Config
from ..core.model import Model
from ..core.validate import is_int


def divided_shapes(config: Config) -> dict:
    """The counts a tensor-parallel degree must divide, by name."""
    return {"query heads": config.n_heads, "KV heads": config.n_kv_heads, "FFN units": config.d_ff,
            "vocabulary rows": config.vocab_size}


def allowed_degrees(config: Config) -> list:
    """Every tp that divides all of `divided_shapes` (1 always does)."""
    return [t for t in range(1, config.n_kv_heads + 1) if all(n % t == 0 for n in divided_shapes(config).values())]


def check_degree(config: Config, tp) -> int:
    """tp as an int; a ValueError naming what it does not divide and the degrees allowed."""
    if not is_int(tp):
        raise TypeError(f"the tensor-parallel degree must be an integer, got {type(tp).__name__}")
    if tp < 1:
        raise ValueError(f"the tensor-parallel degree must be >= 1, got {tp}")
    bad = [f"{value} {name}" for name, value in divided_shapes(config).items() if value % tp]
    if bad:
        raise ValueError(f"tensor-parallel degree {tp} does not divide {', '.join(bad)} of {config.name}: every rank "
                         f"needs whole KV groups and equal shards. Allowed degrees: {allowed_degrees(config)}")
    return int(tp)


def local_config(config: Config, tp: int) -> Config:
    """The shapes one rank sees: Hq/tp query heads, Hkv/tp KV heads, F/tp units, V/tp rows."""
    check_degree(config, tp)
    return dataclasses.replace(config, n_heads=config.n_heads // tp, n_kv_heads=config.n_kv_heads // tp,
                               d_ff=config.d_ff // tp, vocab_size=config.vocab_size // tp,
                               name=f"{config.name} (1/{tp} shard)")


@dataclass
class LayerShard:
    wq: np.ndarray  # [D, Hq/tp * d]   views of the full layer's arrays
    wk: np.ndarray  # [D, Hkv/tp * d]
    wv: np.ndarray  # [D, Hkv/tp * d]
    wo: np.ndarray  # [Hq/tp * d, D]
    w_gate: np.ndarray  # [D, F/tp]
    w_up: np.ndarray  # [D, F/tp]
    w_down: np.ndarray  # [F/tp, D]
    attn_norm: np.ndarray | None
    ffn_norm: np.ndarray | None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.wq, self.wk, self.wv, self.wo, self.w_gate, self.w_up, self.w_down,
                                      self.attn_norm, self.ffn_norm) if a is not None)


@dataclass
class ModelShard:
    """Rank `rank`'s weights out of `tp`: views, nothing copied."""

    config: Config  # the whole model's
    local: Config  # this shard's head, unit and vocabulary counts
    rank: int
    tp: int
    embed: np.ndarray  # [V/tp, D] the rows of tokens vocab[0] .. vocab[1]-1
    lm_head: np.ndarray  # [D, V/tp]
    layers: list
    final_norm: np.ndarray | None
    pos_table: np.ndarray | None

    @property
    def vocab(self) -> tuple:
        """The token ids whose rows this rank holds: [start, stop)."""
        n = self.local.vocab_size
        return self.rank * n, (self.rank + 1) * n

    @property
    def nbytes(self) -> int:
        """Weight bytes this rank reads per forward pass (its embedding rows only by lookup; the tied
        head counted once, as Model.nbytes does)."""
        own = [self.embed, self.final_norm, self.pos_table]
        if not self.config.tied_embeddings:
            own.append(self.lm_head)
        return sum(a.nbytes for a in own if a is not None) + sum(layer.nbytes for layer in self.layers)


def shard_layer(layer, config: Config, rank: int, tp: int) -> LayerShard:
    d, Hq, Hkv, F = config.head_dim, config.n_heads, config.n_kv_heads, config.d_ff
    q = slice(rank * Hq // tp * d, (rank + 1) * Hq // tp * d)  # whole query heads of whole groups
    kv = slice(rank * Hkv // tp * d, (rank + 1) * Hkv // tp * d)
    f = slice(rank * F // tp, (rank + 1) * F // tp)
    return LayerShard(wq=layer.wq[:, q], wk=layer.wk[:, kv], wv=layer.wv[:, kv], wo=layer.wo[q],
                      w_gate=layer.w_gate[:, f], w_up=layer.w_up[:, f], w_down=layer.w_down[f],
                      attn_norm=layer.attn_norm, ffn_norm=layer.ffn_norm)


def shard_model(model: Model, rank: int, tp: int) -> ModelShard:
    """Rank `rank` of `tp`'s shard of `model` (views of its arrays)."""
    cfg = model.config
    tp = check_degree(cfg, tp)
    if not isinstance(rank, (int, np.integer)) or not 0 <= rank < tp:
        raise ValueError(f"rank must be an integer in 0..{tp - 1}, got {rank!r}")
    local = local_config(cfg, tp)
    v = slice(rank * local.vocab_size, (rank + 1) * local.vocab_size)
    return ModelShard(config=cfg, local=local, rank=int(rank), tp=tp, embed=model.embed[v],
                      lm_head=model.lm_head[:, v], layers=[shard_layer(w, cfg, rank, tp) for w in model.layers],
                      final_norm=model.final_norm, pos_table=model.pos_table)
