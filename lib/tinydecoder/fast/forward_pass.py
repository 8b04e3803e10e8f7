"""The fast path: the same numbers as the reference `forward`, in fewer, larger numpy calls.

A decode step of a 135M-parameter model reads ~540 MB of weights and does little else, so its
floor is bytes / bandwidth. What the reference path adds on top is Python: ~40 numpy calls per
layer, each with its own temporaries. Here, per forward pass:

- RoPE's cos/sin are computed once (not once per layer), and q and k rotate in one call, as
  x * cos + swap(x) * sin, where swap(x) is a view that exchanges the two halves of each pair;
- each matmul writes into a buffer allocated once per pass (`np.matmul(..., out=)`), and the
  elementwise steps (norm, SwiGLU, softmax) run in place, so large temporaries do not
  page-fault in again layer after layer;
- attention reads K and V where they lie: a query group [Hkv, g*S, d] against K [Hkv, T, d]
  (transposed views of the cache, no repeat_kv copy), one batched matmul for QK^T, one for PV;
- one query over a long cache (a decode step at T >= ONE_QUERY_GEMM_FROM) attends in two GEMMs
  over all KV heads at once (`attend_one_query`), which the BLAS library spreads over threads;
- B sequences of equal length in a `BatchKVCache` ([B, Hkv, T, d] per layer, `batch_cache.py`)
  attend in ONE call per layer instead of B;
- with numba (the `fast` extra), float32 products and attention run in compiled kernels:
  `compiled.few_rows` (up to tunables.SWEEPS_UP_TO_ROWS rows) and `compiled.tiles`
  (more) for the products, `compiled.few_queries` for a decode step or a few new rows,
  `compiled.prefill_attention` for more; RoPE rotates q and k in place (`rotate_heads`);
- with numba, a pass over up to ATTEND_ROWS_UP_TO rows of one sequence with a KVCache or a paged
  sequence (a decode step, a speculative check) runs its blocks in ONE compiled call of those
  kernels (`fused.run_layers`) instead of `_block`'s Python between them (`fused_quant.run_layers`
  for layers of GGUF blocks); a paged sequence's rows attend to its blocks where they lie
  (`paged_reads`; several sequences' few rows in one compiled call).

Weights are used as stored: fused w_qkv [D, (Hq+2Hkv)d] and w_gate_up [D, 2F] are split where
used (`qkv[:, :Hq*d]`), and no transposed or re-laid-out copy is made.

    logits = forward(model, ids, cache)                       # [S, V]
    forward_batch(model, [ids_a, ids_b], [cache_a, cache_b])       # list of [S_i, V]
    forward_batch(model, rows, BatchKVCache.stack(caches))         # equal lengths: batched attention
"""
from __future__ import annotations

import contextlib

import numpy as np

from ..core.cache import check_cache
from ..core.config import Config
from ..core.model import Model
from ..core.reference import embed_tokens
from ..core.validate import check_context, check_token_ids
from . import fused, fused_quant, paged_reads, tunables
from .aligned import empty64
from .attention import attend, attend_one_query
from .batch_cache import BatchKVCache
from .compiled import few_queries, few_rows, jit, quant_rows
from .rope_tables import rope_tables, rotate_heads, rotate_with_tables, rotates_heads

# Thresholds measured on one machine (tunables.py records which): where a speed trick starts.
ONE_QUERY_GEMM_FROM = tunables.ONE_QUERY_GEMM_FROM  # a single query over this many keys: attend_one_query
ATTEND_ROWS_UP_TO = tunables.ATTEND_ROWS_UP_TO  # up to this many new rows of a sequence: few_queries.attend_rows


# ----------------------------------------------------------------------------- the pieces

def rmsnorm_into(x, weight, eps: float, out):
    """out = x / sqrt(mean(x^2) + eps) * weight, row by row.  x, out: [N, D]. Float32 with a
    weight and numba: one compiled call (`_rmsnorm_rows`) in place of six numpy calls."""
    if (x.dtype == np.float32 and weight is not None and weight.dtype == np.float32 and out.dtype == np.float32
            and jit.available()):
        jit.compiled(_rmsnorm_rows, parallel=False)(x, weight, np.float32(eps), out)
        return out
    ms = np.vecdot(x, x)  # [N] sum of squares (a ufunc: a few microseconds less per call than einsum)
    ms /= x.shape[1]
    ms += eps
    np.sqrt(ms, out=ms)
    np.divide(x, ms[:, None], out=out)
    if weight is not None:
        out *= weight
    return out


prange = range  # numba.prange in functions compiled by jit.compiled
INLINE = ("compiled.vexp.exp_le0",)  # compiled into `_swiglu_rows` (jit.compiled)
exp_le0 = None  # vexp.exp_le0, bound by jit.compiled (vexp imports numba)


def swiglu_into(gate_up, out):
    """out = silu(gate) * up for gate_up [N, 2F] = [gate | up] (the fused projection's output),
    out [N, F]; silu(x) = x / (1 + exp(-x)). Float32 with numba: one compiled call on every core
    (`_swiglu_rows`) in place of five numpy calls on one (SmolLM2's 30 layers, December 2026:
    1 row 0.38 -> 0.24 ms, 100 rows 15.7 -> 4.3 ms, 500 rows 85 -> 22 ms)."""
    F = out.shape[1]
    gate = gate_up[:, :F]
    if (gate_up.dtype == out.dtype == np.float32 and gate_up.flags.c_contiguous and out.flags.c_contiguous
            and jit.available()):
        jit.compiled(_swiglu_rows)(gate_up, out, jit.threads())
        return out
    np.negative(gate, out=out)
    np.exp(out, out=out)
    out += 1.0
    np.divide(gate, out, out=out)
    out *= gate_up[:, F:]
    return out


def _swiglu_rows(gate_up, out, threads):  # pragma: no cover - runs compiled by numba
    """silu(gate) * up, each thread a share of the rows. exp_le0 takes x <= 0 only: with
    e = exp(-|g|), silu(g) = g / (1 + e) for g >= 0 and g e / (1 + e) for g < 0 (the same value)."""
    N, F = out.shape
    for t in prange(threads):
        for n in range(t * N // threads, (t + 1) * N // threads):
            for c in range(F):
                g = gate_up[n, c]
                e = exp_le0(-abs(g))
                s = g / (np.float32(1.0) + e)
                out[n, c] = (s if g >= 0 else s * e) * gate_up[n, F + c]


def _rmsnorm_rows(x, weight, eps, out):  # pragma: no cover - runs compiled by numba
    N, D = x.shape
    for n in range(N):
        ms = np.float32(0.0)
        for c in range(D):
            ms += x[n, c] * x[n, c]
        scale = np.float32(1.0) / np.sqrt(ms / np.float32(D) + eps)
        for c in range(D):
            out[n, c] = x[n, c] * scale * weight[c]


def product_kernel(x, w) -> str:
    """Which kernel `project` runs for rows x [M, K] times w [K, N]: "few_rows" or "tiles" (numba,
    float32 rows and an out-major float32 weight of at least SKINNY_MIN_WEIGHTS numbers), else
    numpy's "gemv" (GEMV_ROWS rows, one matrix-vector product each), "padded" (to PAD_ROWS_TO rows)
    or "matmul"; a quantised weight (the GGUF's blocks) "quant_rows" (numba), else "dequantised".
    The thresholds are tunables.py's."""
    M = x.shape[0]
    if isinstance(w, quant_rows.QuantMatrix):
        return "quant_rows" if quant_rows.fits(x, w) else "dequantised"
    if few_rows.takes(w) and few_rows.fits(x, w):
        return "few_rows" if M <= tunables.SWEEPS_UP_TO_ROWS else "tiles"
    if M in tunables.GEMV_ROWS:
        return "gemv"
    if max(tunables.GEMV_ROWS) < M < tunables.PAD_ROWS_TO:
        return "padded"
    return "matmul"


def attention_kernel(q, k_all, v_all) -> str:
    """Which attention a pass runs for q [S, Hq, d] (one sequence's new rows) over its cache
    k_all, v_all [T, Hkv, d]: "few_queries" (numba, up to ATTEND_ROWS_UP_TO rows),
    "prefill_attention" (numba, more), "attend_one_query" (numpy, one row over at least
    ONE_QUERY_GEMM_FROM keys) or "attend" (numpy's batched products)."""
    S = q.shape[0]
    if few_queries.fits_rows(q, k_all, v_all):
        return "few_queries" if S <= ATTEND_ROWS_UP_TO else "prefill_attention"
    if S == 1 and len(k_all) >= ONE_QUERY_GEMM_FROM and k_all.flags.c_contiguous:
        return "attend_one_query"
    return "attend"


def project(x, w, out, work=None):
    """out = x @ w for x [M, K], w [K, N] (as stored), choosing the kernel. Float32 rows times an
    out-major weight (SmolLM2's, `checkpoint.weights`) of at least SKINNY_MIN_WEIGHTS weights run
    in numba when it is installed, all rows in one call: up to SWEEPS_UP_TO_ROWS rows in
    `few_rows`' sweeps (each weight read once for all rows), more in `tiles`' register tiles.
    Otherwise numpy's BLAS: one row is a matrix-vector product (GEMV), which streams the
    weights; GEMV_ROWS rows run as that many GEMVs; fewer than PAD_ROWS_TO rows are padded with
    zero rows to PAD_ROWS_TO (a zero row changes no other row's result). Why these numbers:
    tunables.py. work: where the tiles pack the rows (`_Buffers.packed`), or None. A quantised
    weight (`quant_rows.QuantMatrix`, the GGUF's blocks) runs in quant_rows' kernels with numba,
    else dequantised."""
    M = x.shape[0]
    kernel = product_kernel(x, w)
    if kernel == "quant_rows":  # the file's blocks, read in place
        quant_rows.product(x, w, out, work)
    elif kernel == "dequantised":
        np.matmul(x, np.asarray(w), out=out)
    elif kernel == "few_rows":  # numba: BLAS held to one thread; out C-contiguous float32, as both kernels need
        few_rows.product(x, w, out)
    elif kernel == "tiles":
        from .compiled import tiles  # imports numba and llvmlite

        tiles.product(x, w, out, work)
    elif kernel == "gemv":
        for i in range(M):
            np.matmul(x[i], w, out=out[i])
    elif kernel == "padded":
        padded = np.zeros((tunables.PAD_ROWS_TO, x.shape[1]), x.dtype)  # [8, K]
        padded[:M] = x
        out[:] = (padded @ w)[:M]
    else:
        np.matmul(x, w, out=out)
    return out


# ----------------------------------------------------------------------------- the pass

def forward(model: Model, token_ids, cache=None, *, last_only: bool = False) -> np.ndarray:
    """Logits [S, V] (or [1, V] with last_only) for S new tokens; the same numbers as
    `core.reference.forward`, faster. With a cache, attend to its past and append the new K/V."""
    return forward_batch(model, [token_ids], None if cache is None else [cache], last_only=last_only)[0]


def forward_batch(model: Model, batch, caches=None, *, last_only: bool = False) -> list:
    """Several sequences in one pass -> list of logits, one [S_i, V] (or [1, V]) per sequence.

    caches: None, a list with one cache per sequence (KVCache, paged sequence, or None), or
    one BatchKVCache for the whole batch (then every sequence has the same length)."""
    cfg = model.config
    ids = [check_token_ids(cfg, t) for t in batch]
    if not ids:
        raise ValueError("forward_batch needs at least one sequence")
    if isinstance(caches, BatchKVCache):
        return _forward_stacked(model, ids, caches, last_only)
    caches = [None] * len(ids) if caches is None else list(caches)
    if len(caches) != len(ids):
        raise ValueError(f"{len(ids)} sequences but {len(caches)} caches")
    pasts = []
    for cache, t in zip(caches, ids):  # validate everything before any cache is touched
        if cache is not None:
            check_cache(cache, cfg, model.dtype)
        past = 0 if cache is None else len(cache)
        check_context(cfg, past, len(t))
        pasts.append(past)
    caches = [model.new_cache(len(t)) if c is None else c for c, t in zip(caches, ids)]
    bounds = np.cumsum([0] + [len(t) for t in ids])  # rows of sequence s: bounds[s]:bounds[s+1]
    positions = np.concatenate([np.arange(p, p + len(t)) for p, t in zip(pasts, ids)])  # [N]

    def attention(l, q, k, v, rows):
        if paged_reads.in_one_pool(caches, q, rows, bounds):  # paged sequences of one pool: one compiled call
            return paged_reads.attend_sequences(l, q, k, v, rows, caches, bounds)
        out = np.empty((q.shape[0], q.shape[1] * q.shape[2]), q.dtype)  # [Nq, Hq*d]
        for s, cache in enumerate(caches):
            a, b = bounds[s], bounds[s + 1]
            qa, qb = (a, b) if rows is None else (s, s + 1)
            if paged_reads.reads_blocks(cache, q[qa:qb]):  # a paged sequence: its blocks where they lie
                paged_reads.attend_in_blocks(cache, l, q[qa:qb], k[a:b], v[a:b], out[qa:qb])
                continue
            k_all, v_all = cache.append(l, k[a:b], v[a:b])  # [T, Hkv, d]
            kernel = attention_kernel(q[qa:qb], k_all, v_all)
            if kernel == "few_queries":
                out[qa:qb] = few_queries.attend_rows(q[qa:qb], k_all, v_all)  # numba: the cache read once
            elif kernel == "prefill_attention":
                from .compiled import prefill_attention  # imports numba: register tiles on every core

                prefill_attention.attend_prefill(q[qa:qb], k_all, v_all, out[qa:qb])
            elif kernel == "attend_one_query":
                out[qa] = attend_one_query(q[qa], k_all, v_all)
            else:
                out[qa:qb] = attend(q[None, qa:qb], k_all.transpose(1, 0, 2)[None], v_all.transpose(1, 0, 2)[None])
        return out

    keep = bounds[1:] - 1 if last_only else None
    one = caches[0] if len(ids) == 1 and fused.applies(model, caches[0], len(ids[0])) else None
    logits = _run(model, np.concatenate(ids), positions, attention, keep, fused_cache=one)
    if last_only:
        return [logits[s:s + 1] for s in range(len(ids))]
    return [logits[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _forward_stacked(model: Model, ids, cache: BatchKVCache, last_only: bool) -> list:
    """forward_batch with a BatchKVCache: B sequences of S new tokens, attended in one call."""
    cfg, B, S = model.config, len(ids), len(ids[0])
    if any(len(t) != S for t in ids):
        raise ValueError(f"a BatchKVCache needs the same number of new tokens per sequence; "
                         f"got {[len(t) for t in ids]}")
    if B != cache.batch:
        raise ValueError(f"{B} sequences but the BatchKVCache holds {cache.batch}")
    cache.check(cfg, model.dtype)
    past = len(cache)
    check_context(cfg, past, S)
    positions = np.tile(np.arange(past, past + S), B)  # [B*S], row b*S + i is sequence b's token i

    def attention(l, q, k, v, rows):
        Hkv, d = cfg.n_kv_heads, cfg.head_dim
        k_all, v_all = cache.append(l, k.reshape(B, S, Hkv, d), v.reshape(B, S, Hkv, d))  # [B, Hkv, T, d]
        if rows is None and S > 1:
            return attend(q.reshape(B, S, *q.shape[1:]), k_all, v_all)
        # one query per sequence (a decode step, or the kept last rows): q [B, Hq, d]
        T = k_all.shape[2]
        if few_queries.fits_batch(q, cache.k[l], cache.v[l], T):  # numba: each sequence's K, V read once
            return few_queries.attend_last_batch(q, cache.k[l], cache.v[l], T)
        return attend(q.reshape(B, 1, *q.shape[1:]), k_all, v_all)

    keep = np.arange(S - 1, B * S, S) if last_only else None
    logits = _run(model, np.concatenate(ids), positions, attention, keep)
    return [logits[b:b + 1] for b in range(B)] if last_only else [logits[b * S:(b + 1) * S] for b in range(B)]


def _run(model: Model, ids, positions, attention, keep, fused_cache=None):
    """Embedding, every block, the head.  attention(l, q, k, v, rows) appends k, v to the
    caches and returns [Nq, Hq*d]; keep: rows that the last layer keeps (None: all). With a
    `fused_cache` (a pass `fused.applies` to: one sequence's few rows), the layers that keep every
    row run in ONE compiled call with that cache (`fused.run_layers`, or `fused_quant`'s)."""
    cfg = model.config
    x = embed_tokens(model, ids, positions)  # [N, D], a fresh array: updated in place below
    N, D = x.shape
    tables = rope_tables(cfg, positions, x.dtype) if cfg.position == "rope" else None
    buffers = None  # the unfused blocks' work arrays, made when a layer first needs them
    if keep is not None and len(keep) == N:  # one new token per sequence: every row is kept
        keep = None
    use_numba = x.dtype == np.float32 and jit.available()
    with jit.one_blas_thread() if use_numba else contextlib.nullcontext():  # numba's threads run the kernels
        fused_layers, work = 0, None  # blocks run in one compiled call (x updated in place), the rest one by one below
        if fused_cache is not None:
            work = fused.reused_scratch(model, N, len(fused_cache) + N)
            stop = cfg.n_layers if keep is None else cfg.n_layers - 1  # a last layer that drops rows: _block
            fused_layers = (fused.run_layers(model, x, tables, fused_cache, work, stop)
                            or fused_quant.run_layers(model, x, tables, fused_cache, work, stop))  # the file's blocks
        for l in range(fused_layers, cfg.n_layers):
            rows = keep if l == cfg.n_layers - 1 else None
            if buffers is None:
                buffers = _Buffers(cfg, N, x.dtype, tiled=x.dtype == np.float32 and N > tunables.SWEEPS_UP_TO_ROWS)
            x = _block(cfg, model.layers[l], l, x, tables, attention, rows, buffers)
        reuse = work is not None and work.h.shape == x.shape  # (a last layer that kept fewer rows: a new array)
        h = rmsnorm_into(x, model.final_norm, cfg.norm_eps, work.h if reuse else empty64(x.shape, x.dtype))
        return project(h, model.lm_head, np.empty((h.shape[0], cfg.vocab_size), h.dtype))  # [Nq, V]


class _Buffers:
    """The pass's work arrays, allocated once and reused by every layer (each on a cache line: `aligned`)."""

    def __init__(self, cfg: Config, N: int, dtype, tiled: bool = False):
        Hq, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.h = empty64((N, cfg.d_model), dtype)  # normed input
        self.qkv = empty64((N, (Hq + 2 * Hkv) * d), dtype)
        self.proj = empty64((N, cfg.d_model), dtype)  # an output projection before the residual add
        self.gate_up = empty64((N, 2 * cfg.d_ff), dtype)
        self.hidden = empty64((N, cfg.d_ff), dtype)
        self.packed = None  # where tiles.py packs the rows of every product (tiled: more rows than the sweeps take)
        if tiled and jit.available():
            from .compiled import tiles

            self.packed = empty64(tiles.work_numbers(N, max(cfg.d_model, Hq * d, cfg.d_ff)))


def _block(cfg: Config, layer, l: int, x, tables, attention, rows, buf):
    """One pre-norm block, x [N, D] -> [N, D] (updated in place); with `rows`, only those rows
    go on past attention (their K/V are still computed and cached for every row)."""
    Hq, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    N = x.shape[0]
    h = rmsnorm_into(x, layer.attn_norm, cfg.norm_eps, buf.h)  # [N, D]
    if rows is None:  # one matmul for Q, K and V, split where used
        qkv = project(h, layer.w_qkv, buf.qkv, buf.packed)  # [N, (Hq + 2Hkv) d]
        q_rows, kv = qkv[:, :Hq * d], qkv[:, Hq * d:]
    else:  # queries of the kept rows only; keys and values of every row (they are cached)
        w_q, w_kv = layer.w_qkv[:, :Hq * d], layer.w_qkv[:, Hq * d:]
        q_rows = project(h[rows], w_q, np.empty((len(rows), Hq * d), h.dtype))
        kv = project(h, w_kv, np.empty((N, 2 * Hkv * d), h.dtype), buf.packed)
        packed = buf.packed  # big enough for fewer rows too
        x, buf = x[rows], _Buffers(cfg, len(rows), x.dtype)
        buf.packed = packed
    k, v = kv[:, :Hkv * d].reshape(N, Hkv, d), kv[:, Hkv * d:].reshape(N, Hkv, d)  # [N, Hkv, d] views
    q = q_rows.reshape(-1, Hq, d)  # [Nq, Hq, d]
    if tables is not None:
        in_place = all(rotates_heads(a, tables) for a in ((qkv,) if rows is None else (q_rows, kv)))
        if in_place and rows is None:  # numba: q and k rotated in place in qkv (q and k are views of it)
            rotate_heads(qkv, Hq + Hkv, tables, cfg.rope_layout)
        elif in_place:
            rotate_heads(q_rows, Hq, tables.take(rows), cfg.rope_layout)
            rotate_heads(kv, Hkv, tables, cfg.rope_layout)  # k lies first in kv
        elif rows is None:  # q and k sit side by side in qkv: rotate both in one call
            qk = rotate_with_tables(qkv[:, :(Hq + Hkv) * d].reshape(N, Hq + Hkv, d), tables, cfg.rope_layout)
            q, k = qk[:, :Hq], qk[:, Hq:]
        else:
            q = rotate_with_tables(q, tables.take(rows), cfg.rope_layout)
            k = rotate_with_tables(k, tables, cfg.rope_layout)
    out = attention(l, q, k, v, rows)  # [Nq, Hq*d]
    x += project(out, layer.wo, buf.proj, buf.packed)  # [Nq, D]
    z = rmsnorm_into(x, layer.ffn_norm, cfg.norm_eps, buf.h[:x.shape[0]])
    gate_up = project(z, layer.w_gate_up, buf.gate_up, buf.packed)  # [Nq, 2F]: gate and up side by side
    hidden = swiglu_into(gate_up, buf.hidden)  # [Nq, F]: silu(gate) * up
    x += project(hidden, layer.w_down, buf.proj, buf.packed)  # [Nq, D]
    return x


# ----------------------------------------------------------------------------- the allocator
