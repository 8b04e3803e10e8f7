"""Tensor parallelism: one forward pass split over `tp` MPI ranks (see shard.py for who holds what).

Per rank, for S new tokens (x, the residual stream [S, D], is the same on every rank):

    x = embed_shard[ids in my range] (zeros elsewhere);  all-reduce(x)         # 1 all-reduce
    for each layer:
        h = rmsnorm(x);  q, k, v = h Wq_r, h Wk_r, h Wv_r       # my heads only, RoPE, my KV cache
        part = attention(q, K_r, V_r) Wo_r;  all-reduce(part);  x += part      # 1 all-reduce
        part = swiglu(rmsnorm(x), Wgate_r, Wup_r) Wdown_r;  all-reduce(part);  x += part   # 1
    logits_r = rmsnorm(x) Whead_r  -> gathered to rank 0 ([S, V] there)
    rank 0 picks the next token and broadcasts it

So a token costs 2L + 1 all-reduces of D floats per rank, one gather of V/tp floats per rank and
one 8-byte broadcast. The sums of partial products run in another order than in one process,
so the logits agree to float32 rounding, not bit for bit.

    results = run_ranks(3, "tinydecoder.parallel.tp:generate_rank",
                        dict(model="smollm2", prompt=ids, max_new_tokens=16, keep_logits=True))"""
from __future__ import annotations

import time

import numpy as np

from ..checkpoint.registry import MODEL_NAMES, load_model
from ..core.cache import KVCache
from ..core.config import Config
from ..core.model import Model
from ..core.ops import apply_rope, attention, rmsnorm, swiglu
from ..core.validate import check_context, check_token_ids
from .comm import TracedComm, ring_bytes
from .shard import ModelShard, check_degree, shard_model

# Published figures for a GPU node, for the step-time model (see `step_time_model`).
H100_HBM3_BANDWIDTH = 3.35e12  # bytes/s per H100 SXM (NVIDIA H100 Tensor Core GPU datasheet)
NVLINK_ALLREDUCE_SECONDS = 3.5e-6  # a 1 KB all-reduce over NVLink, NCCL ring, 4 H800 GPUs, no CUDA graph:
NVLINK_ALLREDUCE_SOURCE = "https://github.com/NVIDIA/nccl/issues/1984 (nccl-tests all_reduce_perf, 1 KB)"
H100_SOURCE = "NVIDIA H100 Tensor Core GPU datasheet: 3.35 TB/s HBM3 per H100 SXM"


def small_tp_config() -> Config:
    """A small random model every degree 1 and 3 divides (6 query heads, 3 KV heads, 24 FFN units,
    48 tokens), RoPE and tied embeddings like SmolLM2: the tests' and the lessons' quick model."""
    return Config(vocab_size=48, d_model=32, n_heads=6, n_kv_heads=3, head_dim=8, n_layers=2, d_ff=24,
                  max_context=128, position="rope", norm_scale=True, tied_embeddings=True, name="small-tp")


def resolve_model(model) -> Model:
    """"smollm2" (memory-mapped), "small" (small_tp_config, seed 0), "toy" (the worked example's, float64), or a Model."""
    if isinstance(model, Model):
        return model
    if model in MODEL_NAMES:  # "toy" or "smollm2", as the command line and the server name them
        return load_model(model)
    if model == "small":
        from ..core.toy import random_model

        return random_model(small_tp_config(), seed=0)
    raise ValueError(f"model must be 'smollm2', 'small', 'toy' or a Model, got {model!r}")


def tp_forward(shard: ModelShard, comm: TracedComm, token_ids, cache: KVCache, *, last_only: bool = False):
    """This rank's part of a forward pass; the logits [S, V] ([1, V] with last_only) on rank 0,
    None on the others. `cache` is this rank's KVCache (made for shard.local)."""
    cfg, local = shard.config, shard.local
    ids = check_token_ids(cfg, token_ids)
    check_context(cfg, len(cache), len(ids))
    S, hq, hkv, d = len(ids), local.n_heads, local.n_kv_heads, cfg.head_dim
    positions = np.arange(len(cache), len(cache) + S)
    lo, hi = shard.vocab
    x = np.zeros((S, cfg.d_model), shard.embed.dtype)
    mine = (ids >= lo) & (ids < hi)
    x[mine] = shard.embed[ids[mine] - lo]  # my rows; the other ranks fill the rest
    comm.allreduce(x, "embed")
    if cfg.position == "table":
        x += shard.pos_table[positions]
    for l, w in enumerate(shard.layers):
        h = rmsnorm(x, w.attn_norm, cfg.norm_eps)
        q = (h @ w.wq).reshape(S, hq, d)
        k = (h @ w.wk).reshape(S, hkv, d)
        v = (h @ w.wv).reshape(S, hkv, d)
        if cfg.position == "rope":
            q = apply_rope(q, positions, cfg.rope_base, cfg.rope_layout)
            k = apply_rope(k, positions, cfg.rope_base, cfg.rope_layout)
        k_all, v_all = cache.append(l, k, v)  # my KV heads only
        part = attention(q, k_all, v_all) @ w.wo  # [S, D], my heads' share of the output projection
        x = x + comm.allreduce(part, "attn_out")
        part = swiglu(rmsnorm(x, w.ffn_norm, cfg.norm_eps), w.w_gate, w.w_up) @ w.w_down  # [S, D]
        x = x + comm.allreduce(part, "ffn_down")
    h = rmsnorm(x[-1:] if last_only else x, shard.final_norm, cfg.norm_eps)
    return comm.gather_columns(h @ shard.lm_head)  # [S, V] on rank 0


def greedy_token(logits) -> int:
    return int(np.argmax(logits[-1]))


def generate_rank(comm, model="small", prompt=(0, 1, 2), max_new_tokens: int = 8, *, keep_logits: bool = False,
                  stop_tokens=(), sampling: dict | None = None, allreduce_probe: int = 0,
                  keep_freed_memory: bool = False) -> dict:
    """One rank of a tensor-parallel generation (run it with launch.run_ranks). Greedy unless
    `sampling` holds make_sampler's arguments (rank 0 samples, then broadcasts the token).

    Returns, per rank: its weight and cache bytes, and per step (1 = the prefill) its seconds, the
    seconds inside collectives and the collectives' counts and bytes; rank 0 also the tokens (and,
    with keep_logits, every step's logits: the prefill's [S, V], then [1, V] per step).
    allreduce_probe: time that many all-reduces of one D-float row first (their median seconds).
    keep_freed_memory: this rank's malloc keeps freed memory (as the single-process CLI does for SmolLM2)."""
    kept = False
    if keep_freed_memory:
        from ..perf.machine import keep_freed_memory as keep

        kept = keep()
    traced = TracedComm(comm)
    full = resolve_model(model)
    tp = check_degree(full.config, traced.size)
    shard = shard_model(full, traced.rank, tp)
    prompt = [int(t) for t in check_token_ids(full.config, list(prompt))]
    cache = KVCache(shard.local, shard.embed.dtype, capacity=len(prompt) + max_new_tokens)
    sampler = greedy_token
    if sampling:
        from ..decoding.sampling import make_sampler

        draw = make_sampler(**sampling)
        sampler = lambda logits: int(draw(logits[-1]))
    probe = allreduce_seconds(traced, full.config.d_model, allreduce_probe) if allreduce_probe else None
    traced.log.clear()
    tokens, logits, steps, ids = [], [], [], prompt
    for _ in range(max_new_tokens):
        traced.begin_step()
        start = time.perf_counter()
        out = tp_forward(shard, traced, ids, cache, last_only=not keep_logits)
        token = traced.bcast_token(sampler(out) if traced.rank == 0 else None)
        steps.append({"seconds": time.perf_counter() - start, "rows": len(ids)} | traced.step_summary(traced.step))
        if traced.rank == 0 and keep_logits:
            logits.append(out)
        tokens.append(token)
        if token in stop_tokens:
            break
        ids = [token]
    return {"rank": traced.rank, "tp": tp, "tokens": tokens if traced.rank == 0 else None,
            "logits": logits if traced.rank == 0 and keep_logits else None, "steps": steps,
            "weight_bytes": shard.nbytes, "cache_bytes": cache.nbytes, "allreduce_seconds": probe,
            "malloc_kept": kept}


def allreduce_seconds(comm: TracedComm, width: int, repeat: int) -> float:
    """Median seconds of `repeat` all-reduces of one [1, width] float32 row (after a warm-up)."""
    row = np.ones((1, width), np.float32)
    times = []
    for i in range(repeat + 5):
        comm.comm.Barrier()
        start = time.perf_counter()
        comm.allreduce(row, "probe")
        if i >= 5:
            times.append(time.perf_counter() - start)
    return float(np.median(times))


# ----------------------------------------------------------------------------- the numbers

def expected_traffic(config: Config, tp: int, rows: int = 1, logits_rows: int = 1, itemsize: int = 4) -> dict:
    """The collectives of one step of `rows` new tokens, per rank, computed from the shapes:
    2L + 1 all-reduces of [rows, D], a gather of [logits_rows, V/tp], a broadcast of the token."""
    tp = check_degree(config, tp)
    allreduces = 2 * config.n_layers + 1
    payload = allreduces * rows * config.d_model * itemsize
    return {"allreduce": allreduces, "allreduce_bytes": payload, "gather": 1,
            "gather_bytes": logits_rows * config.vocab_size // tp * itemsize, "bcast": 1,
            "ring_bytes_sent": ring_bytes(payload, tp)}


def step_time_model(weight_bytes_per_rank: float, bandwidth: float, allreduce_seconds: float, n_layers: int) -> float:
    """A decode step's seconds when reading weights and waiting for all-reduces are all it does:
    weight bytes per rank / bandwidth + 2 * layers * all-reduce latency."""
    return weight_bytes_per_rank / bandwidth + 2 * n_layers * allreduce_seconds


def decode_summary(results: list, skip: int = 1) -> dict:
    """Median decode-step seconds (the slowest rank's, step by step) and the share of it rank 0..n-1
    spent inside collectives, from generate_rank's results (the prefill step skipped)."""
    steps = list(zip(*(r["steps"] for r in results)))[skip:]
    if not steps:
        raise ValueError("no decode steps to summarise: generate at least 2 tokens")
    seconds = np.array([[s["seconds"] for s in step] for step in steps])  # [steps, ranks]
    comm = np.array([[s["comm_seconds"] for s in step] for step in steps])
    return {"step_seconds": float(np.median(seconds.max(axis=1))),
            "comm_seconds": float(np.median(comm.mean(axis=1))),
            "comm_share": float(np.median(comm.sum(axis=0) / seconds.sum(axis=0)) if len(steps) else 0.0),
            "steps": len(steps)}
