"""Every decoder block of a pass over a few new rows of one sequence in ONE compiled call: the fast
path's decode step and speculative check, with the Python between the kernels taken out.

`forward_pass._block` runs a layer as ~15 Python statements around seven compiled kernels and a dozen
small numpy calls (slices, reshapes, the residual adds, the cache append). For one row each of
those costs microseconds, and a SmolLM2 decode step runs 30 layers of them beside weights that
take ~18 ms to read (the step's share of the bandwidth roof). `_layer_rows` is the same
block, statement for statement, as one numba function that calls the same kernels:

    h = rmsnorm(x)                      forward_pass._rmsnorm_rows                [S, D]
    qkv = h @ W_qkv                     few_rows' sweeps or tiles' 8-row   [S, (Hq + 2Hkv) d]
                                        tile, as forward_pass.project picks (parallel)
    rotate q and k in place             rope_tables._rope_rows
    K, V cache rows start .. start+S-1  <- k, v
    a = attention(q, K[:T], V[:T])      few_queries._attend_rows (parallel) [S, Hq d]
    x += a @ W_o
    h = rmsnorm(x)
    gu = h @ W_gate_up                  [S, 2F]
    x += swiglu(gu) @ W_down            forward_pass._swiglu_rows (parallel)

so it computes the numbers `forward_pass._block` computes with numba (on SmolLM2, bit for bit; on other
shapes LLVM may vectorise a kernel it inlines here, such as the norm's sum, in another order, and
the last bit of a float32 may differ: tests bound it), only sooner.

Measured (SmolLM2, December 2026, the Zen 3 machine of tunables.SWEEPS_UP_TO_ROWS, both paths
alternating in one process, medians of 22 passes at contexts 128, 512 and 2,048, two to five
runs): a decode step 0.86-0.95x its time (at context 128, in a quiet hour, 19.9-21.1 -> 18.5-19.4
ms), 3 rows 0.87-0.94x, 5 rows in the sweeps 0.91-0.98x, 5 to 8 rows in the tile 0.80-0.87x
(unfused, each of their products also packs its rows for the tile in numpy).

`run_layers` runs `_layer_rows` for all the layers in one call (`_layers`), the blocks' arrays
and the cache's K and V arrays given as numba typed lists made once (`stacks`). Called once a
layer, with the layer's arrays as arguments, a Q4_1 decode step spent ~18 us a layer outside the
kernels (the Python, and numba checking the arguments' types, running from memory after each
layer's weights streamed through the caches): SmolLM2 Q4_1 at context 128 (December 2026, Zen 5,
the same numbers bit for bit) 3.37-3.60 -> 3.12-3.22 ms a step, in processes taking turns.

It applies (`applies`, `fits`) to a pass over at most tunables.ATTEND_ROWS_UP_TO rows of one
sequence with a `KVCache` or a paged sequence (a server's cache: `serving.paged`, blocks of a
multiple of 8 positions), on a float32 RoPE model whose layers' matrices are all ones numba's
products take (out-major float32, at least SKINNY_MIN_WEIGHTS numbers): SmolLM2's decode steps and
speculative checks of up to 7 guesses, in `generate` and in a server running one request.
Anything else runs `forward_pass._block`, a layer at a time. A paged sequence's new K and V go straight into its
pool's blocks, and attention reads them there through the block table (`CacheRows`;
few_queries._attend_rows), with a KVCache's numbers bit for bit. Before, a server's decode step
ran `_block`, whose attention gathered every cached position of every layer into a fresh array
(the pool's `append`): SmolLM2 Q4_1 at context 128 (December 2026, Zen 5, one process, 4
alternating runs of 63 steps) 4.60 ms a step in the server's engine against 3.57 with a KVCache;
now both 4.22 (a slower hour; docs/fast_path.md).
"""
from __future__ import annotations

import math
import threading
from typing import NamedTuple

import numpy as np

from ..core.cache import KVCache
from ..core.model import Model
from . import stacks, tunables
from .aligned import empty64
from .compiled import few_queries, few_rows, jit

prange = range  # numba.prange once compiled (jit.compiled; no loop here runs in parallel itself)
# The kernels _layer_rows calls, each compiled as the unfused path compiles it (True: parallel,
# on numba's threads), and called rather than inlined by numba (jit.compiled binds them).
CALLS = {"forward_pass._rmsnorm_rows": False, "rope_tables._rope_rows": False, "compiled.few_rows._rows_times_rows": True,
         "compiled.tiles._rows_times_tiles": True, "compiled.few_queries._attend_rows": True, "forward_pass._swiglu_rows": True}
INLINE = ("_layer_rows", "_times", "_attention_rows", "_add_rows", "compiled.few_queries._row")  # compiled into _layers
# (fused_quant's _qlayers inlines _attention_rows and _add_rows)
_rmsnorm_rows = _rope_rows = _rows_times_rows = _rows_times_tiles = _swiglu_rows = _attend_rows = None  # bound by jit.compiled
_row = None  # few_queries._row (where position t lies), bound by jit.compiled


def applies(model: Model, cache, rows: int) -> bool:
    """Whether a pass over `rows` new rows of one sequence with `cache` can run `run_layers` (for each
    layer whose weights `fits`): a KVCache, or a paged sequence (`layer_rows`) whose blocks hold
    a multiple of 8 positions."""
    cfg = model.config
    kind_ok = type(cache) is KVCache or (hasattr(cache, "layer_rows") and cache.block_size % 8 == 0)
    return (jit.available() and kind_ok and cache.dtype == model.dtype == np.float32
            and cfg.position == "rope" and 0 < rows <= tunables.ATTEND_ROWS_UP_TO)


class CacheRows(NamedTuple):
    """Where a layer's K and V rows lie for `_attention_rows`: position t in row table[t // block] *
    block + t % block of k and v [rows, Hkv, d] (few_queries._attend_rows)."""
    k: np.ndarray
    v: np.ndarray
    table: np.ndarray  # int64 block table; a KVCache's is [0], its arrays one block
    block: int


def fits(weights) -> bool:
    """Whether a layer's four matrices are ones `forward_pass.project` gives to numba's kernels (skinny's
    sweeps, or tiles): out-major float32 of at least SKINNY_MIN_WEIGHTS numbers."""
    return all(few_rows.takes(w) for w in (weights.w_qkv, weights.wo, weights.w_gate_up, weights.w_down))


class Scratch(NamedTuple):
    """A pass's work arrays for `layer`, allocated once (`scratch`) and reused by every layer."""
    h: np.ndarray  # [S, D] the normed input
    qkv: np.ndarray  # [S, (Hq + 2Hkv) d]
    q: np.ndarray  # [Hq * S, d] scaled queries, grouped by KV head: [Hkv, g, S, d]
    heads_out: np.ndarray  # [Hq * S, d] attention's output in the same order
    att: np.ndarray  # [S, Hq * d] ... and by row
    merge: np.ndarray  # [tasks, Hq * S, d + 2] attention's partial results
    proj: np.ndarray  # [S, D]
    gate_up: np.ndarray  # [S, 2F]
    hidden: np.ndarray  # [S, F]
    # More rows than the sweeps take run in tiles.py's 8-row tile, which reads rows packed as
    # tiles.pack_rows packs them (the rows past S stay zero):
    no_blocks: np.ndarray  # [0, 1, 16] pack_rows' whole 16-row blocks: none
    packed_d: np.ndarray  # [1, D, 8] a norm's output, packed
    packed_att: np.ndarray  # [1, Hq d, 8] attention's output
    packed_f: np.ndarray  # [1, F, 8] SwiGLU's output


class Block(NamedTuple):
    """One layer's weights as the products take them ([outputs, inputs]: the out-major matrices
    transposed, no copy) and the block's shapes and constants, for `_layer_rows`."""
    attn_norm: np.ndarray  # [D]
    ffn_norm: np.ndarray  # [D]
    wqkv: np.ndarray  # [(Hq + 2Hkv) d, D]
    wo: np.ndarray  # [D, Hq d]
    wgu: np.ndarray  # [2F, D]
    wdown: np.ndarray  # [D, F]
    eps: np.float32
    n_heads: int
    scale: np.float32  # 1 / sqrt(d)
    halves: bool  # RoPE pairs (i, i + d/2), else (2i, 2i + 1)


_reused = threading.local()  # this thread's scratches, by shape (`reused_scratch`)


def reused_scratch(model: Model, rows: int, T: int) -> Scratch:
    """`scratch`'s arrays, made once per thread for each shape and reused by every pass of it (a
    decode step's 13 allocations cost ~60 us, 1-2% of a Q4_1 step). A pass writes every array before
    it reads it (the packed tiles' padding rows past S, zeros, are never written)."""
    cfg = model.config
    key = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, rows,
           min(T, few_queries.TASKS_PER_THREAD * jit.threads()))
    kept = _reused.__dict__.setdefault("scratches", {})
    if key not in kept:
        kept[key] = scratch(model, rows, T)
    return kept[key]


def scratch(model: Model, rows: int, T: int) -> Scratch:
    """The work arrays of a pass over `rows` rows after which the cache holds T positions."""
    cfg = model.config
    Hq, Hkv, d, S = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, rows
    new = lambda *shape: empty64(shape)  # on a cache line: the few-row kernels load these rows again and again

    def zeros(*shape):
        out = new(*shape)
        out.fill(0.0)
        return out

    return Scratch(new(S, cfg.d_model), new(S, (Hq + 2 * Hkv) * d), new(Hq * S, d), new(Hq * S, d), new(S, Hq * d),
                   new(min(T, few_queries.TASKS_PER_THREAD * jit.threads()), Hq * S, d + 2), new(S, cfg.d_model),
                   new(S, 2 * cfg.d_ff), new(S, cfg.d_ff), zeros(0, 1, 16), zeros(1, cfg.d_model, 8),
                   zeros(1, Hq * d, 8), zeros(1, cfg.d_ff, 8))


def run_layers(model: Model, x, tables, cache, work: Scratch, stop: int) -> int:
    """Blocks 0 .. stop-1 for the S rows x [S, D] (updated in place) of a sequence whose cache
    (`applies`) holds the positions before them, in ONE compiled call (`_layers`), when every
    layer `fits`; their K and V join the cache. -> the blocks run: stop, or 0 (none; the caller
    runs them another way). tables: rope_tables.rope_tables for the rows."""
    S = x.shape[0]
    if stop < 1 or not fits(model.layers[0]):  # (the first layer first: no stack of another model's kind)
        return 0
    blocks = stacks.blocks(model, "float32", _block_of)
    if blocks is None:
        return 0
    ks, vs, table, block, start = stacks.layer_rows(cache, S, stop)
    jit.compiled(_layers, parallel=False)(x, blocks, stop, tables.cos, tables.sin, ks, vs, table, block, start, work,
                                          S > tunables.SWEEPS_UP_TO_ROWS, jit.threads())
    return stop


def _block_of(cfg, w) -> Block | None:
    """A layer's `Block` where it `fits`, else None."""
    if not fits(w):
        return None
    return Block(w.attn_norm, w.ffn_norm, w.w_qkv.T, w.wo.T, w.w_gate_up.T, w.w_down.T, *block_constants(cfg))


def block_constants(cfg) -> tuple:
    """A block's constants as `Block` and fused_quant's QuantBlock end with them: (eps, n_heads,
    1 / sqrt(d), RoPE's "halves" layout or not)."""
    return np.float32(cfg.norm_eps), cfg.n_heads, np.float32(1.0 / math.sqrt(cfg.head_dim)), cfg.rope_layout == "halves"


def _layers(x, blocks, stop, cos, sin, ks, vs, table, block, start, work, tiled, threads):  # pragma: no cover - numba
    """`_layer_rows` for layers 0 .. stop-1 (stacks.layer_rows' K and V lists, one block table)."""
    for l in range(stop):
        _layer_rows(x, blocks[l], cos, sin, CacheRows(ks[l], vs[l], table, block), start, work, tiled, threads)


def _times(x, wt, out, tiled, no_blocks, packed, threads):  # pragma: no cover - runs compiled by numba
    """out = x @ wt.T as `forward_pass.project` computes it: few_rows' sweeps, or (tiled) tiles.py's
    8-row tile over x packed into `packed` [1, K, 8]."""
    if tiled:
        S, K = x.shape
        for k in range(K):
            for s in range(S):
                packed[0, k, s] = x[s, k]
        _rows_times_tiles(no_blocks, packed, x, wt, out, threads)
    else:
        _rows_times_rows(x, wt, out)


def _layer_rows(x, block, cos, sin, kv, start, work, tiled, threads):  # pragma: no cover - numba
    """forward_pass._block for S rows and a cache's rows, as this module's docstring lays out:
    x [S, D] updated in place; block: a `Block`; work: a `Scratch`; cos, sin [S, d/2] the rows'
    RoPE tables; kv: `CacheRows`, positions start .. start+S-1 written."""
    Hq, scale, eps = block.n_heads, block.scale, block.eps
    h, qkv, att, proj, no_blocks = work.h, work.qkv, work.att, work.proj, work.no_blocks
    _rmsnorm_rows(x, block.attn_norm, eps, h)  # [S, D]
    _times(h, block.wqkv, qkv, tiled, no_blocks, work.packed_d, threads)  # [S, (Hq + 2Hkv) d]
    _attention_rows(qkv, Hq, scale, block.halves, cos, sin, kv, start, work)  # -> work.att
    _times(att, block.wo, proj, tiled, no_blocks, work.packed_att, threads)  # [S, D]
    _add_rows(x, proj)
    _rmsnorm_rows(x, block.ffn_norm, eps, h)
    _times(h, block.wgu, work.gate_up, tiled, no_blocks, work.packed_d, threads)  # [S, 2F]: gate and up side by side
    _swiglu_rows(work.gate_up, work.hidden, threads)  # [S, F]
    _times(work.hidden, block.wdown, proj, tiled, no_blocks, work.packed_f, threads)  # [S, D]
    _add_rows(x, proj)


def _attention_rows(qkv, Hq, scale, halves, cos, sin, kv, start, work):  # pragma: no cover - numba
    """The block between the QKV product and the output projection: q and k rotated in place in
    qkv [S, (Hq + 2Hkv) d], the new K and V into the cache's rows for positions start .. (kv: a
    `CacheRows`), and the rows' attention into work.att [S, Hq d]."""
    q, heads_out, att = work.q, work.heads_out, work.att
    k_cache, v_cache, table, block = kv.k, kv.v, kv.table, kv.block
    S = qkv.shape[0]
    Hkv, d = k_cache.shape[1], k_cache.shape[2]
    _rope_rows(qkv, Hq + Hkv, cos, sin, halves)  # q and k rotated in place
    for s in range(S):  # the new keys and values join the cache
        r = _row(table, block, start + s)
        for j in range(Hkv):
            for c in range(d):
                k_cache[r, j, c] = qkv[s, (Hq + j) * d + c]
                v_cache[r, j, c] = qkv[s, (Hq + Hkv + j) * d + c]
    for i in range(Hq):  # scaled queries, grouped as attention reads them: row i * S + s (i = kv head * g + its j)
        for s in range(S):
            for c in range(d):
                q[i * S + s, c] = qkv[s, i * d + c] * scale
    _attend_rows(q, k_cache, v_cache, table, block, start + S, S, work.merge, heads_out)  # [Hq * S, d]
    for i in range(Hq):
        for s in range(S):
            for c in range(d):
                att[s, i * d + c] = heads_out[i * S + s, c]


def _add_rows(x, proj):  # pragma: no cover - runs compiled by numba
    """x += proj (the residual add), [S, D]."""
    S, D = x.shape
    for s in range(S):
        for c in range(D):
            x[s, c] += proj[s, c]
