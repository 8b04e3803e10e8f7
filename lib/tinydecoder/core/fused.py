"""A decoder block over a few new rows of one sequence in ONE compiled call: the fast path's
decode step and speculative check, with the Python between the kernels taken out.

`fast._block` runs a layer as ~15 Python statements around seven compiled kernels and a dozen
small numpy calls (slices, reshapes, the residual adds, the cache append). For one row each of
those costs microseconds, and a SmolLM2 decode step runs 30 layers of them beside weights that
take ~18 ms to read (issue 23: the step's share of the bandwidth roof). `_layer_rows` is the same
block, statement for statement, as one numba function that calls the same kernels:

    h = rmsnorm(x)                      fast._rmsnorm_rows                [S, D]
    qkv = h @ W_qkv                     skinny's sweeps or tiles' 8-row   [S, (Hq + 2Hkv) d]
                                        tile, as fast.project picks (parallel)
    rotate q and k in place             rope._rope_rows
    K, V cache rows start .. start+S-1  <- k, v
    a = attention(q, K[:T], V[:T])      one_query._attend_rows (parallel) [S, Hq d]
    x += a @ W_o
    h = rmsnorm(x)
    gu = h @ W_gate_up                  [S, 2F]
    x += swiglu(gu) @ W_down            fast._swiglu_rows (parallel)

so it computes the numbers `fast._block` computes with numba (on SmolLM2, bit for bit; on other
shapes LLVM may vectorise a kernel it inlines here, such as the norm's sum, in another order, and
the last bit of a float32 may differ: tests bound it), only sooner.

Measured (SmolLM2, December 2026, the Zen 3 machine of tunables.SWEEPS_UP_TO_ROWS, both paths
alternating in one process, medians of 22 passes at contexts 128, 512 and 2,048, two to five
runs): a decode step 0.86-0.95x its time (at context 128, in a quiet hour, 19.9-21.1 -> 18.5-19.4
ms), 3 rows 0.87-0.94x, 5 rows in the sweeps 0.91-0.98x, 5 to 8 rows in the tile 0.80-0.87x
(unfused, each of their products also packs its rows for the tile in numpy).

It applies (`applies`, `fits`) to a pass over at most tunables.ATTEND_ROWS_UP_TO rows of one
sequence with a `KVCache` (the rows `one_query` attends), on a float32 RoPE model, for each layer
whose matrices numba's products take (out-major float32, at least SKINNY_MIN_WEIGHTS numbers):
SmolLM2's decode steps and speculative checks of up to 7 guesses. Anything else runs
`fast._block`.
"""
from __future__ import annotations

import math

import numpy as np

from . import one_query, skinny, tunables
from .cache import KVCache
from .model import Model

prange = range  # numba.prange once compiled (skinny.compiled; no loop here runs in parallel itself)
# The kernels _layer_rows calls, each compiled as the unfused path compiles it (True: parallel,
# on numba's threads), and called rather than inlined by numba (skinny.compiled binds them).
CALLS = {"fast._rmsnorm_rows": False, "rope._rope_rows": False, "skinny._rows_times_rows": True,
         "tiles._rows_times_tiles": True, "one_query._attend_rows": True, "fast._swiglu_rows": True}
INLINE = ("_times",)  # compiled into _layer_rows
_rmsnorm_rows = _rope_rows = _rows_times_rows = _rows_times_tiles = _swiglu_rows = _attend_rows = None  # bound by skinny.compiled


def applies(model: Model, cache, rows: int) -> bool:
    """Whether a pass over `rows` new rows of one sequence with `cache` can run `layer` (for each
    layer whose weights `fits`)."""
    cfg = model.config
    return (skinny.available() and type(cache) is KVCache and cache.dtype == model.dtype == np.float32
            and cfg.position == "rope" and 0 < rows <= tunables.ATTEND_ROWS_UP_TO)


def fits(weights) -> bool:
    """Whether a layer's four matrices are ones `fast.project` gives to numba's kernels (skinny's
    sweeps, or tiles): out-major float32 of at least SKINNY_MIN_WEIGHTS numbers."""
    return all(skinny.takes(w) for w in (weights.w_qkv, weights.wo, weights.w_gate_up, weights.w_down))


class Work:
    """A pass's work arrays for `layer`, allocated once and reused by every layer."""

    def __init__(self, model: Model, rows: int, T: int):
        cfg = model.config
        Hq, Hkv, d, S = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, rows
        self.h = np.empty((S, cfg.d_model), np.float32)  # normed input
        self.qkv = np.empty((S, (Hq + 2 * Hkv) * d), np.float32)
        self.q = np.empty((Hq * S, d), np.float32)  # scaled queries, grouped by KV head: [Hkv, g, S, d]
        self.heads_out = np.empty((Hq * S, d), np.float32)  # attention's output in the same order
        self.att = np.empty((S, Hq * d), np.float32)  # ... and by row
        self.merge = np.empty((min(T, one_query.TASKS_PER_THREAD * skinny.threads()), Hq * S, d + 2), np.float32)
        self.proj = np.empty((S, cfg.d_model), np.float32)
        self.gate_up = np.empty((S, 2 * cfg.d_ff), np.float32)
        self.hidden = np.empty((S, cfg.d_ff), np.float32)
        # More rows than the sweeps take: the products run in tiles.py's 8-row tile, which reads
        # the rows packed as tiles.pack_rows packs them (the rows past S stay zero)
        self.tiled = S > tunables.SWEEPS_UP_TO_ROWS
        self.no_blocks = np.zeros((0, 1, 16), np.float32)  # pack_rows' whole 16-row blocks: none
        self.packed_d = np.zeros((1, cfg.d_model, 8), np.float32)  # a norm's output, packed
        self.packed_att = np.zeros((1, Hq * d, 8), np.float32)  # attention's output
        self.packed_f = np.zeros((1, cfg.d_ff, 8), np.float32)  # SwiGLU's output


def layer(model: Model, l: int, x, tables, cache: KVCache, work: Work) -> None:
    """Block l for the S rows x [S, D] (updated in place) of a sequence whose cache holds the
    positions before them; their K and V join the cache. tables: rope.rope_tables for the rows."""
    cfg, w = model.config, model.layers[l]
    S = x.shape[0]
    k_cache, v_cache, start = cache.reserve(l, S)  # [capacity, Hkv, d] each; rows start .. start+S-1 are ours
    skinny.compiled(_layer_rows, parallel=False)(
        x, w.attn_norm, w.ffn_norm, np.float32(cfg.norm_eps), w.w_qkv.T, w.wo.T, w.w_gate_up.T, w.w_down.T,
        tables.cos, tables.sin, cfg.rope_layout == "halves", cfg.n_heads, np.float32(1.0 / math.sqrt(cfg.head_dim)),
        k_cache, v_cache, start, skinny.threads(), work.tiled,
        work.h, work.qkv, work.q, work.heads_out, work.att, work.merge, work.proj, work.gate_up, work.hidden,
        work.no_blocks, work.packed_d, work.packed_att, work.packed_f)


def _times(x, wt, out, tiled, no_blocks, packed, threads):  # pragma: no cover - runs compiled by numba
    """out = x @ wt.T as `fast.project` computes it: skinny's sweeps, or (tiled) tiles.py's
    8-row tile over x packed into `packed` [1, K, 8]."""
    if tiled:
        S, K = x.shape
        for k in range(K):
            for s in range(S):
                packed[0, k, s] = x[s, k]
        _rows_times_tiles(no_blocks, packed, x, wt, out, threads)
    else:
        _rows_times_rows(x, wt, out)


def _layer_rows(x, attn_norm, ffn_norm, eps, wqkv, wo, wgu, wdown, cos, sin, halves, Hq, scale,
                k_cache, v_cache, start, threads, tiled,
                h, qkv, q, heads_out, att, merge, proj, gate_up, hidden,
                no_blocks, packed_d, packed_att, packed_f):  # pragma: no cover - runs compiled by numba
    """fast._block for S rows and a KVCache's arrays, as this module's docstring lays out. Weights
    as the products take them: [outputs, inputs] (the out-major matrices transposed)."""
    S, D = x.shape
    Hkv, d = k_cache.shape[1], k_cache.shape[2]
    _rmsnorm_rows(x, attn_norm, eps, h)  # [S, D]
    _times(h, wqkv, qkv, tiled, no_blocks, packed_d, threads)  # [S, (Hq + 2Hkv) d]
    _rope_rows(qkv, Hq + Hkv, cos, sin, halves)  # q and k rotated in place
    for s in range(S):  # the new keys and values join the cache
        for j in range(Hkv):
            for c in range(d):
                k_cache[start + s, j, c] = qkv[s, (Hq + j) * d + c]
                v_cache[start + s, j, c] = qkv[s, (Hq + Hkv + j) * d + c]
    for i in range(Hq):  # scaled queries, grouped as attention reads them: row i * S + s (i = kv head * g + its j)
        for s in range(S):
            for c in range(d):
                q[i * S + s, c] = qkv[s, i * d + c] * scale
    _attend_rows(q, k_cache, v_cache, start + S, S, merge, heads_out)  # [Hq * S, d]
    for i in range(Hq):
        for s in range(S):
            for c in range(d):
                att[s, i * d + c] = heads_out[i * S + s, c]
    _times(att, wo, proj, tiled, no_blocks, packed_att, threads)  # [S, D]
    for s in range(S):
        for c in range(D):
            x[s, c] += proj[s, c]
    _rmsnorm_rows(x, ffn_norm, eps, h)
    _times(h, wgu, gate_up, tiled, no_blocks, packed_d, threads)  # [S, 2F]: gate and up side by side
    _swiglu_rows(gate_up, hidden, threads)  # [S, F]
    _times(hidden, wdown, proj, tiled, no_blocks, packed_f, threads)  # [S, D]
    for s in range(S):
        for c in range(D):
            x[s, c] += proj[s, c]
