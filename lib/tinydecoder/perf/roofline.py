"""The roofline model of a pass: the FLOPs and bytes of every op of a traced pass, their
arithmetic intensity, the time the roofline predicts, and the data of notebook 11's plot.

    attainable FLOP/s = min(peak matmul FLOP/s, bandwidth * intensity),
    intensity = FLOPs / bytes moved (each input read once, the output written once).

An op whose intensity is below the ridge point (peak / bandwidth) waits on memory; above it, on
arithmetic. `bench` measures the real speeds beside these predictions.
"""
from __future__ import annotations

import numpy as np

from ..core import reference
from ..core.cache import KVCache
from ..core.model import Model
from ..core.trace import Trace
from .bench_rows import bench_tokens, cache_copy
from .machine import attainable_gflops, ridge_point

BATCH_SIZES = (1, 2, 4, 8, 16, 32)


def op_cost(record, itemsize: int) -> tuple:
    """(FLOPs, bytes moved) of one traced op, with `itemsize` bytes per number.

    matmul x[M, K] @ w[K, N]: 2MKN FLOPs; bytes (MK + KN + MN) * itemsize.
    attention q[S,Hq,d], K, V [T,Hkv,d] -> [S, Hq*d]: 4*Hq*S*T*d FLOPs as the trace counts them
    (the whole S x T rectangle, the masked part of a prefill included); bytes of q, K, V and
    the output (the scores stay in cache: the ideal, fused kernel's traffic).
    embed: N rows read and written. Other elementwise ops (norms, RoPE, SwiGLU): 0 FLOPs in the
    trace; bytes of their inputs and output."""
    size = lambda shape: int(np.prod(shape, dtype=np.int64))
    if record.op == "embed":
        moved = 2 * size(record.output)
    else:
        moved = sum(size(s) for s in record.inputs) + size(record.output)
    return int(record.flops), int(moved) * int(itemsize)


def layer_intensities(trace: Trace, itemsize: int, layer=0) -> dict:
    """Per op of one layer (and the LM head, which has layer None), summed over the sequences
    of a batch: {op: {"flops", "bytes", "intensity"}}, in execution order, ops with FLOPs only."""
    out = {}
    for r in trace.ops:
        if r.flops == 0 or not (r.layer == layer or r.op == "lm_head"):
            continue
        flops, moved = op_cost(r, itemsize)
        entry = out.setdefault(r.op, {"flops": 0, "bytes": 0})
        entry["flops"] += flops
        entry["bytes"] += moved
    for entry in out.values():
        entry["intensity"] = entry["flops"] / entry["bytes"]
    return out


def predicted_seconds(trace: Trace, itemsize: int, bandwidth_gbps: float, peak_gflops: float,
                      layers: int | None = None) -> float:
    """The roofline's time for a traced pass: every op takes max(bytes / bandwidth, FLOPs / peak).
    layers: the trace's layer 0 stands for that many equal layers (a trace of a model cut after a
    few layers, see `decode_trace`); its other layers are left out."""
    total = 0.0
    for r in trace.ops:
        if layers is not None and r.layer not in (None, 0):
            continue
        flops, moved = op_cost(r, itemsize)
        share = max(moved / (bandwidth_gbps * 1e9), flops / (peak_gflops * 1e9))
        total += share * (layers if layers is not None and r.layer == 0 else 1)
    return total


def decode_trace(model: Model, batch, cache, layer: int = 0):
    """A traced decode step of `batch` (one new token per sequence), each sequence after the
    positions of `cache` (a KVCache; not changed), on `model` cut after layer + 2 blocks: every
    block of a decode step does the same work, so layer `layer` stands for all of them at a
    fraction of the cost (the last block of a pass may carry fewer rows: `layer` is never the
    last one). -> (trace, model's number of layers)."""
    total = model.config.n_layers
    n = min(layer + 2, total)
    if n < total and isinstance(cache, KVCache):
        from ..decoding.drafts import early_exit_model

        model, full = early_exit_model(model, n), cache
        cache = model.new_cache(len(full) + 1)  # the first n layers' K and V, copied
        for l in range(n):
            cache.append(l, *(a[:len(full)] for a in (full.k[l], full.v[l])))
    return traced(model, batch, [cache] * len(batch)), total


def traced(model: Model, batch, caches, last_only=True) -> Trace:
    """Run the reference.forward_batch with a trace (attention weights not kept) on copies of the caches,
    so the caches passed in are left as they were."""
    trace = Trace(keep_weights=False)
    copies = [None if c is None else cache_copy(c, len(ids)) for c, ids in zip(caches, batch)]
    reference.forward_batch(model, batch, copies, last_only=last_only, trace=trace)
    return trace




def decode_intensities_by_batch(model: Model, cache, batch_sizes=BATCH_SIZES, layer: int = 0,
                                context=None) -> dict:
    """For each batch size B: layer_intensities of one traced decode step of B sequences, each
    after the first `context` positions of `cache` (default: all; the cache is not changed).
    -> {B: {op: {...}}}."""
    if context is not None:
        cache = cache_copy(cache)
        cache.truncate(context)
    itemsize = model.dtype.itemsize
    token = bench_tokens(model, 1, seed=2)
    return {int(b): layer_intensities(decode_trace(model, [token] * b, cache, layer)[0], itemsize, layer)
            for b in batch_sizes}


def roofline_view(intensities: dict, bandwidth_gbps: float, peak_gflops: float) -> dict:
    """Per op (from layer_intensities): its intensity, the roofline's attainable GFLOP/s there,
    and which roof bounds it.  -> {"ops", "intensity", "attainable", "bound", "ridge"}."""
    ops = list(intensities)
    intensity = np.array([intensities[o]["intensity"] for o in ops])  # [n_ops] FLOP/byte
    ridge = ridge_point(bandwidth_gbps, peak_gflops)
    return {"ops": ops, "intensity": intensity,
            "attainable": attainable_gflops(intensity, bandwidth_gbps, peak_gflops),
            "bound": ["memory" if i < ridge else "compute" for i in intensity], "ridge": ridge,
            "bandwidth_gbps": bandwidth_gbps, "peak_gflops": peak_gflops}
