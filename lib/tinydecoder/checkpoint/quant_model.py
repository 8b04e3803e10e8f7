"""A Llama GGUF file's model with its matrices left as the file's own quantised blocks.

`load_gguf_model` dequantises every weight to float32 (a ~540 MB cache for SmolLM2); this one
keeps each Q4_1 / Q8_0 matrix as a `fast.compiled.quant_rows.QuantMatrix`, a view of the memory-mapped
file's bytes, and the fast path multiplies by the blocks in place (~100 MB read per decode
step instead of ~540 MB). The weights are the same numbers: the float32 cache holds exactly the
dequantised blocks, so the two models differ only by the order of float32 sums. A decode step's
products read each Q4_1 matrix in bit planes instead (`fast.compiled.quant_planes`: the same
numbers in another order, 66 MB for SmolLM2's layers, made from the blocks as the model loads,
39 ms, where numba and AVX-512 let them apply); a pass over 3 or 4 rows reads each Q4_1 block's d
and m as float32 (`quant_rows.scales`: 27 MB, made on the first such pass, 24 ms).

Laid out as `weights.py` lays the float32 model: Q, K and V fused into one [D, (Hq + 2Hkv) d]
matrix and gate and up into one [D, 2F] (here as parts of a QuantMatrix, nothing copied); Q's
and K's rows keep the file's order and write their outputs to Hugging Face's ("halves", see
gguf_file.py), so the model is the `rope_layout="halves"` one. The embedding is the table view of
`token_embd` (a lookup dequantises just those rows); the tied head is its transpose. The norms
(F32 in the file) are float32 arrays. The reference forward pass (`core.reference.forward`) works too: it
dequantises each matrix where it multiplies (`QuantMatrix.__array__`), slowly.
"""
from __future__ import annotations

import numpy as np

from ..core.model import LayerWeights, Model
from ..fast.compiled import quant_planes
from ..fast.compiled.quant_rows import BLOCK_BYTES, QuantMatrix
from .gguf_file import (
    UnsupportedModelError,
    check_tensors,
    config_from_gguf,
    dequantize_tensor,
    open_gguf,
    tensor_map,
    verify_sha256,
)


def halves_columns(n_heads: int, head_dim: int) -> np.ndarray:
    """Where each of the file's Q (or K) rows goes in the Hugging Face order: file row h*d + 2i + j
    is HF row h*d + j*d/2 + i (`gguf_file.unpermute_qk` applied to row numbers)."""
    g = np.arange(n_heads * head_dim)
    h, rest = g // head_dim, g % head_dim
    return h * head_dim + (rest % 2) * (head_dim // 2) + rest // 2


def _blocks(tensor):
    """(raw [out, bytes] uint8 view of the file, kind, K) of a Q4_1 / Q8_0 matrix."""
    kind = tensor.tensor_type.name
    if kind not in BLOCK_BYTES:
        raise UnsupportedModelError(f"tensor {tensor.name!r} is {kind}; quantised loading reads Q4_1 and Q8_0 "
                                    f"matrices (use weights='f32' for this file)")
    K, rows = (int(n) for n in tensor.shape)  # GGUF lists [in, out]
    return np.asarray(tensor.data).reshape(rows, -1), kind, K


def _matrix(tensors, names_cols) -> QuantMatrix:
    """One QuantMatrix from tensors (name, column offset, column map or None), fused side by side."""
    parts, kinds, Ks = [], set(), set()
    for name, offset, cols in names_cols:
        raw, kind, K = _blocks(tensors[name])
        parts.append((raw, offset + (np.arange(raw.shape[0]) if cols is None else cols)))
        kinds.add(kind)
        Ks.add(K)
    if len(kinds) != 1:
        raise UnsupportedModelError(f"fused tensors {[n for n, _, _ in names_cols]} mix block types {sorted(kinds)}")
    return QuantMatrix(parts, kinds.pop(), Ks.pop())


def _vector(tensor) -> np.ndarray:
    return np.ascontiguousarray(dequantize_tensor(tensor), np.float32)


def load_quantized_model(path, *, expected_sha256: str | None = None, name: str | None = None) -> Model:
    """The Model of a Llama GGUF file whose matrices are its Q4_1 / Q8_0 blocks, read in place
    (module docstring). Raises as `load_gguf_model` does, and UnsupportedModelError for a matrix
    stored in another type."""
    verify_sha256(path, expected_sha256)
    reader = open_gguf(path, keep=False)  # the matrices keep only the file's memory map, not the parsed metadata
    cfg = config_from_gguf(reader, name=name, rope_layout="halves")
    check_tensors(reader, cfg)
    t = tensor_map(reader)
    Hq, Hkv, d, F = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    q_cols, k_cols = halves_columns(Hq, d), halves_columns(Hkv, d)
    layers = []
    for l in range(cfg.n_layers):
        b = f"blk.{l}."
        layers.append(LayerWeights(
            w_qkv=_matrix(t, [(b + "attn_q.weight", 0, q_cols), (b + "attn_k.weight", Hq * d, k_cols),
                              (b + "attn_v.weight", (Hq + Hkv) * d, None)]),
            wo=_matrix(t, [(b + "attn_output.weight", 0, None)]),
            w_gate_up=_matrix(t, [(b + "ffn_gate.weight", 0, None), (b + "ffn_up.weight", F, None)]),
            w_down=_matrix(t, [(b + "ffn_down.weight", 0, None)]),
            attn_norm=_vector(t[b + "attn_norm.weight"]), ffn_norm=_vector(t[b + "ffn_norm.weight"])))
        for w in (layers[-1].w_qkv, layers[-1].wo, layers[-1].w_gate_up, layers[-1].w_down):
            quant_planes.planes(w)  # a decode step's bit planes, made now rather than in the first step (where they apply)
    embed = _matrix(t, [("token_embd.weight", 0, None)]).T  # [V, D]: rows dequantise on lookup
    head = None if cfg.tied_embeddings else _matrix(t, [("output.weight", 0, None)])
    return Model(cfg, embed=embed, layers=layers, final_norm=_vector(t["output_norm.weight"]), lm_head=head)
