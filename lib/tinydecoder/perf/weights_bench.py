"""The same model with its weights held two ways, measured side by side: float32 matrices ("f32")
against the GGUF file's own Q4_1 blocks read in place ("q4_1"), for `bench --json`'s "weights".

    section = compare_weights({"q4_1": quantised_model, "f32": float32_model})
    section["q4_1"]["decode_tokens_per_second"]["128"]      # and decode_bytes_per_token, _roof_fraction
    weights_targets(section)                                  # q4_1 decode at 128 over f32's, the target

A shared machine's speed drifts, so the two never run one after the other as blocks: each round
times every model's decode steps (`bench.decode_speed`, each step paired with a bandwidth probe)
and prefills in turn, and the numbers are medians over the rounds. A decode step's bytes are the
weights as stored (a Q4_1 block: 20 bytes for 32 weights, against float32's 128) and the K and
V it reads, so q4_1's share of the bandwidth roof shows how far its arithmetic (decoding the
blocks) keeps it from streaming them. The first model named also gets batched decode
(`bench.batch_decode_speed`). Nothing here asserts a speed.
"""
from __future__ import annotations

import numpy as np

from .. import fast
from .bench import batch_decode_speed, decode_speed, decode_step_bytes, prefilled_cache, settle
from .bench_rows import bench_tokens
from .machine import bandwidth_probe, run_times
from .roofline import BATCH_SIZES

# q4_1's decode step at context 128 against float32's, measured in the same run.
TARGET_DECODE_SPEEDUP = 2.5
TARGET_CONTEXT = "128"


def compare_weights(models: dict, *, decode_contexts=(128, 512, 2048), lengths=(128, 512), rounds: int = 3,
                    steps: int = 9, batch_sizes=BATCH_SIZES, batch_context: int = 128, bandwidth_bytes: int = 2**28,
                    bandwidth_gbps=None, peak_gflops=None) -> dict:
    """{name: {"weights_bytes", "decode_tokens_per_second", "decode_bytes_per_token",
    "decode_roof_fraction", "prefill_tokens_per_second"} (per context / length, string keys)} for
    each model of `models` ({name: Model}, the same network held differently), the first one with
    "batch_decode" too (rows as bench.batch_decode_speed gives them; the roofs, when given, add
    the roofline's predictions). Every round runs each model in turn (module docstring)."""
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
    first = next(iter(models))
    settle()
    out[first]["batch_context"] = int(batch_context)
    out[first]["batch_decode"] = batch_decode_speed(models[first], batch_sizes, batch_context, steps=steps,
                                                    cache=caches[first], bandwidth_gbps=bandwidth_gbps,
                                                    peak_gflops=peak_gflops)
    return out


def _prefill_seconds(model, n: int) -> float:
    """One timed fast-path prefill of n tokens into a fresh cache (last_only, as generate runs it)."""
    ids = bench_tokens(model, n)
    return run_times(lambda: fast.forward(model, ids, model.new_cache(n), last_only=True), 1, warmup=0)[0]


def weights_targets(section: dict) -> dict:
    """bench_rows.targets_report's form ({what: {"measured", "target", "met"}}) for the weights
    section: q4_1's decode tokens/s at context 128 over f32's from the same run, its roof share in
    the name. Empty without both."""
    if not section or "q4_1" not in section or "f32" not in section:
        return {}
    q, f = section["q4_1"], section["f32"]
    if TARGET_CONTEXT not in q["decode_tokens_per_second"] or TARGET_CONTEXT not in f["decode_tokens_per_second"]:
        return {}
    ratio = q["decode_tokens_per_second"][TARGET_CONTEXT] / f["decode_tokens_per_second"][TARGET_CONTEXT]
    share = q["decode_roof_fraction"][TARGET_CONTEXT]
    what = f"q4_1 decode at context {TARGET_CONTEXT} over f32 (q4_1 at {100 * share:.0f}% of the roof)"
    return {what: {"measured": ratio, "target": f">= {TARGET_DECODE_SPEEDUP}", "met": ratio >= TARGET_DECODE_SPEEDUP}}


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
        for row in s.get("batch_decode", []):
            lines.append(f"  {name:>5} batch {row['batch']:>3}: {row['tokens_per_second']:.1f} tok/s")
    return lines
