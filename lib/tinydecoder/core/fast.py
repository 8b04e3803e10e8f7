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
  `skinny` (up to tunables.SWEEPS_UP_TO_ROWS rows) and `tiles` (more) for the products, `one_query` for a decode step or a
  few new rows, `prefill_attention` for more; RoPE rotates q and k in place (`rotate_heads`);
- with numba, a pass over up to ATTEND_ROWS_UP_TO rows of one sequence with a KVCache (a decode
  step, a speculative check) runs each block as one compiled call of those kernels (`fused.layer`)
  instead of `_block`'s Python between them.

Weights are used as stored: fused w_qkv [D, (Hq+2Hkv)d] and w_gate_up [D, 2F] are split where
used (`qkv[:, :Hq*d]`), and no transposed or re-laid-out copy is made.

    logits = forward(model, ids, cache)                       # [S, V]
    forward_batch(model, [ids_a, ids_b], [cache_a, cache_b])       # list of [S_i, V]
    forward_batch(model, rows, BatchKVCache.stack(caches))         # equal lengths: batched attention
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from . import fused, one_query, quant_rows, skinny, tunables
from .batch_cache import BatchKVCache  # noqa: F401 - forward_batch's batched cache, also fast.BatchKVCache
from .cache import check_cache
from .config import Config
from .model import Model
from .reference import embed_tokens
from .rope import rope_tables, rotate, rotate_heads, rotates_heads
from .validate import check_context, check_token_ids

# Thresholds measured on one machine (tunables.py records which): where a speed trick starts.
QUERY_BLOCK = tunables.QUERY_BLOCK  # a long prefill attends in blocks of this many queries
ONE_QUERY_GEMM_FROM = tunables.ONE_QUERY_GEMM_FROM  # a single query over this many keys: attend_one_query
ATTEND_ROWS_UP_TO = tunables.ATTEND_ROWS_UP_TO  # up to this many new rows of a sequence: one_query.attend_rows


# ----------------------------------------------------------------------------- the pieces

def rmsnorm_into(x, weight, eps: float, out):
    """out = x / sqrt(mean(x^2) + eps) * weight, row by row.  x, out: [N, D]. Float32 with a
    weight and numba: one compiled call (`_rmsnorm_rows`) in place of six numpy calls."""
    if (x.dtype == np.float32 and weight is not None and weight.dtype == np.float32 and out.dtype == np.float32
            and skinny.available()):
        skinny.compiled(_rmsnorm_rows, parallel=False)(x, weight, np.float32(eps), out)
        return out
    ms = np.vecdot(x, x)  # [N] sum of squares (a ufunc: a few microseconds less per call than einsum)
    ms /= x.shape[1]
    ms += eps
    np.sqrt(ms, out=ms)
    np.divide(x, ms[:, None], out=out)
    if weight is not None:
        out *= weight
    return out


prange = range  # numba.prange in functions compiled by skinny.compiled
INLINE = ("vexp.exp_le0",)  # compiled into `_swiglu_rows` (skinny.compiled)
exp_le0 = None  # vexp.exp_le0, bound by skinny.compiled (vexp imports numba)


def swiglu_into(gate_up, out):
    """out = silu(gate) * up for gate_up [N, 2F] = [gate | up] (the fused projection's output),
    out [N, F]; silu(x) = x / (1 + exp(-x)). Float32 with numba: one compiled call on every core
    (`_swiglu_rows`) in place of five numpy calls on one (SmolLM2's 30 layers, December 2026:
    1 row 0.38 -> 0.24 ms, 100 rows 15.7 -> 4.3 ms, 500 rows 85 -> 22 ms)."""
    F = out.shape[1]
    gate = gate_up[:, :F]
    if (gate_up.dtype == out.dtype == np.float32 and gate_up.flags.c_contiguous and out.flags.c_contiguous
            and skinny.available()):
        skinny.compiled(_swiglu_rows)(gate_up, out, skinny.threads())
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


def attend(q, k, v):
    """Causal attention of S new queries per sequence over T visible keys, B sequences at once.

    q: [B, S, Hq, d] (the last S of the T positions); k, v: [B, Hkv, T, d] (views are fine)
    -> [B*S, Hq*d]. Each KV head's g = Hq/Hkv query heads are stacked into one [g*S, d]
    matrix, so QK^T and PV are one batched matmul each over [B, Hkv] without copying K or V.
    More than QUERY_BLOCK queries run block by block, each against the keys it can see."""
    B, S, Hq, d = q.shape
    T, Hkv = k.shape[2], k.shape[1]
    g = Hq // Hkv
    if S <= QUERY_BLOCK:  # a decode step or a short chunk: one block
        return _attend_block(q, k, v, g).reshape(B * S, Hq * d)
    out = np.empty((B, S, Hq * d), q.dtype)
    for a in range(0, S, QUERY_BLOCK):
        b = min(a + QUERY_BLOCK, S)
        visible = T - S + b  # keys 0 .. the position of query b-1
        out[:, a:b] = _attend_block(q[:, a:b], k[:, :, :visible], v[:, :, :visible], g)
    return out.reshape(B * S, Hq * d)


def attend_one_query(q, k, v):
    """One query position of one sequence over T cached positions, as two GEMMs over all KV
    heads at once.  q: [Hq, d]; k, v: [T, Hkv, d] (the KVCache's own layout)  -> [1, Hq*d].

    A [Hq, Hkv*d] query matrix holds query head j's q (scaled) in the columns of its KV head and
    zeros elsewhere; times K seen as [Hkv*d, T] it gives every head's scores [Hq, T] in one call,
    and the weights [Hq, T] times V [T, Hkv*d] give [Hq, Hkv*d], of which head j keeps its KV
    head's d columns. It multiplies Hkv times more numbers than needed (the zeros), but in two
    calls over T positions instead of 2*Hkv calls of g rows, and its row-wise softmax reads
    contiguous rows. Faster than `attend` from ONE_QUERY_GEMM_FROM keys on (tunables.py)."""
    Hq, d = q.shape
    T, Hkv = k.shape[0], k.shape[1]
    heads = np.arange(Hq)
    kv_of = heads // (Hq // Hkv)  # [Hq]: the KV head each query head reads
    q_wide = np.zeros((Hq, Hkv, d), q.dtype)  # [Hq, Hkv*d] once reshaped
    q_wide[heads, kv_of] = q * q.dtype.type(1.0 / math.sqrt(d))
    scores = q_wide.reshape(Hq, Hkv * d) @ k.reshape(T, Hkv * d).T  # [Hq, T]
    scores -= scores.max(axis=1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=1, keepdims=True)  # the weights, in place
    both = (scores @ v.reshape(T, Hkv * d)).reshape(Hq, Hkv, d)  # [Hq, Hkv, d]
    return both[heads, kv_of].reshape(1, Hq * d)  # each head's own KV head's block


def _attend_block(q, k, v, g):
    """One block: q [B, S, Hq, d], k, v [B, Hkv, T, d] -> [B, S, Hq*d]."""
    B, S, Hq, d = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    scale = q.dtype.type(1.0 / math.sqrt(d))
    qg = q.reshape(B, S, Hkv, g, d).transpose(0, 2, 3, 1, 4) * scale  # [B, Hkv, g, S, d]
    scores = qg.reshape(B, Hkv, g * S, d) @ k.swapaxes(-1, -2)  # [B, Hkv, g*S, T]
    if S > 1:  # the causal triangle, over the last S keys only (older keys are visible to all)
        past = T - S
        future = np.arange(S)[None, :] > np.arange(S)[:, None]  # [S, S]
        scores.reshape(B, Hkv, g, S, T)[..., past:][..., future] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)  # the weights, in place
    out = scores @ v  # [B, Hkv, g*S, d]
    return out.reshape(B, Hkv, g, S, d).transpose(0, 3, 1, 2, 4).reshape(B, S, Hq * d)


def project(x, w, out, work=None):
    """out = x @ w for x [M, K], w [K, N] (as stored), choosing the kernel. Float32 rows times an
    out-major weight (SmolLM2's, `checkpoint.weights`) of at least SKINNY_MIN_WEIGHTS weights run
    in numba when it is installed, all rows in one call: up to SWEEPS_UP_TO_ROWS rows in
    `skinny`'s sweeps (each weight read once for all rows), more in `tiles`' register tiles.
    Otherwise numpy's BLAS: one row is a matrix-vector product (GEMV), which streams the
    weights; GEMV_ROWS rows run as that many GEMVs; fewer than PAD_ROWS_TO rows are padded with
    zero rows to PAD_ROWS_TO (a zero row changes no other row's result). Why these numbers:
    tunables.py. work: where the tiles pack the rows (`_Buffers.packed`), or None. A quantised
    weight (`quant_rows.QuantMatrix`, the GGUF's blocks) runs in quant_rows' kernels with numba,
    else dequantised."""
    M = x.shape[0]
    if isinstance(w, quant_rows.QuantMatrix):  # the file's blocks: quant_rows' kernels, else dequantised
        return quant_rows.product(x, w, out, work) if quant_rows.fits(x, w) else np.matmul(x, np.asarray(w), out=out)
    if skinny.takes(w) and skinny.fits(x, w):  # numba: BLAS held to one thread
        if M <= tunables.SWEEPS_UP_TO_ROWS:  # out: C-contiguous float32, as both kernels need
            skinny.product(x, w, out)
        else:
            from . import tiles  # imports numba and llvmlite

            tiles.product(x, w, out, work)
    elif M in tunables.GEMV_ROWS:
        for i in range(M):
            np.matmul(x[i], w, out=out[i])
    elif max(tunables.GEMV_ROWS) < M < tunables.PAD_ROWS_TO:
        padded = np.zeros((tunables.PAD_ROWS_TO, x.shape[1]), x.dtype)  # [8, K]
        padded[:M] = x
        out[:] = (padded @ w)[:M]
    else:
        np.matmul(x, w, out=out)
    return out


# ----------------------------------------------------------------------------- the pass

def forward(model: Model, token_ids, cache=None, *, last_only: bool = False) -> np.ndarray:
    """Logits [S, V] (or [1, V] with last_only) for S new tokens; the same numbers as
    `model.forward`, faster. With a cache, attend to its past and append the new K/V."""
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
        out = np.empty((q.shape[0], q.shape[1] * q.shape[2]), q.dtype)  # [Nq, Hq*d]
        for s, cache in enumerate(caches):
            a, b = bounds[s], bounds[s + 1]
            k_all, v_all = cache.append(l, k[a:b], v[a:b])  # [T, Hkv, d]
            qa, qb = (a, b) if rows is None else (s, s + 1)
            if qb - qa <= ATTEND_ROWS_UP_TO and one_query.fits_rows(q[qa:qb], k_all, v_all):
                out[qa:qb] = one_query.attend_rows(q[qa:qb], k_all, v_all)  # numba: the cache read once
            elif qb - qa > ATTEND_ROWS_UP_TO and one_query.fits_rows(q[qa:qb], k_all, v_all):
                from . import prefill_attention  # imports numba: register tiles on every core

                prefill_attention.attend_prefill(q[qa:qb], k_all, v_all, out[qa:qb])
            elif qb - qa == 1 and len(k_all) >= ONE_QUERY_GEMM_FROM and k_all.flags.c_contiguous:
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
        if one_query.fits_batch(q, cache.k[l], cache.v[l], T):  # numba: each sequence's K, V read once
            return one_query.attend_last_batch(q, cache.k[l], cache.v[l], T)
        return attend(q.reshape(B, 1, *q.shape[1:]), k_all, v_all)

    keep = np.arange(S - 1, B * S, S) if last_only else None
    logits = _run(model, np.concatenate(ids), positions, attention, keep)
    return [logits[b:b + 1] for b in range(B)] if last_only else [logits[b * S:(b + 1) * S] for b in range(B)]


def _run(model: Model, ids, positions, attention, keep, fused_cache=None):
    """Embedding, every block, the head.  attention(l, q, k, v, rows) appends k, v to the
    caches and returns [Nq, Hq*d]; keep: rows that the last layer keeps (None: all). With a
    `fused_cache` (a pass `fused.applies` to: one sequence's few rows), a layer that keeps every
    row runs as one compiled call, `fused.layer`, with that cache."""
    cfg = model.config
    x = embed_tokens(model, ids, positions)  # [N, D], a fresh array: updated in place below
    N, D = x.shape
    tables = rope_tables(cfg, positions, x.dtype) if cfg.position == "rope" else None
    buffers = _Buffers(cfg, N, x.dtype, tiled=x.dtype == np.float32 and N > tunables.SWEEPS_UP_TO_ROWS)
    if keep is not None and len(keep) == N:  # one new token per sequence: every row is kept
        keep = None
    use_numba = x.dtype == np.float32 and skinny.available()
    with skinny.one_blas_thread() if use_numba else contextlib.nullcontext():  # numba's threads run the kernels
        work = None if fused_cache is None else fused.Work(model, N, len(fused_cache) + N)
        for l, layer in enumerate(model.layers):
            rows = keep if l == cfg.n_layers - 1 else None
            if work is not None and rows is None and fused.fits(layer):
                fused.layer(model, l, x, tables, fused_cache, work)  # x updated in place
            else:
                x = _block(cfg, layer, l, x, tables, attention, rows, buffers)
        h = rmsnorm_into(x, model.final_norm, cfg.norm_eps, np.empty_like(x))
        return project(h, model.lm_head, np.empty((h.shape[0], cfg.vocab_size), h.dtype))  # [Nq, V]


class _Buffers:
    """The pass's work arrays, allocated once and reused by every layer."""

    def __init__(self, cfg: Config, N: int, dtype, tiled: bool = False):
        Hq, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.h = np.empty((N, cfg.d_model), dtype)  # normed input
        self.qkv = np.empty((N, (Hq + 2 * Hkv) * d), dtype)
        self.proj = np.empty((N, cfg.d_model), dtype)  # an output projection before the residual add
        self.gate_up = np.empty((N, 2 * cfg.d_ff), dtype)
        self.hidden = np.empty((N, cfg.d_ff), dtype)
        self.packed = None  # where tiles.py packs the rows of every product (tiled: more rows than the sweeps take)
        if tiled and skinny.available():
            from . import tiles

            self.packed = np.empty(tiles.work_numbers(N, max(cfg.d_model, Hq * d, cfg.d_ff)), np.float32)


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
            qk = rotate(qkv[:, :(Hq + Hkv) * d].reshape(N, Hq + Hkv, d), tables, cfg.rope_layout)
            q, k = qk[:, :Hq], qk[:, Hq:]
        else:
            q = rotate(q, tables.take(rows), cfg.rope_layout)
            k = rotate(k, tables, cfg.rope_layout)
    out = attention(l, q, k, v, rows)  # [Nq, Hq*d]
    x += project(out, layer.wo, buf.proj, buf.packed)  # [Nq, D]
    z = rmsnorm_into(x, layer.ffn_norm, cfg.norm_eps, buf.h[:x.shape[0]])
    gate_up = project(z, layer.w_gate_up, buf.gate_up, buf.packed)  # [Nq, 2F]: gate and up side by side
    hidden = swiglu_into(gate_up, buf.hidden)  # [Nq, F]: silu(gate) * up
    x += project(hidden, layer.w_down, buf.proj, buf.packed)  # [Nq, D]
    return x


# ----------------------------------------------------------------------------- the allocator
