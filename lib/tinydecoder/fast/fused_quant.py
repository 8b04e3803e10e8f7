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
a paged sequence), when every layer's four matrices are QuantMatrix products up to
quant_rows.ROWS_UP_TO rows (`fits`); more rows (never a fused pass: ATTEND_ROWS_UP_TO is 8) would
need quant_rows' tiles. As in `fused`, `run_layers` runs all the layers in one call (`_qlayers`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core.model import Model
from . import fused, stacks
from .compiled import jit, quant_planes, quant_rows

prange = range  # numba.prange once compiled (jit.compiled; nothing here runs in parallel itself)
CALLS = {"forward_pass._rmsnorm_rows": False, "compiled.quant_rows._rows": True, "forward_pass._swiglu_rows": True,
         "compiled.quant_planes._plane_rows": True}
INLINE = ("_qlayer_rows", "fused._attention_rows", "fused._add_rows", "_product")  # compiled into _qlayers
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
    qkv: tuple  # (raws, cols, q4_1, planes, by_planes, scales): by_planes, planes' lookups (1-2 rows), else raws'
    # blocks (with quant_rows.scales)
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
            planes is not None, quant_rows.scales(w) if planes is None else (quant_rows.NO_SCALES,) * len(w.raws))


def run_layers(model: Model, x, tables, cache, work: fused.Scratch, stop: int) -> int:
    """As `fused.run_layers`: blocks 0 .. stop-1 for the S rows x [S, D] (in place) in ONE compiled
    call (`_qlayers`), when every layer `fits`; their K and V join the cache. -> stop, or 0 (none run)."""
    S = x.shape[0]
    if stop < 1 or not fits(model.layers[0], S):  # (the first layer first, as fused.run_layers)
        return 0
    kind = ("quant", S <= quant_planes.ROWS_UP_TO, S <= quant_rows.ROWS_UP_TO)  # by lookup; `fits` at all
    blocks = stacks.blocks(model, kind, _block_of(S))
    if blocks is None:
        return 0
    ks, vs, table, block, start = stacks.layer_rows(cache, S, stop)
    jit.compiled(_qlayers, parallel=False)(x, blocks, stop, tables.cos, tables.sin, ks, vs, table, block, start, work,
                                           jit.threads())
    return stop


def _block_of(rows: int):
    """make(config, layer) for stacks.blocks: a layer's `QuantBlock` for passes over `rows` rows
    where it `fits`, else None."""
    def make(cfg, w):
        if not fits(w, rows):
            return None
        return QuantBlock(w.attn_norm, w.ffn_norm, _kernel_args(w.w_qkv, rows), _kernel_args(w.wo, rows),
                          _kernel_args(w.w_gate_up, rows), _kernel_args(w.w_down, rows), *fused.block_constants(cfg))
    return make


def _qlayers(x, blocks, stop, cos, sin, ks, vs, table, block, start, work, threads):  # pragma: no cover - numba
    """`_qlayer_rows` for layers 0 .. stop-1 (stacks.layer_rows' K and V lists, one block table)."""
    for l in range(stop):
        _qlayer_rows(x, blocks[l], cos, sin, fused.CacheRows(ks[l], vs[l], table, block), start, work, threads)


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
        _rows(x, matrix[0], matrix[5], matrix[1], matrix[2], out, threads)
