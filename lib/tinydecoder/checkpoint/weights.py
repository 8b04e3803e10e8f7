"""A GGUF's tensors laid out the way `forward` reads them, and the `Model` built on them.

Orientation. A GGUF matrix comes out of `gguf` as (out, in), one row per output feature;
tinydecoder computes x @ w with w of shape [in, out]. Every matrix keeps that [in, out] shape and
the file's memory order: Fortran order, "out-major", the in-weights of each output lying together.
That is the order the fast path's few-rows kernel (`fast.compiled.few_rows`, with numba) reads: a decode
step, a speculative check of a few guesses or a small batch reads each weight row once and uses it
for every row of input. (Without numba, numpy's matrix-vector product runs a whole decode step
about 1.2x slower in this order than in the mixed orders used before, measured on this machine;
numba's kernel runs it ~0.85x of that older time; see `fast.tunables`.) The embedding is a [V, D]
C-contiguous table (`embed[ids]` gathers contiguous rows), and the tied output head `embed.T` is
then out-major too. Q, K and V of a layer
are stored side by side in one [D, (Hq + 2 Hkv) d] array and gate and up in one [D, 2F] array;
`wq`, `wk`, `wv`, `w_gate`, `w_up` are views into them, so a decode step runs one matmul for
each group (see `LayerWeights.w_qkv`). The weights exist once.

RoPE layout. By default llama.cpp's Q/K row permutation is undone (`gguf_file.unpermute_qk`)
and the model uses `rope_layout="halves"` (the layout the notebooks explain);
`to_interleaved` gives the file's row order with rope_layout "interleaved".
"""
from __future__ import annotations

import sys

from ..core.config import Config
from ..core.model import LayerWeights, Model
from ..core.rope import with_layout
from .gguf_file import dequantize_tensor, unpermute_qk


def array_shapes(cfg: Config) -> dict:
    """Cache array name -> shape, in tinydecoder's [in, out] layout, fused where it helps."""
    D, F = cfg.d_model, cfg.d_ff
    q_width, kv_width = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {"token_embd": (D, cfg.vocab_size), "output_norm": (D,)}  # [D, V] out-major: bytes of [V, D]
    if not cfg.tied_embeddings:
        shapes["output"] = (D, cfg.vocab_size)
    for l in range(cfg.n_layers):
        shapes.update({
            f"blk.{l}.attn_norm": (D,), f"blk.{l}.ffn_norm": (D,),
            f"blk.{l}.attn_qkv": (D, q_width + 2 * kv_width), f"blk.{l}.attn_output": (q_width, D),
            f"blk.{l}.ffn_gate_up": (D, 2 * F), f"blk.{l}.ffn_down": (F, D)})
    return shapes


# Arrays stored in Fortran order (their [in, out] shape unchanged): the (out, in) rows of the
# file lie contiguous, as `fast.compiled.few_rows.rows_times` reads them. Every matrix; the norms are vectors.
FORTRAN_ORDER = ("token_embd", "output", "attn_qkv", "attn_output", "ffn_gate_up", "ffn_down")


def array_order(name: str) -> str:
    """"F" or "C": the memory order a cache array is stored and loaded in."""
    return "F" if name.split(".")[-1] in FORTRAN_ORDER else "C"


def _destination(cfg: Config, gguf_name: str):
    """Where a GGUF tensor goes: (array name, column slice or None, transpose?)."""
    if not gguf_name.startswith("blk."):
        base = gguf_name.removesuffix(".weight")
        return base, None, base in ("output", "token_embd")
    _, l, part, _ = gguf_name.split(".")
    q_width, kv_width, F = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.d_ff
    columns = {"attn_q": ("attn_qkv", 0, q_width), "attn_k": ("attn_qkv", q_width, q_width + kv_width),
               "attn_v": ("attn_qkv", q_width + kv_width, q_width + 2 * kv_width),
               "ffn_gate": ("ffn_gate_up", 0, F), "ffn_up": ("ffn_gate_up", F, 2 * F)}
    if part in columns:
        name, a, b = columns[part]
        return f"blk.{l}.{name}", slice(a, b), True
    return f"blk.{l}.{part}", None, part in ("attn_output", "ffn_down")


def write_weights(reader, cfg: Config, allocate, progress: bool = True, desc: str = "dequantising") -> dict:
    """Dequantise every tensor into arrays from `allocate(name, shape, order)` (np.empty or a
    .npy memmap; order from `array_order`); one tensor at a time is held as a temporary.
    Returns {array name: array}."""
    from tqdm import tqdm

    arrays = {name: allocate(name, shape, array_order(name)) for name, shape in array_shapes(cfg).items()}
    heads = {"attn_q": cfg.n_heads, "attn_k": cfg.n_kv_heads}
    for tensor in tqdm(reader.tensors, desc=desc, unit="tensor", file=sys.stderr,
                       disable=not progress, leave=False):
        w = dequantize_tensor(tensor)  # (out, in)
        part = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else None
        if part in heads and cfg.rope_layout == "halves":
            w = unpermute_qk(w, heads[part])
        name, columns, transpose = _destination(cfg, tensor.name)
        target = arrays[name] if columns is None else arrays[name][:, columns]
        target[...] = w.T if transpose else w
    return arrays


def assemble_model(cfg: Config, arrays: dict) -> Model:
    """A Model whose weights are views of `arrays` (see `array_shapes`)."""
    layers = [LayerWeights(w_qkv=arrays[f"blk.{l}.attn_qkv"], wo=arrays[f"blk.{l}.attn_output"],
                           w_gate_up=arrays[f"blk.{l}.ffn_gate_up"], w_down=arrays[f"blk.{l}.ffn_down"],
                           attn_norm=arrays[f"blk.{l}.attn_norm"], ffn_norm=arrays[f"blk.{l}.ffn_norm"])
              for l in range(cfg.n_layers)]
    # The embedding is stored [D, V] out-major and used through its transpose: embed[ids] gathers
    # contiguous rows of a [V, D] C-ordered view, and the tied head, embed.T, is out-major.
    return Model(cfg, embed=arrays["token_embd"].T, layers=layers, final_norm=arrays["output_norm"],
                 lm_head=arrays.get("output"))


def to_interleaved(model: Model) -> Model:
    """The same model with llama.cpp's Q/K row order and rope_layout "interleaved" (only Q and
    K are rearranged, into new arrays; everything else is shared with `model`). It is
    `rope.with_layout(model, "interleaved")`: per head, the column permutation that
    `permute_qk` applies to the GGUF's rows."""
    return with_layout(model, "interleaved")
