"""fused.py's one-call decoder block for a layer whose matrices are the GGUF file's own blocks
(`compiled.quant_rows.QuantMatrix`: SmolLM2 loaded with weights="q4_1").

`fused._layer_rows` runs the float32 products; here the same block, statement for statement
(it inlines fused.py's attention and residual code), runs a quantised kernel for each of the four
products (`_product`: one or two rows of a Q4_1 matrix by quant_planes' lookups over its bit planes where
they apply, else quant_rows' `_rows` on the file's blocks): every part of a matrix in one
parallel call, each thread a contiguous share of each part's output rows (so both cores share
every product). Without it, a quantised layer ran `forward_pass._block`: ~15 Python statements
and a dozen small numpy calls per layer around the same kernels. The numbers are the unfused
quantised path's (the same kernels in the same order; tests bound the last float32 bits).

It applies where `fused.applies` does (a pass over a few rows of one sequence with a KVCache or
a paged sequence), for each layer whose four matrices are QuantMatrix products up to
quant_rows.ROWS_UP_TO rows (`fits`); more rows (never a fused pass: ATTEND_ROWS_UP_TO is 8) would
need quant_rows' tiles.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..core.model import Model
from . import fused
from .compiled import jit, quant_planes, quant_rows

prange = range  # numba.prange once compiled (jit.compiled; nothing here runs in parallel itself)
CALLS = {"forward_pass._rmsnorm_rows": False, "compiled.quant_rows._rows": True, "forward_pass._swiglu_rows": True,
         "compiled.quant_planes._plane_rows": True}
INLINE = ("fused._attention_rows", "fused._add_rows", "_product")  # compiled into _qlayer_rows
_rmsnorm_rows = _rows = _swiglu_rows = _plane_rows = _attention_rows = _add_rows = None  # bound by jit.compiled
_NO_PLANES = np.zeros((0, 1, quant_planes.GROUP_BYTES), np.uint8)  # a part's planes where they are not used


def fits(weights, rows: int = 1) -> bool:
    """Whether a layer's four matrices are QuantMatrix products that quant_rows' `_rows` takes for
    `rows` rows (numba installed, the [in, out] view)."""
    return (jit.available() and rows <= quant_rows.ROWS_UP_TO
            and all(isinstance(w, quant_rows.QuantMatrix) and not w.transposed
                    for w in (weights.w_qkv, weights.wo, weights.w_gate_up, weights.w_down)))


class QuantBlock(NamedTuple):
    """One layer for `_qlayer_rows`: each matrix as quant_rows' kernels take it (its parts' raw
    blocks, their output columns, and whether it is Q4_1), and the block's constants."""
    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    qkv: tuple  # (raws, cols, q4_1, planes, by_planes): by_planes, planes' lookups (1-2 rows), else raws' blocks
    wo: tuple
    gate_up: tuple
    down: tuple
    eps: np.float32
    n_heads: int
    scale: np.float32
    halves: bool


def _kernel_args(w: quant_rows.QuantMatrix, rows: int) -> tuple:
    planes = quant_planes.planes(w) if rows <= quant_planes.ROWS_UP_TO else None
    return (w.raws, w.cols, w.kind == "Q4_1", (_NO_PLANES,) * len(w.raws) if planes is None else planes,
            planes is not None)


def layer(model: Model, l: int, x, tables, cache, work: fused.Scratch) -> None:
    """As `fused.layer`: block l for the S rows x [S, D] (in place); their K and V join the cache."""
    cfg, w = model.config, model.layers[l]
    S = x.shape[0]
    kv, start = fused.cache_rows(cache, l, S)
    block = QuantBlock(w.attn_norm, w.ffn_norm, _kernel_args(w.w_qkv, S), _kernel_args(w.wo, S),
                       _kernel_args(w.w_gate_up, S), _kernel_args(w.w_down, S), np.float32(cfg.norm_eps), cfg.n_heads,
                       np.float32(1.0 / math.sqrt(cfg.head_dim)), cfg.rope_layout == "halves")
    jit.compiled(_qlayer_rows, parallel=False)(x, block, tables.cos, tables.sin, kv, start, work, jit.threads())


def _qlayer_rows(x, block, cos, sin, kv, start, work, threads):  # pragma: no cover - numba
    """fused._layer_rows with quant_rows' products (module docstring)."""
    eps, h, proj = block.eps, work.h, work.proj
    qkv, wo, gu, down = block.qkv, block.wo, block.gate_up, block.down
    _rmsnorm_rows(x, block.attn_norm, eps, h)  # [S, D]
    _product(h, qkv, work.qkv, threads)  # [S, (Hq + 2Hkv) d]
    _attention_rows(work.qkv, block.n_heads, block.scale, block.halves, cos, sin, kv, start, work)
    _product(work.att, wo, proj, threads)  # [S, D]
    _add_rows(x, proj)
    _rmsnorm_rows(x, block.ffn_norm, eps, h)
    _product(h, gu, work.gate_up, threads)  # [S, 2F]
    _swiglu_rows(work.gate_up, work.hidden, threads)  # [S, F]
    _product(work.hidden, down, proj, threads)  # [S, D]
    _add_rows(x, proj)


def _product(x, matrix, out, threads):  # pragma: no cover - compiled into _qlayer_rows
    """out = x @ the matrix (`_kernel_args`'s tuple): by its planes' lookups, or from its blocks."""
    if matrix[4]:
        _plane_rows(x, matrix[3], matrix[1], out, threads)
    else:
        _rows(x, matrix[0], matrix[1], matrix[2], out, threads)
