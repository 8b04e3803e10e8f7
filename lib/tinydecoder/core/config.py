"""The shapes of a decoder, in one place, checked when it is made."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .validate import ROPE_LAYOUTS, is_int

POSITION_SCHEMES = ("table", "rope")


@dataclass(frozen=True)
class Config:
    """Every shape of a decoder-only transformer.

    vocab_size   V     rows of the embedding table, columns of the logits
    d_model      D     width of the residual stream
    n_heads      Hq    query heads
    n_kv_heads   Hkv   key/value heads; query head h reads KV head h // (Hq // Hkv)
    head_dim     d     width of one head (Hq * d need not equal D)
    n_layers     L     decoder blocks
    d_ff         F     hidden width of the SwiGLU feed-forward
    max_context        longest sequence (past + new tokens) the model accepts
    position           "table": a learned/fixed table of position vectors added to the embedding;
                       "rope": rotary embeddings applied to q and k inside attention
    rope_base          base of the RoPE angles, theta_i = pos * base^(-2i/d)
    rope_layout        "halves": rotate (x[i], x[i + d/2]) (Hugging Face layout);
                       "interleaved": rotate (x[2i], x[2i+1]) (llama.cpp / Meta layout)
    norm_eps           epsilon inside RMSNorm's square root
    norm_scale         whether RMSNorm multiplies by a learned weight
    tied_embeddings    whether the output head is the embedding table transposed
    """

    vocab_size: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_layers: int
    d_ff: int
    max_context: int
    position: str = "table"
    rope_base: float = 10000.0
    rope_layout: str = "halves"
    norm_eps: float = 1e-6
    norm_scale: bool = True
    tied_embeddings: bool = False
    name: str = "decoder"

    def __post_init__(self):
        for field in ("vocab_size", "d_model", "n_heads", "n_kv_heads", "head_dim",
                      "n_layers", "d_ff", "max_context"):
            value = getattr(self, field)
            if not is_int(value) or value < 1:
                raise ValueError(f"Config.{field} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"Config.n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                f"({self.n_kv_heads}): each KV head serves the same number of query heads. "
                f"Allowed n_kv_heads here: {[h for h in range(1, self.n_heads + 1) if self.n_heads % h == 0]}")
        if self.position not in POSITION_SCHEMES:
            raise ValueError(f"Config.position must be one of {POSITION_SCHEMES}, got {self.position!r}")
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"Config.rope_layout must be one of {ROPE_LAYOUTS}, got {self.rope_layout!r}")
        if self.position == "rope":
            if self.head_dim % 2:
                raise ValueError(f"RoPE rotates pairs, so Config.head_dim must be even, got {self.head_dim}")
            if not self.rope_base > 1:
                raise ValueError(f"Config.rope_base must be > 1, got {self.rope_base!r}")
        if not self.norm_eps > 0:
            raise ValueError(f"Config.norm_eps must be > 0, got {self.norm_eps!r}")

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 = multi-head, n_heads = multi-query)."""
        return self.n_heads // self.n_kv_heads

    def kv_head_of(self, q_head: int) -> int:
        """The KV head that query head `q_head` reads."""
        return q_head // self.group_size

    def kv_bytes_per_token(self, itemsize: int = 4) -> int:
        """K and V, every layer, every KV head: 2 * L * Hkv * d * bytes."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * itemsize

    @property
    def q_width(self) -> int:
        """Columns of all query heads side by side: Hq * d."""
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Columns of all key (or value) heads side by side: Hkv * d."""
        return self.n_kv_heads * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)
