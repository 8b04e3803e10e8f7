"""The same model with its weights held two ways, measured side by side: float32 matrices ("f32")
against the GGUF file's own Q4_1 blocks read in place ("q4_1"), for `bench --json`'s "weights".

    section = compare_weights({"q4_1": quantised_model, "f32": float32_model})
    section["q4_1"]["decode_tokens_per_second"]["128"]      # and decode_bytes_per_token, _roof_fraction
    section["q4_1"]["pass_cost"]["8"]                         # a pass over 8 rows, in its own decode steps
    weights_targets(section)                                  # q4_1 decode at 128 over f32's; q4_1's passes

A shared machine's speed drifts, so the two never run one after the other as blocks: each round
times every model's decode steps (`bench.decode_speed`: bursts of steps run back to back, each
burst paired with a bandwidth probe) and prefills in turn, and the numbers are medians over the
rounds. A decode step's bytes are the weights as stored (a Q4_1 block: 20 bytes for 32 weights,
against float32's 128; a decode step's bit planes, quant_planes', are as many bytes) and the K and
V it reads, so q4_1's share of the bandwidth roof shows how far its arithmetic (turning 4-bit codes
into products) and its fixed costs a step keep it from streaming them. The first model named also
gets batched decode (`bench.batch_decode_speed`). Nothing here asserts a speed.

Each model's passes over PASS_ROWS rows of one sequence (a speculative check, all rows' logits)
are costed in that model's own decode steps (`bench_rows.pass_cost`), beside their arithmetic
floor (`pass_floor`): a pass multiplies every weight by each of its rows, 2 FLOPs a weight a row,
and cannot run faster than the cores retire fused multiply-adds (`machine.measure_fma_peak`, a
compiled loop of them; numpy's GEMM, bench's "matmul", may reach half of it). In decode steps, the floor grows
as the step shrinks: reading 5 bits a weight instead of 32 shortens a step, not the arithmetic of
a pass over n rows, so the same pass costs more of q4_1's steps than of float32's. Where the floor
is above a target, no kernel computing in float32 on this machine can meet it.
"""
from __future__ import annotations

import numpy as np

from .. import fast
from .bench import batch_decode_speed, decode_speed, decode_step_bytes, prefilled_cache, settle
from .bench_rows import bench_tokens, pass_cost
from .machine import bandwidth_probe, run_times
from .roofline import BATCH_SIZES

# q4_1's decode step at context 128 against float32's, measured in the same run.
TARGET_DECODE_SPEEDUP = 2.5
TARGET_CONTEXT = "128"
# A pass over this many rows (at TARGET_CONTEXT) against q4_1's own decode step: the target for each.
PASS_ROWS = (2, 3, 4, 8)
TARGET_PASS_COST = 1.5
# Prefills timed per model and round (their median is the round's): one, as before, put Q4_1's
# 128-token prefill at 0.85-1.09x float32's across bench runs on the same code.
PREFILL_REPEAT = 3


def compare_weights(models: dict, *, decode_contexts=(128, 512, 2048), lengths=(128, 512), rounds: int = 3,
                    steps: int = 9, batch_sizes=BATCH_SIZES, batch_context: int = 128, bandwidth_bytes: int = 2**28,
                    bandwidth_gbps=None, peak_gflops=None) -> dict:
    """{name: {"weights_bytes", "decode_tokens_per_second", "decode_bytes_per_token",
    "decode_roof_fraction", "prefill_tokens_per_second"} (per context / length, string keys)} for
    each model of `models` ({name: Model}, the same network held differently), the first one with
    "batch_decode" too (rows as bench.batch_decode_speed gives them; the roofs, when given, add
    the roofline's predictions), and "pass_cost" ({rows: decode steps} after batch_context positions)
    with, when peak_gflops (the compute roof: machine.measure_fma_peak where numba measures it) is
    given and batch_context is a decode context, "pass_floor" (the same rows' `pass_floor` at that
    peak). Every round runs each model in turn (module docstring)."""
    if not models:
        raise ValueError("compare_weights needs at least one model: {name: Model}")
    probe = bandwidth_probe(bandwidth_bytes)
    longest = max(max(decode_contexts), batch_context)
    caches = {name: prefilled_cache(m, longest) for name, m in models.items()}
    decode = {name: {c: [] for c in decode_contexts} for name in models}
    prefill = {name: {n: [] for n in lengths} for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            settle()
            for c, d in decode_speed(model, decode_contexts, steps=steps, cache=caches[name], probe=probe).items():
                decode[name][c].append(d)
            for n in lengths:
                prefill[name][n].append(n / _prefill_seconds(model, n))
    out = {}
    for name, model in models.items():
        med = lambda key, c, runs=decode[name]: float(np.median([d[key] for d in runs[c]]))  # noqa: E731
        out[name] = {
            "weights_bytes": int(model.nbytes),
            "decode_tokens_per_second": {str(c): med("tokens_per_second", c) for c in sorted(decode_contexts)},
            "decode_bytes_per_token": {str(c): decode_step_bytes(model, c) for c in sorted(decode_contexts)},
            "decode_roof_fraction": {str(c): med("roof_fraction", c) for c in sorted(decode_contexts)},
            "decode_bandwidth_gbps": {str(c): med("bandwidth_gbps", c) for c in sorted(decode_contexts)},
            "prefill_tokens_per_second": {str(n): float(np.median(prefill[name][n])) for n in sorted(lengths)},
        }
        settle()
        costs = pass_cost(model, rows=PASS_ROWS, contexts=(batch_context,), repeat=steps, cache=caches[name])
        out[name]["pass_cost"] = costs[str(batch_context)]
        if peak_gflops and batch_context in decode_contexts:
            step = 1.0 / out[name]["decode_tokens_per_second"][str(batch_context)]
            out[name]["pass_floor"] = {str(n): pass_floor(model, n, step, peak_gflops) for n in PASS_ROWS}
    first = next(iter(models))
    settle()
    out[first]["batch_context"] = int(batch_context)
    out[first]["batch_decode"] = batch_decode_speed(models[first], batch_sizes, batch_context, steps=steps,
                                                    cache=caches[first], bandwidth_gbps=bandwidth_gbps,
                                                    peak_gflops=peak_gflops)
    return out


def matmul_weights(model) -> int:
    """How many weights a pass multiplies each row by: every layer's four matrices and the head."""
    mats = [w for layer in model.layers for w in (layer.w_qkv, layer.wo, layer.w_gate_up, layer.w_down)]
    return int(sum(np.prod(w.shape) for w in mats + [model.lm_head]))


def pass_floor(model, rows: int, step_seconds: float, peak_gflops: float) -> float:
    """The least a pass over `rows` rows can cost, in decode steps of `step_seconds`: 2 FLOPs per
    weight per row (`matmul_weights`) at `peak_gflops` (the cores' fused multiply-adds:
    machine.measure_fma_peak), the model's other work (attention, norms) and its reads counted as free."""
    return 2 * rows * matmul_weights(model) / (peak_gflops * 1e9) / step_seconds


def _prefill_seconds(model, n: int) -> float:
    """The median of PREFILL_REPEAT timed fast-path prefills of n tokens, each into a fresh cache
    (last_only, as generate runs it)."""
    ids = bench_tokens(model, n)
    return float(np.median(run_times(lambda: fast.forward(model, ids, model.new_cache(n), last_only=True),
                                     PREFILL_REPEAT, warmup=0)))


def weights_targets(section: dict) -> dict:
    """bench_rows.targets_report's form ({what: {"measured", "target", "met"}}) for the weights
    section: q4_1's decode tokens/s at context 128 over f32's from the same run, its roof share in
    the name (needs both); q4_1's passes over PASS_ROWS rows in its own decode steps, each with
    its arithmetic floor in the name where the section has it."""
    if not section or "q4_1" not in section:
        return {}
    q, out = section["q4_1"], {}
    f = section.get("f32")
    if f and TARGET_CONTEXT in q["decode_tokens_per_second"] and TARGET_CONTEXT in f["decode_tokens_per_second"]:
        ratio = q["decode_tokens_per_second"][TARGET_CONTEXT] / f["decode_tokens_per_second"][TARGET_CONTEXT]
        share = q["decode_roof_fraction"][TARGET_CONTEXT]
        what = f"q4_1 decode at context {TARGET_CONTEXT} over f32 (q4_1 at {100 * share:.0f}% of the roof)"
        out[what] = {"measured": ratio, "target": f">= {TARGET_DECODE_SPEEDUP}", "met": ratio >= TARGET_DECODE_SPEEDUP}
    floors = q.get("pass_floor", {})
    for n, cost in q.get("pass_cost", {}).items():
        floor = f", arithmetic floor {floors[n]:.2f}" if n in floors else ""
        out[f"q4_1 pass over {n} rows, in its decode steps{floor}"] = {
            "measured": cost, "target": f"<= {TARGET_PASS_COST}", "met": cost <= TARGET_PASS_COST}
    return out


def format_weights(section: dict) -> list:
    """Lines for `bench`'s table: each weights' decode and prefill speed."""
    if not section:
        return []
    lines = ["", "weights, measured in turn (medians over rounds):"]
    for name, s in section.items():
        decode = "  ".join(f"ctx {c} {tps:.1f} tok/s ({100 * s['decode_roof_fraction'][c]:.0f}% roof, "
                           f"{s['decode_bytes_per_token'][c] / 1e6:.1f} MB)"
                           for c, tps in s["decode_tokens_per_second"].items())
        prefill = "  ".join(f"{n} tokens {tps:.0f} tok/s" for n, tps in s["prefill_tokens_per_second"].items())
        lines += [f"  {name:>5} decode: {decode}", f"  {name:>5} prefill: {prefill}"]
        if s.get("pass_cost"):
            floors = s.get("pass_floor", {})
            lines.append(f"  {name:>5} a pass over n rows, in its decode steps: " + "  ".join(
                f"{n} rows {cost:.2f}" + (f" (floor {floors[n]:.2f})" if n in floors else "")
                for n, cost in s["pass_cost"].items()))
        for row in s.get("batch_decode", []):
            lines.append(f"  {name:>5} batch {row['batch']:>3}: {row['tokens_per_second']:.1f} tok/s")
        if s.get("price"):
            p = s["price"]
            lines.append(f"  {name:>5} price: perplexity of {p['tokens']} tokens fed as decode steps "
                         f"{p['perplexity']:.4f} against float32's {p['reference_perplexity']:.4f} "
                         f"({100 * (p['perplexity'] / p['reference_perplexity'] - 1):+.4f} %), "
                         f"mean KL {p['mean_kl']:.1e} nats a token")
    return lines
