"""What a pass over a few rows costs, and what that buys: `bench`'s `pass_cost` and
`speculative_speedup` (the targets below; notebooks 11, 15 and 20 print them on the learner's machine).

A decode step reads every weight once for one row. A pass over n rows (a speculative check of
n - 1 guesses, or n sequences of a batch) reads them once too, so on a memory-bound machine it
should cost about one step until the arithmetic catches up. `pass_cost` measures that cost in
decode steps: each round times a one-row step, then a pass over each n, right after one another
on the same cache (rolled back after each pass), and reports the median over rounds of
time(n rows) / time(1 row), so that a machine whose speed drifts between rounds (a shared one)
moves both sides of each ratio alike.

`speculative_speedup` times `generate` and `speculative_generate` (prompt lookup, adaptive
draft length) on the same prompt, alternately, and reports the median of plain / speculative
wall-clock time: > 1 is faster. The two prompts of notebook 15: a code-editing request (the
answer copies most of the prompt, so guesses are often right) and free text (guesses rarely are).
"""
from __future__ import annotations

import time

import numpy as np

from .. import fast
from ..core.cache import KVCache
from ..core.model import Model
from ..decoding.generate import generate
from ..decoding.speculative import speculative_generate

PASS_ROWS = (2, 3, 4, 8)
PASS_CONTEXTS = (128, 512)

# Notebook 15's prompts: rename a function in a short piece of code (the answer repeats the code),
# and the opening of a free text.
CODE_SNIPPET = ("def area(width, height):\n    return width * height\n\n"
                "def perimeter(width, height):\n    return 2 * (width + height)\n")
CODE_REQUEST = "Rewrite this Python code with the function area renamed to rect_area:\n\n" + CODE_SNIPPET
FREE_TEXT = "The history of the printing press"
NEW_TOKENS = {"code": 40, "free": 32}


def bench_tokens(model: Model, n: int, seed: int = 0) -> list:
    """n deterministic token ids (what they say does not change the speed)."""
    low = min(17, model.config.vocab_size - 1)  # past SmolLM2's control tokens when there are that many
    return np.random.default_rng(seed).integers(low, model.config.vocab_size, size=n).tolist()


def cache_copy(cache, extra: int = 1):
    """A copy of `cache` with room for `extra` more positions, so that the next append does not
    have to grow (copy) it again; a cache that is not a KVCache is copied with its .copy()."""
    return cache.copy(extra) if isinstance(cache, KVCache) else cache.copy()


def prefilled_cache(model: Model, context: int):
    """A cache holding `context` positions (prefilled in chunks of at most 512 rows)."""
    ids = bench_tokens(model, context, seed=1)
    cache = model.new_cache(context + 1)
    for start in range(0, context, 512):
        fast.forward(model, ids[start:start + 512], cache, last_only=True)
    return cache


def speculative_prompts(tokenizer) -> dict:
    """{"code": chat-template ids of CODE_REQUEST, "free": ids of FREE_TEXT} for SmolLM2's tokenizer."""
    return {"code": tokenizer.encode_chat([{"role": "user", "content": CODE_REQUEST}]),
            "free": tokenizer.encode(FREE_TEXT)}


def pass_cost(model: Model, rows=PASS_ROWS, contexts=PASS_CONTEXTS, repeat: int = 5, cache=None) -> dict:
    """Cost of one fast-path pass over n new rows (all rows' logits, as a speculative check needs)
    in decode steps, after each context length. -> {context: {n: median ratio}} (str keys, for JSON).
    `cache`: a cache holding at least max(contexts) positions (copied, not changed), else one is
    prefilled here."""
    rows = sorted(int(n) for n in rows)
    contexts = sorted((int(c) for c in contexts), reverse=True)  # longest first: truncate only shortens
    cache = prefilled_cache(model, contexts[0]) if cache is None else cache_copy(cache, max(rows))
    ids = bench_tokens(model, max(rows), seed=4)
    out = {}
    for c in contexts:
        cache.truncate(c)
        ratios = {n: [] for n in rows}
        for r in range(repeat + 1):  # the first round warms up and is not kept
            one = _pass_seconds(model, ids[:1], cache, c)
            for n in rows:
                seconds = _pass_seconds(model, ids[:n], cache, c)
                if r:
                    ratios[n].append(seconds / one)
        out[str(c)] = {str(n): float(np.median(v)) for n, v in ratios.items()}
    return {c: out[c] for c in sorted(out, key=int)}


def _pass_seconds(model: Model, ids, cache, context: int) -> float:
    start = time.perf_counter()
    fast.forward(model, ids, cache, last_only=False)
    seconds = time.perf_counter() - start
    cache.truncate(context)
    return seconds


def speculative_speedup(model: Model, prompts: dict, new_tokens=None, stop_tokens=(), repeat: int = 3,
                        draft_tokens: int = 4) -> dict:
    """Wall-clock speed-up of greedy prompt-lookup speculative decoding over `generate`, per prompt.
    -> {label: {"speedup": median of plain / speculative seconds, "tokens_per_pass",
    "same_tokens": bool, "tokens": new tokens}}."""
    new_tokens = NEW_TOKENS if new_tokens is None else new_tokens
    out = {}
    for label, ids in prompts.items():
        n = new_tokens[label]
        ratios, same = [], True
        for _ in range(repeat):
            start = time.perf_counter()
            plain = generate(model, ids, n, stop_tokens=stop_tokens)
            plain_s = time.perf_counter() - start
            start = time.perf_counter()
            spec = speculative_generate(model, ids, n, "prompt-lookup", draft_tokens=draft_tokens,
                                        stop_tokens=stop_tokens)
            ratios.append(plain_s / (time.perf_counter() - start))
            same = same and spec.tokens == plain.tokens
        out[label] = {"speedup": float(np.median(ratios)), "tokens_per_pass": spec.tokens_per_step,
                      "same_tokens": bool(same), "tokens": len(spec.new_tokens)}
    return out


# The speed targets, each beside its measurement in `bench` (a pass cost is at most its target;
# everything else at least).
TARGETS = {"pass_cost": {"2": 1.5, "3": 1.5, "4": 1.5, "8": 2.0},
           "speculative_speedup": {"code": 1.5, "free": 0.95},
           "batch_16_vs_batch_1": 6.0,
           "decode_roof_fraction": 0.7}


def targets_report(result: dict) -> dict:
    """{what: {"measured", "target", "met"}} for every target the result has a measurement of."""
    out = {}
    for c, costs in (result.get("pass_cost") or {}).items():
        for n, cost in costs.items():
            if n in TARGETS["pass_cost"]:
                goal = TARGETS["pass_cost"][n]
                out[f"pass over {n} rows at context {c}, in decode steps"] = {
                    "measured": cost, "target": f"<= {goal}", "met": cost <= goal}
    for label, run in (result.get("speculative_runs") or {}).items():
        goal = TARGETS["speculative_speedup"][label]
        out[f"speculative speed-up, {label} prompt"] = {"measured": run["speedup"], "target": f">= {goal}",
                                                         "met": run["speedup"] >= goal and run["same_tokens"]}
    batch = {row["batch"]: row["speedup_vs_batch_1"] for row in result.get("batch_decode", [])}
    if 16 in batch and batch[16] is not None:
        goal = TARGETS["batch_16_vs_batch_1"]
        out["batch 16 tokens/s over batch 1"] = {"measured": batch[16], "target": f">= {goal}", "met": batch[16] >= goal}
    for c, share in result.get("decode_roof_fraction", {}).items():
        goal = TARGETS["decode_roof_fraction"]
        out[f"decode at context {c}, share of the bandwidth roof"] = {"measured": share, "target": f">= {goal}",
                                                                    "met": share >= goal}
    return out


def format_targets(result: dict) -> list:
    """Lines for `bench`'s table: each measurement beside its target."""
    lines = ["", "targets:"]
    for what, t in result.get("targets", {}).items():
        lines.append(f"  {what:<55} {t['measured']:6.2f}  target {t['target']:<7} {'met' if t['met'] else 'NOT met'}")
    return lines
