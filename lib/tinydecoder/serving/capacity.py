"""How much memory the KV cache takes, and how many requests fit in a budget.

Every new position stores one key and one value vector per KV head in every layer:

    bytes per token   = 2 (K and V) * n_layers * n_kv_heads * head_dim * bytes per number
    bytes per request = bytes per token * context            (contiguous: exactly the context)
                      = bytes per token * ceil(context / B) * B   (paged, blocks of B positions)
    requests that fit = floor(budget / bytes per request)

It is the KV head count that matters, not the query head count: with grouped-query attention
(Hkv < Hq) the cache is Hq / Hkv times smaller than a naive Hq product says.

    from tinydecoder.serving.capacity import kv_spec, KNOWN_CONFIGS
    spec = kv_spec(KNOWN_CONFIGS["Llama-2-7B"], "float16")   # a HF config.json dict, or a Config
    spec.bytes_per_token                                      # 524288 (= 512 KiB)
    spec.bytes_per_request(4096)                              # 2 GiB
    spec.requests_that_fit(40 * 2**30, 4096, block_size=16)   # 20
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.config import Config
from ..core.validate import is_real, positive_int

# Bytes per stored number. "fp8"/"int8": 8-bit KV caches; "q4": a 4-bit cache (half a byte).
DTYPE_BYTES = {
    "float64": 8, "fp64": 8, "double": 8,
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "float8": 1, "fp8": 1, "int8": 1,
    "q4": 0.5, "int4": 0.5,
}

# Published config.json fields (Hugging Face) of a few models, for tables and tests.
KNOWN_CONFIGS = {
    "SmolLM2-135M": {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                     "hidden_size": 576, "max_position_embeddings": 8192},
    "Llama-2-7B": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                   "hidden_size": 4096, "max_position_embeddings": 4096},
    "Llama-2-13B": {"num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40,
                    "hidden_size": 5120, "max_position_embeddings": 4096},
    "Llama-2-70B": {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                    "hidden_size": 8192, "max_position_embeddings": 4096},
    "Mistral-7B": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "hidden_size": 4096, "max_position_embeddings": 32768, "sliding_window": 4096},
}

# Where each shape in KNOWN_CONFIGS is published (papers and the Hugging Face model cards' config.json).
CONFIG_SOURCES = {
    "SmolLM2-135M": "HuggingFaceTB/SmolLM2-135M, config.json (Allal et al. 2025, SmolLM2)",
    # Llama 2's paper gives the context limit and which models use GQA (Table 1), not the shapes:
    # 7B and 13B have LLaMA-7B's and LLaMA-13B's (first LLaMA paper, Table 2), 70B's are in its config.json.
    "Llama-2-7B": "meta-llama/Llama-2-7b-hf, config.json (LLaMA-7B's shape: Touvron et al. 2023, "
                  "arXiv:2302.13971, Table 2); context 4k, no GQA: Llama 2, arXiv:2307.09288, Table 1",
    "Llama-2-13B": "meta-llama/Llama-2-13b-hf, config.json (LLaMA-13B's shape: Touvron et al. 2023, "
                   "arXiv:2302.13971, Table 2); context 4k, no GQA: Llama 2, arXiv:2307.09288, Table 1",
    "Llama-2-70B": "meta-llama/Llama-2-70b-hf, config.json; context 4k, GQA: Touvron et al. 2023, "
                   "Llama 2, arXiv:2307.09288, Table 1",
    "Mistral-7B": "Jiang et al. 2023, Mistral 7B (arXiv:2310.06825), Table 1 (window 4096); "
                  "mistralai/Mistral-7B-v0.1, config.json",
}

KIB, MIB, GIB = 2 ** 10, 2 ** 20, 2 ** 30


def bytes_per_element(dtype) -> float:
    """Bytes of one stored number: a name from DTYPE_BYTES, a numpy dtype, or a positive number."""
    if isinstance(dtype, bool):
        raise ValueError(f"dtype must be a name like 'float16', a numpy dtype or a byte count, got {dtype!r}")
    if isinstance(dtype, (int, float, np.integer, np.floating)):
        if not (math.isfinite(dtype) and dtype > 0):
            raise ValueError(f"bytes per element must be a positive number, got {dtype!r}")
        return float(dtype) if dtype != int(dtype) else int(dtype)
    if isinstance(dtype, str):
        key = dtype.lower().removeprefix("torch.")
        if key in DTYPE_BYTES:
            return DTYPE_BYTES[key]
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)} (or pass bytes per element)")
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)} (or pass bytes per element)") from None


def _positive_number(name, value):
    if not is_real(value) \
            or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return value


@dataclass(frozen=True)
class KVSpec:
    """The four numbers that set a KV cache's size (plus the query heads, for comparison)."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    bytes_per_element: float
    n_heads: int | None = None  # query heads (only for the naive, wrong, count)
    name: str = ""

    def __post_init__(self):
        for f in ("n_layers", "n_kv_heads", "head_dim"):
            positive_int(f, getattr(self, f))
        _positive_number("bytes_per_element", self.bytes_per_element)
        if self.n_heads is not None:
            positive_int("n_heads", self.n_heads)
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) * layers * KV heads * head_dim * bytes per number."""
        return _whole(2 * self.n_layers * self.n_kv_heads * self.head_dim * self.bytes_per_element)

    @property
    def naive_bytes_per_token(self) -> int:
        """The common mistake: counting query heads instead of KV heads (equal only for MHA)."""
        if self.n_heads is None:
            raise ValueError("this spec has no query head count (n_heads)")
        return _whole(2 * self.n_layers * self.n_heads * self.head_dim * self.bytes_per_element)

    def tokens_stored(self, context: int, block_size: int | None = None) -> int:
        """Positions a request of `context` tokens occupies: exact, or rounded up to whole blocks."""
        context = positive_int("context", context)
        if block_size is None:
            return context
        block_size = positive_int("block_size", block_size)
        return -(-context // block_size) * block_size

    def bytes_per_request(self, context: int, block_size: int | None = None) -> int:
        return _whole(self.tokens_stored(context, block_size) * self.bytes_per_token)

    def requests_that_fit(self, budget_bytes, context: int, block_size: int | None = None) -> int:
        """How many requests of `context` tokens fit in `budget_bytes` of KV memory."""
        _check_budget(budget_bytes)
        return int(budget_bytes // self.bytes_per_request(context, block_size))

    def tokens_that_fit(self, budget_bytes) -> int:
        _check_budget(budget_bytes)
        return int(budget_bytes // self.bytes_per_token)


def _whole(x):
    return int(x) if float(x).is_integer() else x


def _check_budget(budget_bytes):
    if not is_real(budget_bytes) \
            or not (math.isfinite(budget_bytes) and budget_bytes >= 0):
        raise ValueError(f"memory budget must be a number of bytes >= 0, got {budget_bytes!r}")


def kv_spec(source, dtype=None, name: str = "") -> KVSpec:
    """A KVSpec from a tinydecoder Config (dtype defaults to float32), a Hugging Face
    config.json dict (dtype defaults to its "torch_dtype"/"dtype" field), or a KVSpec."""
    if isinstance(source, KVSpec):
        return source if dtype is None else KVSpec(source.n_layers, source.n_kv_heads, source.head_dim,
                                                   bytes_per_element(dtype), source.n_heads, name or source.name)
    if isinstance(source, Config):
        return KVSpec(source.n_layers, source.n_kv_heads, source.head_dim,
                      bytes_per_element("float32" if dtype is None else dtype), source.n_heads,
                      name or source.name)
    if isinstance(source, dict):
        return _from_hf(source, dtype, name)
    raise TypeError(f"expected a Config, a Hugging Face config dict or a KVSpec, got {type(source).__name__}")


def _from_hf(cfg: dict, dtype, name: str) -> KVSpec:
    def need(key):
        if key not in cfg:
            raise ValueError(f"Hugging Face config is missing {key!r} (have: {sorted(cfg)})")
        return cfg[key]

    n_layers = positive_int("num_hidden_layers", need("num_hidden_layers"))
    n_heads = positive_int("num_attention_heads", need("num_attention_heads"))
    n_kv = cfg.get("num_key_value_heads")
    n_kv = n_heads if n_kv is None else positive_int("num_key_value_heads", n_kv)  # absent: MHA
    if cfg.get("head_dim") is not None:
        head_dim = positive_int("head_dim", cfg["head_dim"])
    else:
        hidden = positive_int("hidden_size", need("hidden_size"))
        if hidden % n_heads:
            raise ValueError(f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({n_heads}); "
                             f"the config must give head_dim")
        head_dim = hidden // n_heads
    if dtype is None:
        dtype = cfg.get("torch_dtype", cfg.get("dtype"))
        if dtype is None:
            raise ValueError("no dtype: pass dtype= (e.g. 'float16') or a config with 'torch_dtype'")
    return KVSpec(n_layers, n_kv, head_dim, bytes_per_element(dtype), n_heads, name)


def bytes_per_token(source, dtype=None) -> int:
    return kv_spec(source, dtype).bytes_per_token


def bytes_per_request(source, context: int, dtype=None, block_size: int | None = None) -> int:
    return kv_spec(source, dtype).bytes_per_request(context, block_size)


def requests_that_fit(source, budget_bytes, context: int, dtype=None, block_size: int | None = None) -> int:
    return kv_spec(source, dtype).requests_that_fit(budget_bytes, context, block_size)


def format_bytes(n) -> str:
    """Binary units, 3 significant digits: 46080 -> '45 KiB', 6710886400 -> '6.25 GiB'."""
    n = float(n)
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.3g} B"


def capacity_table(specs, context: int, budget_bytes, block_size: int | None = None) -> list:
    """One row (dict) per spec: its shape, bytes per token / request, requests that fit."""
    rows = []
    for spec in specs:
        rows.append({
            "model": spec.name, "layers": spec.n_layers, "q_heads": spec.n_heads, "kv_heads": spec.n_kv_heads,
            "head_dim": spec.head_dim, "bytes_per_elem": spec.bytes_per_element,
            "bytes_per_token": spec.bytes_per_token,
            "bytes_per_request": spec.bytes_per_request(context, block_size),
            "requests": spec.requests_that_fit(budget_bytes, context, block_size)})
    return rows


def capacity_for(n_layers: int, n_kv_heads: int, head_dim: int, dtype: str, context: int,
                 budget_gib: float, block_size: int | None = None) -> dict:
    """The capacity widget's numbers for given slider values (pure: the widget only prints)."""
    spec = KVSpec(n_layers, n_kv_heads, head_dim, bytes_per_element(dtype))
    budget = _positive_number("budget_gib", budget_gib) * GIB
    per_request = spec.bytes_per_request(context, block_size)
    return {"bytes_per_token": spec.bytes_per_token, "bytes_per_request": per_request,
            "requests": spec.requests_that_fit(budget, context, block_size),
            "tokens": spec.tokens_that_fit(budget), "budget_bytes": int(budget)}


def sliding_window_kv_bytes(source, context: int, window: int, dtype=None, block_size: int | None = None) -> int:
    """KV bytes of one request of `context` tokens when attention only looks back `window`
    positions (Mistral 7B's rolling buffer): the cache never holds more than `window` positions,
    so it is bytes_per_request(min(context, window))."""
    context, window = positive_int("context", context), positive_int("window", window)
    return kv_spec(source, dtype).bytes_per_request(min(context, window), block_size)
