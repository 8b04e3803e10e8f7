"""The roofline, measured: this machine's two roofs, the arithmetic intensity of every op of a
layer (from a `Trace`), and the model's prefill, decode and batched-decode speed.

    attainable FLOP/s = min(peak FLOP/s, bandwidth * intensity),
    intensity = FLOPs / bytes moved (each input read once, the output written once).

An op whose intensity is below the ridge point (peak / bandwidth) waits on memory; above it,
on arithmetic. A decode step multiplies one row by every weight matrix: ~2 FLOPs per 4-byte
float32 weight, 0.5 FLOP/byte, far below the ridge. Prefill and batched decode reuse each
weight for many rows, so their intensity grows with the number of rows.

The peak is the cores' fused multiply-adds (`measure_fma_peak`, numba), else numpy's GEMM, which
is printed beside it either way. The roofs and timers are in `machine.py` (re-exported here). The roofs are the fastest of a few
runs (what the machine can do); the model's speeds are medians (a typical run). A share of a
roof pairs each timed run with a probe run just before it (DECODE_BURST decode steps with the
bandwidth probe, a prefill with the matmul probe), since a shared machine's roofs move from
second to second. Nothing here asserts a speed.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import fast
from ..core import reference
from ..core.model import Model
from ..core.validate import is_int
from .bench_rows import bench_tokens, cache_copy, prefilled_cache  # noqa: F401 - also bench.* (notebook 11, tests)
from .machine import (  # noqa: F401 - the roofs and timers, also used as bench.* by notebook 11
    H100_SXM,
    attainable_gflops,
    bandwidth_probe,
    best_seconds,
    cpu_description,
    gemm_times,
    matmul_probe,
    measure_bandwidth,
    measure_fma_peak,
    measure_matmul,
    median_seconds,
    paired_share,
    ridge_point,
    run_times,
    settle,
)
from .roofline import BATCH_SIZES, decode_trace, predicted_seconds, traced

# The pass costs, the speculative speed-ups and the batch steps are medians of at least this many
# runs: a shared machine's drift moves them most. (Zen 3, December 2026: the free-text speculative
# ratio ranged 0.93-1.03 over 11 bench runs with 9, 0.93-0.99 over 4 with 5, same kernels.)
MOVING_REPEAT = 9
# decode_speed times this many decode steps run back to back as one sample (its time / DECODE_BURST is
# a step's), each sample after its bandwidth probe. A step right after the probe's 268 MB is slower than
# the steps that follow it, as generate runs them: SmolLM2's Q4_1 step 4.33 ms first, 3.78 ms back to
# back; float32's 13.20 and 13.04 (2 vCPUs of an AMD EPYC Zen 5, December 2026, medians of 25). In
# bursts after the probe (one process, two runs): 1 step 4.35-4.44 ms, 4 steps 4.16-4.18, 16 steps
# 4.00, and 3.99 in a loop of steps alone.
DECODE_BURST = 16
# What is timed: "fast" (tinydecoder.fast; a batch decodes from one BatchKVCache) or "reference"
# (reference.forward, and reference.forward_batch: one sequence after another). Traces always use the reference.
PATHS = {"fast": (fast.forward, fast.forward_batch), "reference": (reference.forward, reference.forward_batch)}


def forward_of(path: str):
    """(forward, forward_batch) of the named path."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {sorted(PATHS)}, got {path!r}")
    return PATHS[path]


def prefill_speed(model: Model, prompt_length: int, repeat: int = 3, path: str = "fast", probe=None) -> dict:
    """Prefill of a `prompt_length`-token prompt into a fresh cache (last_only=True, as
    `generate` does). -> {"tokens_per_second", "seconds", "gflops"} (FLOPs from a trace).
    With a `probe` (from `machine.matmul_probe`), each timed prefill runs right after one matmul
    probe, as `decode_speed` pairs steps with the bandwidth probe: "matmul_fraction" is the median
    over the pairs of the prefill's GFLOP/s over the probe's, "matmul_gflops" the probes' median."""
    ids = bench_tokens(model, prompt_length)
    flops = traced(model, [ids], [None]).total_flops()  # untimed; it also warms up
    run = forward_of(path)[0]
    probes = []
    times = run_times(lambda: run(model, ids, model.new_cache(prompt_length), last_only=True), repeat, warmup=0,
                      before=None if probe is None else lambda: probes.append(probe()))
    seconds = float(np.median(times))
    out = {"tokens_per_second": prompt_length / seconds, "seconds": seconds, "gflops": flops / seconds / 1e9}
    if probe is not None:
        out["matmul_fraction"] = paired_share(flops, times, probes)
        out["matmul_gflops"] = float(np.median(probes))
    return out


def decode_speed(model: Model, contexts, steps: int = 5, cache=None, path: str = "fast", probe=None,
                 burst: int | None = None) -> dict:
    """Decode tokens/s of one sequence after each context length in `contexts`: the longest is
    prefilled once, truncated to each length, and every timed step is undone (truncate) so
    each step sees exactly that context (a cache passed in is copied, not changed).

    A timed sample is `burst` steps run back to back (DECODE_BURST unless given), as generate
    runs them; its time over `burst` is one step's. With a `probe` (from `bandwidth_probe`),
    every sample is paired with a bandwidth measurement taken just before it, so that both see
    the machine in the same state (on a shared machine the bandwidth it gives changes from second
    to second). Each pair gives a step's share of the bandwidth: (bytes the step reads: weights +
    K and V of context + 1 positions) / step time / that bandwidth; "roof_fraction" is the median
    over the pairs, "bandwidth_gbps" the median of the probes and "bandwidth_range_gbps" their
    [min, max] (how much the machine's bandwidth moved during the measurement).
    -> {context: {"tokens_per_second", "seconds", ["roof_fraction", "bandwidth_gbps",
    "bandwidth_range_gbps"]}}."""
    contexts = sorted((int(c) for c in contexts), reverse=True)  # longest first: truncate only shortens
    cache = prefilled_cache(model, contexts[0]) if cache is None else cache_copy(cache)
    token = bench_tokens(model, 1, seed=2)
    run = forward_of(path)[0]
    burst = DECODE_BURST if burst is None else burst
    if not is_int(burst) or burst < 1:
        raise ValueError(f"burst (decode steps a timed sample) must be an integer >= 1, got {burst!r}")
    out = {}
    for c in contexts:
        cache.truncate(c)
        probes = []
        before = (lambda: probes.append(probe())) if probe is not None else None

        def steps_back_to_back(c=c):
            for _ in range(burst):
                run(model, token, cache, last_only=True)
                cache.truncate(c)

        times = [t / burst for t in run_times(steps_back_to_back, steps, before=before)]
        seconds = float(np.median(times))
        out[c] = {"tokens_per_second": 1.0 / seconds, "seconds": seconds}
        if probe is not None:
            out[c]["roof_fraction"] = paired_share(decode_step_bytes(model, c), times, probes)
            paired = probes[-steps:]
            out[c]["bandwidth_gbps"] = float(np.median(paired))
            out[c]["bandwidth_range_gbps"] = [float(min(paired)), float(max(paired))]
    return {c: out[c] for c in sorted(out)}


def decode_step_bytes(model: Model, context: int) -> int:
    """Bytes a decode step after `context` cached positions must read at least: every weight
    once, and K and V of context + 1 positions (the new one included) in every layer."""
    return int(model.nbytes + (context + 1) * model.config.kv_bytes_per_token(model.dtype.itemsize))


def batch_decode_speed(model: Model, batch_sizes=BATCH_SIZES, context: int = 128, steps: int = 3,
                       cache=None, bandwidth_gbps=None, peak_gflops=None, path: str = "fast",
                       stacked: bool = True) -> list:
    """One decode step for B sequences at once (forward_batch), each after `context` cached
    positions. Per B: aggregate tokens/s (B / the median step time), and, when the roofs are
    given, the roofline's prediction (from a traced step). The batch sizes take turns, one step
    each per round (after one untimed round), so that a machine whose speed drifts during the
    measurement moves every batch size alike, as `bench_rows.pass_cost` pairs its passes.
    stacked=False (fast path only): the B caches stay separate, so attention runs once per
    sequence per layer instead of once per layer.
    -> [{"batch", "tokens_per_second", "seconds", "predicted_tokens_per_second"?}, ...]."""
    cache = prefilled_cache(model, context) if cache is None else cache_copy(cache)  # the caller's stays as it was
    cache.truncate(context)
    itemsize = model.dtype.itemsize
    run = forward_of(path)[1]
    together = path == "fast" and stacked
    setups = []  # (B, its new tokens, the caches its steps run with)
    for b in batch_sizes:
        caches = [cache_copy(cache) for _ in range(b)]
        setups.append((b, [bench_tokens(model, 1, seed=3 + s) for s in range(b)],
                       fast.BatchKVCache.stack(caches, extra=1) if together else caches))
    if path == "fast":
        settle()  # numpy's BLAS threads may still spin from earlier work; the steps run numba's
    times = {b: [] for b in batch_sizes}
    for i in range(1 + steps):  # round 0 warms up
        for b, batch, timed_caches in setups:
            def undo(timed_caches=timed_caches):
                for c in ([timed_caches] if together else timed_caches):
                    c.truncate(context)

            seconds = run_times(lambda: run(model, batch, timed_caches, last_only=True), 1, warmup=0, after=undo)
            if i:
                times[b] += seconds
    rows = []
    for b, batch, _ in setups:
        seconds = float(np.median(times[b]))
        row = {"batch": int(b), "tokens_per_second": b / seconds, "seconds": seconds}
        if bandwidth_gbps and peak_gflops:
            trace, layers = decode_trace(model, batch, cache)  # layer 0 stands for every layer
            row["predicted_tokens_per_second"] = b / predicted_seconds(trace, itemsize, bandwidth_gbps, peak_gflops,
                                                                       layers=layers)
        rows.append(row)
    return rows


def overhead_twin(model: Model, width: int = 8) -> Model:
    """A random model with `model`'s layer count, layout and norms but every width tiny (`width`
    wide, 1 KV head, vocab 64): a decode step of it costs what the sequence of numpy calls costs,
    with almost no bytes or FLOPs. Its step time estimates the model's per-step overhead."""
    from ..core.toy import random_model

    cfg = model.config
    heads = max(1, cfg.n_heads // cfg.n_kv_heads)  # keep the query heads per KV head (GQA groups)
    twin = dataclasses.replace(cfg, vocab_size=64, d_model=width, n_heads=heads, n_kv_heads=1, head_dim=width,
                               d_ff=2 * width, name=f"{cfg.name}-overhead-twin")
    return random_model(twin, seed=0, dtype=model.dtype)


# ----------------------------------------------------------------------------- the CLI's run

def toy_bench_model() -> Model:
    """The seed toy's shapes (D=8, 2 query heads, 1 KV head, 2 layers, vocab 6), float32
    random weights, and a 4096-row position table so that the 2,048-token decode fits."""
    from ..core.toy import random_model, toy_config

    cfg = dataclasses.replace(toy_config(), max_context=4096, name="toy-4096")
    return random_model(cfg, seed=0, dtype=np.float32)


def run_bench(model: Model, *, lengths=(128, 512), decode_contexts=(128, 512, 2048), batch_sizes=BATCH_SIZES,
              batch_context: int = 128, repeat: int = 3, bandwidth_bytes: int = 2**28, matmul_n: int = 2048,
              path: str = "fast", prompts=None, stop_tokens=()) -> dict:
    """Everything `python -m tinydecoder bench` prints, from one run (dict keys are strings
    so that it serialises to JSON as is). Prefill at `lengths`, decode at `decode_contexts`, a
    pass over 2-8 rows (bench_rows.pass_cost) after each of `lengths`; with `prompts`
    ({"code": ids, "free": ids}, bench_rows.speculative_prompts), speculative decoding's speed-up."""
    from .bench_rows import pass_cost, speculative_speedup, targets_report

    roofs = measure_bandwidth(bandwidth_bytes, repeat=max(3, repeat))
    probe = bandwidth_probe(bandwidth_bytes)
    peak = measure_matmul(matmul_n, repeat=max(2, repeat))
    bw, gflops = roofs["bandwidth_gbps"], peak["matmul_gflops"]
    fma = measure_fma_peak()
    roof = fma or gflops  # the compute roof: the cores' multiply-adds where numba measures them, else numpy's GEMM
    reference.forward(model, bench_tokens(model, 1), last_only=True)  # touch every weight once (memory maps)
    flops_probe = matmul_probe(matmul_n)
    prefill = {n: prefill_speed(model, n, repeat, path, probe=flops_probe) for n in lengths}
    cache = prefilled_cache(model, max(max(lengths), max(decode_contexts), batch_context))
    settle()  # the prefills ran numpy's BLAS on several threads; the decode steps run numba's
    decode = decode_speed(model, decode_contexts, steps=max(9, 3 * repeat), cache=cache, path=path, probe=probe)
    moving = max(MOVING_REPEAT, repeat)
    costs = pass_cost(model, contexts=lengths, repeat=moving, cache=cache) if path == "fast" else None
    settle()
    speculative = speculative_speedup(model, prompts, stop_tokens=stop_tokens, repeat=moving) if prompts else None
    settle()
    batch = batch_decode_speed(model, batch_sizes, batch_context, steps=moving, cache=cache,
                               bandwidth_gbps=bw, peak_gflops=roof, path=path)
    base = batch[0]["tokens_per_second"] if batch and batch[0]["batch"] == 1 else None
    for row in batch:
        row["speedup_vs_batch_1"] = row["tokens_per_second"] / base if base else None
    result = {
        "model": model.config.name,
        "path": path,
        "cpu": cpu_description(),
        "weights_bytes": int(model.nbytes),
        "bandwidth_gbps": bw,
        "copy_bandwidth_gbps": roofs["copy_gbps"],
        "matmul_gflops": gflops,
        "fma_gflops": fma,
        "ridge_flops_per_byte": ridge_point(bw, roof),
        "prefill_tokens_per_second": {str(n): p["tokens_per_second"] for n, p in prefill.items()},
        "prefill_gflops": {str(n): p["gflops"] for n, p in prefill.items()},
        "prefill_matmul_gflops": {str(n): p["matmul_gflops"] for n, p in prefill.items()},
        "prefill_matmul_fraction": {str(n): p["matmul_fraction"] for n, p in prefill.items()},
        "decode_tokens_per_second": {str(c): d["tokens_per_second"] for c, d in decode.items()},
        "decode_bytes_per_token": {str(c): decode_step_bytes(model, c) for c in decode},
        "decode_bandwidth_gbps": {str(c): d["bandwidth_gbps"] for c, d in decode.items()},
        "decode_bandwidth_range_gbps": {str(c): d["bandwidth_range_gbps"] for c, d in decode.items()},
        "decode_roof_fraction": {str(c): d["roof_fraction"] for c, d in decode.items()},
        "batch_context": int(batch_context),
        "batch_decode": batch,
        "pass_cost": costs,
        "speculative_speedup": None if speculative is None else {k: v["speedup"] for k, v in speculative.items()},
        "speculative_runs": speculative,
        "repeat": int(repeat),
        "kernels": kernels_in_use(model),
    }
    result["targets"] = targets_report(result)
    return result


def kernels_in_use(model: Model) -> str:
    """Which kernels the fast path runs its passes with on this model (for the report): skinny's
    sweeps for up to tunables.SWEEPS_UP_TO_ROWS rows, tiles for more (larger batches, prefill), one_query's attention
    of a few new rows, prefill_attention's of more; a block over a few rows of one sequence in one
    call (fused)."""
    from ..fast.compiled import jit, quant_rows

    if jit.available() and isinstance(model.layers[0].w_qkv, quant_rows.QuantMatrix):
        return "numba (fast.compiled: quant_rows, quant_dots, few_queries, prefill_attention; fast.fused_quant)"
    if model.dtype == np.float32 and jit.available() and model.layers[0].w_qkv.flags.f_contiguous:
        return "numba (fast.compiled: few_rows, tiles, few_queries, prefill_attention; fast.fused)"
    return "numpy BLAS" + ("" if jit.available() else " (numba or threadpoolctl not installed)")


def format_report(result: dict) -> str:
    """The bench result as a short table for people."""
    lines = [f"model {result['model']}: {result['weights_bytes'] / 1e6:.3f} MB of weights; {result['cpu']}",
             f"memory bandwidth  {result['bandwidth_gbps']:8.2f} GB/s  (matrix-vector; copy "
             f"{result['copy_bandwidth_gbps']:.2f} GB/s)",
             f"matmul            {result['matmul_gflops']:8.2f} GFLOP/s  (numpy's float32 GEMM)"]
    if result.get("fma_gflops"):
        lines.append(f"FMA peak          {result['fma_gflops']:8.2f} GFLOP/s  (the cores' fused multiply-adds, "
                     f"compiled; numpy's matmul reaches {result['matmul_gflops'] / result['fma_gflops']:.0%} of it)")
    lines.append(f"ridge point       {result['ridge_flops_per_byte']:8.1f} FLOP/byte  (the compute roof: "
                 f"{'the FMA peak' if result.get('fma_gflops') else 'matmul'}, over the bandwidth)")
    lines.append("")
    for n, tps in result["prefill_tokens_per_second"].items():
        peak = f"{result['prefill_gflops'][n] / result['fma_gflops']:.0%} of the FMA peak, " if result.get("fma_gflops") else ""
        lines.append(f"prefill {n:>5} tokens  {tps:10.1f} tokens/s  {result['prefill_gflops'][n]:7.2f} GFLOP/s "
                     f"({peak}{100 * result['prefill_matmul_fraction'][n]:.0f}% of matmul: "
                     f"{result['prefill_matmul_gflops'][n]:.1f} GFLOP/s measured beside it)")
    for c, tps in result["decode_tokens_per_second"].items():
        lines.append(f"decode at {c:>5} ctx  {tps:10.1f} tokens/s  "
                     f"({100 * result['decode_roof_fraction'][c]:.0f}% of the bandwidth roof: "
                     f"{result['decode_bytes_per_token'][c] / 1e6:.1f} MB a step, "
                     f"{result['decode_bandwidth_gbps'][c]:.1f} GB/s measured beside it, "
                     "{:.1f}-{:.1f} across the steps)".format(*result["decode_bandwidth_range_gbps"][c]))
    lines += ["", f"batched decode at context {result['batch_context']}:",
              f"{'batch':>6} {'tokens/s':>12} {'roofline':>12} {'x batch 1':>10}"]
    for row in result["batch_decode"]:
        pred = row.get("predicted_tokens_per_second")
        lines.append(f"{row['batch']:>6} {row['tokens_per_second']:12.1f} "
                     f"{'' if pred is None else f'{pred:12.1f}':>12} {row['speedup_vs_batch_1']:10.2f}")
    if result.get("pass_cost"):
        lines += ["", "one pass over n rows, in decode steps (fast path, all rows' logits):"]
        for c, costs in result["pass_cost"].items():
            lines.append(f"  context {c:>5}: " + "  ".join(f"{n} rows {v:.2f}" for n, v in costs.items()))
    for label, speedup in (result.get("speculative_speedup") or {}).items():
        lines.append(f"speculative decoding (prompt lookup), {label} prompt: {speedup:.2f}x plain generate")
    from .bench_rows import format_targets

    return "\n".join(lines + [f"kernels: {result['kernels']}"] + format_targets(result))
